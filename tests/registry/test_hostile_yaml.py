"""Hostile or accidental YAML in a project folder costs a problem naming the file, never the
process: an alias bomb, nesting deeper than Python's recursion, a file of many megabytes. Every
command reads every sweep file, so these used to take down commands that never used the file
(MemoryError, RecursionError, a minute per command)."""

from __future__ import annotations

import time
import tracemalloc

from pdmask.registry import load_registry
from pdmask.registry.yaml_source import MAX_DEPTH, MAX_NODES, MAX_YAML_BYTES, parse_yaml

from .conftest import pdm

# Ten x's, then nine levels of ten aliases each: 10^10 strings once expanded, 600 bytes on disk.
ALIAS_BOMB = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 10)
)
DEEP = "grid: " + "[" * 20_000 + "]" * 20_000 + "\n"


def _problem(project, name):
    registry = load_registry(project)
    mine = [p for p in registry.sweep_problems if p.file.endswith(f"{name}.yaml")]
    assert len(mine) == 1, mine
    return registry, mine[0]


def test_an_alias_bomb_is_one_problem_in_linear_time_and_memory(project):
    (project / "sweeps" / "bomb.yaml").write_text(ALIAS_BOMB)
    tracemalloc.start()
    started = time.perf_counter()
    registry, problem = _problem(project, "bomb")
    seconds = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert "alias" in problem.message and f"{MAX_NODES:,}" in problem.message
    sizes = [11]  # a0: a list of ten strings; a_i: a list of ten a_(i-1)
    for _ in range(9):
        sizes.append(1 + 10 * sizes[-1])
    assert f"expands to {1 + 10 + sum(sizes):,} values" in problem.message  # root, keys, lists
    # The generous bound is the check's point: expanding would need ~10^10 objects (tens of GB).
    assert peak < 200 << 20, peak
    assert seconds < 60, seconds
    assert "smoke" in registry.sweeps  # the other files are untouched


def test_nesting_beyond_the_limit_is_one_problem(project):
    (project / "sweeps" / "deep.yaml").write_text(DEEP)
    (project / "sweeps" / "deep2.yaml").write_text("grid: " + "[" * 100 + "]" * 100 + "\n")
    _, problem = _problem(project, "deep")
    assert f"the limit is {MAX_DEPTH}" in problem.message
    _, problem = _problem(project, "deep2")
    assert "nested 101 levels deep" in problem.message and problem.line == 1


def test_a_file_beyond_the_size_limit_is_refused_unread(project):
    big = project / "sweeps" / "big.yaml"
    big.write_text("description: x\n" + "# padding\n" * (MAX_YAML_BYTES // 10 + 1))
    _, problem = _problem(project, "big")
    assert f"{MAX_YAML_BYTES:,}" in problem.message and problem.field == "(file)"
    source, problems = parse_yaml("a: 1\n" * (MAX_YAML_BYTES // 5 + 1), big)
    assert source is None and "limit" in problems[0].message


def test_ordinary_aliases_still_work_and_another_sweep_still_plans(project):
    (project / "sweeps" / "bomb.yaml").write_text(ALIAS_BOMB)
    (project / "sweeps" / "deep.yaml").write_text(DEEP)
    plan = pdm("sweep", "main-figure", "--dry-run", project=project)  # main-figure uses anchors
    assert plan.returncode == 0, plan.stdout + plan.stderr
    refused = pdm("sweep", "bomb", "--dry-run", project=project)
    assert refused.returncode == 2 and "bomb.yaml" in refused.stdout + refused.stderr


def test_a_dangling_link_in_sweeps_is_a_problem_not_a_missing_sweep(project):
    (project / "sweeps" / "gone.yaml").symlink_to(project / "elsewhere" / "gone.yaml")
    registry, problem = _problem(project, "gone")
    assert "missing" in problem.message and "elsewhere" in problem.message
    assert "smoke" in registry.sweeps
