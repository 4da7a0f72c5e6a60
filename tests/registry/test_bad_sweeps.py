"""Sweep files that used to crash or be silently accepted: each is refused with file, field and
line, all in one report, exit 2, nothing written."""

from __future__ import annotations

import json
import tracemalloc

import pytest

from pdmask.errors import ValidationFailed
from pdmask.registry import load_registry
from pdmask.registry.sweeps import DEFAULT_MAX_TRIALS

from .conftest import pdm

HEAD = "description: x\n"
CELL = "model: [qwen3-4b-base], precision: [bf16]"

# name -> (file body after `name:`, [(line, field, words in the message)]). Lines count from 1
# with `name:` on line 1.
BAD = {
    "nan-delta": (
        f"{HEAD}grid: {{method: [pdm-agg], {CELL}, delta: [.nan, .inf, -.inf]}}\n",
        [(3, "grid.delta.0", "not a finite"), (3, "grid.delta.2", "not a finite")],
    ),
    "nan-param": (
        f"{HEAD}grid: {{method: [grpo-clip-higher], {CELL}, params.eps_high: [.nan]}}\n",
        [(3, "grid.params.eps_high.0", "not a finite")],
    ),
    "empty-method": (
        f"{HEAD}grid: {{method: [], {CELL}}}\n",
        [(3, "grid.method", "empty list")],
    ),
    "dict-model": (
        f"{HEAD}grid: {{method: [pdm-agg], model: [{{a: b}}], precision: [bf16]}}\n",
        [(3, "grid.model.0", "single value")],
    ),
    "zero-seeds": (
        f"{HEAD}seeds: 0\ngrid: {{method: [pdm-agg], {CELL}}}\n",
        [(3, "seeds", "at least 1")],
    ),
    "negative-seeds": (
        f"{HEAD}seeds: -2\ngrid: {{method: [pdm-agg], {CELL}}}\n",
        [(3, "seeds", "at least 1")],
    ),
    "seed-list": (
        f"{HEAD}seeds: [1, -1, 1]\ngrid: {{method: [pdm-agg], {CELL}}}\n",
        [(3, "seeds", ">= 0")],
    ),
    "seed-beyond-32-bits": (  # passed validation and the dry run, failed at training (x3)
        f"{HEAD}seeds: [1, 4294967296, 18446744073709551616]\ngrid: {{method: [pdm-agg], {CELL}}}\n",
        [(3, "seeds", "at most 4294967295")],
    ),
    "seed-count-beyond-32-bits": (
        f"{HEAD}seeds: 4294967297\nmax_trials: 1\ngrid: {{method: [pdm-agg], {CELL}}}\n",
        [(3, "seeds", "beyond 4294967295")],
    ),
    "duplicate-axis-value": (  # collapsed silently into one trial
        f"{HEAD}grid: {{method: [pdm-agg, dppo-topk-kl, pdm-agg], {CELL}, delta: [0.15, 0.150]}}\n",
        [(3, "grid.method.2", "repeats 'pdm-agg' (item 0)"), (3, "grid.delta.1", "repeats 0.15")],
    ),
    "zip-bad-value": (  # a refused value used to shift the zip's pairs (IndexError)
        f"{HEAD}grid: {{product: [{{zip: {{method: [pdm-agg, pdm-agg], delta: [0.15, .nan]}}}},"
        f" {{{CELL}}}]}}\n",
        [(3, "grid.product.0.zip.delta.1", "not a finite")],
    ),
    "duplicate-key": (
        f"{HEAD}seeds: 1\nseeds: 3\ngrid: {{method: [pdm-agg], {CELL}}}\n",
        [(4, "seeds", "duplicate key")],
    ),
    "nested-duplicate": (
        f"{HEAD}grid:\n  method: [pdm-agg]\n  model: [qwen3-4b-base]\n  precision: [bf16]\n"
        "  method: [dppo-topk-kl]\n",
        [(7, "grid.method", "duplicate key")],
    ),
    "override-nothing": (
        f"{HEAD}grid: {{method: [pdm-agg], {CELL}}}\n"
        "overrides:\n  - where: {method: pdm-nope}\n    set: {delta: 0.1}\n",
        [(5, "overrides.0.where", "matches no cell")],
    ),
    "override-no-axis": (
        f"{HEAD}grid: {{method: [pdm-agg], {CELL}}}\n"
        "overrides:\n  - where: {method: pdm-agg}\n    set: {deltaa: 0.1}\n",
        [(6, "overrides.0.set", "not an axis")],
    ),
    "override-nan": (
        f"{HEAD}grid: {{method: [pdm-agg], {CELL}}}\n"
        "overrides:\n  - where: {method: pdm-agg}\n    set: {delta: .nan}\n",
        [(6, "overrides.0.set", "not a finite")],
    ),
    "mu-recompute-on-sim": (
        f"{HEAD}backend: sim\ngrid: {{method: [pdm-agg], {CELL}, mu_source: [recompute]}}\n",
        [(4, "grid.mu_source.0", "cannot supply")],
    ),
    "kernel-recipe-on-verl": (  # verl cannot hand a recipe the lm head's input: refused, why said
        f"{HEAD}backend: verl\ngrid: {{method: [pdm-gram], {CELL}}}\n",
        [
            (
                4,
                "grid.method.0",
                "cannot supply ['output_kernel'] needed by 'pdm-gram' (output_kernel: ",
            )
        ],
    ),
    "unknown-cell-backend": (
        f"{HEAD}grid: {{method: [pdm-agg], {CELL}, backend: [tpu]}}\n",
        [(3, "grid.backend.0", "unknown backend 'tpu'")],
    ),
    "unknown-backend": (
        f"{HEAD}backend: tpu\ngrid: {{method: [pdm-agg], {CELL}}}\n",
        [(3, "backend", "unknown backend 'tpu'")],
    ),
    "search-inf": (
        f"{HEAD}search:\n  metric: m\n  budget: 2\n  space: {{delta: {{low: 0.01, high: .inf}}}}\n"
        "  base: {method: pdm-agg, model: qwen3-4b-base, precision: bf16}\n",
        [(6, "search.space.delta", "finite")],
    ),
}


@pytest.fixture
def bad_project(project):
    for name, (body, _) in BAD.items():
        (project / "sweeps" / f"{name}.yaml").write_text(f"name: {name}\n{body}")
    (project / "sweeps" / "latin1.yaml").write_bytes(
        b"name: latin1\ndescription: caf\xe9\ngrid: {method: [pdm-agg]}\n"
    )
    (project / "sweeps" / "smoke.yml").write_text((project / "sweeps" / "smoke.yaml").read_text())
    return project


def _has(err: str, file: str, line: int | None, field: str, words: str) -> bool:
    where = f"{file}:{line}: " if line else f"{file}: "
    return any(where in ln and f" {field}: " in ln and words in ln for ln in err.splitlines())


def test_every_bad_sweep_is_refused_in_one_report(bad_project):
    out = pdm("validate", project=bad_project)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    for name, (_, expected) in BAD.items():
        for line, field, words in expected:
            assert _has(out.stderr, f"{name}.yaml", line, field, words), (name, out.stderr)
    # the file is named (not a UnicodeDecodeError), with the line of the bad byte
    assert _has(out.stderr, "latin1.yaml", 2, "(file)", "not UTF-8")
    # `.yml` next to `.yaml`: both named, neither silently wins
    for suffix in ("yaml", "yml"):
        assert _has(out.stderr, f"smoke.{suffix}", None, "(file)", "declared twice")
    assert not (bad_project / ".pdm").exists()


@pytest.mark.parametrize("name", ["nan-delta", "zero-seeds", "duplicate-key", "dict-model"])
def test_bad_sweep_never_launches(bad_project, name):
    out = pdm("sweep", name, project=bad_project)
    assert out.returncode == 2 and "nothing was launched" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    assert not (bad_project / ".pdm").exists()


def test_a_schema_error_does_not_hide_the_files_other_problems(project):
    (project / "sweeps" / "mixed.yaml").write_text(
        "name: mixed\n"
        "description: x\n"
        "retries: -1\n"  # schema error
        "seeds: 1\n"
        "grid: {method: [pdm-nope], model: [qwen3-70b], precision: [bf16], delta: [.nan]}\n"
        "overrides:\n"
        "  - {where: {method: pdm-agg}, set: {delta: 0.2}}\n"  # matches no cell
        "  - {where: {method: pdm-agg}, set: {nope: 1}}\n"  # schema error in one item
    )
    with pytest.raises(ValidationFailed) as info:
        load_registry(project).expand("mixed")
    found = {(p.line, p.field) for p in info.value.problems}
    assert {
        (3, "retries"),
        (5, "grid.method.0"),
        (5, "grid.model.0"),
        (5, "grid.delta.0"),
        (7, "overrides.0.where"),
        (8, "overrides.1.set"),
    } <= found, found


def test_a_huge_grid_is_refused_before_it_is_expanded_unless_confirmed(project):
    deltas = ", ".join(f"{0.01 + i / 1000:.3f}" for i in range(100))
    (project / "sweeps" / "huge.yaml").write_text(
        "name: huge\ndescription: x\nseeds: 400\n"
        "grid:\n  method: [pdm-agg, pdm-uni, dppo-topk-kl]\n  model: [qwen3-4b-base]\n"
        f"  precision: [bf16]\n  delta: [{deltas}]\n"
    )
    reg = load_registry(project)
    assert reg.trial_count("huge") == 3 * 100 * 400
    tracemalloc.start()
    with pytest.raises(ValidationFailed) as info:
        reg.expand("huge")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 2**20  # counted, not expanded: 120,000 trials would take hundreds of MB
    (problem,) = info.value.problems
    assert problem.field == "grid" and problem.line == 4
    assert "120,000 trials exceed the cap" in problem.message and "--max-trials" in problem.message
    assert f"{DEFAULT_MAX_TRIALS:,}" in problem.message
    out = pdm("sweep", "huge", "--dry-run", project=project)
    assert out.returncode == 2 and "--max-trials 120000" in out.stderr, out.stderr

    # 1,200 trials: over the default cap, confirmed by the flag or by the file.
    body = (
        "description: x\nseeds: 400\n"
        "grid: {method: [pdm-agg, pdm-uni, dppo-topk-kl], model: [qwen3-4b-base], "
        "precision: [bf16]}\n"
    )
    (project / "sweeps" / "big.yaml").write_text(f"name: big\n{body}")
    assert pdm("sweep", "big", "--dry-run", project=project).returncode == 2
    out = pdm("sweep", "big", "--dry-run", "--json", "--max-trials", "1200", project=project)
    assert out.returncode == 0, out.stderr
    assert len(json.loads(out.stdout)["trials"]) == 1200
    # printed, a plan that long is one line per setting, not 1,200 lines
    out = pdm("sweep", "big", "--dry-run", "--max-trials", "1200", project=project)
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stdout.splitlines() if ln.split()[-1:] == ["todo"]]
    assert len(lines) == 3 and all(" 400 " in ln for ln in lines), out.stdout
    (project / "sweeps" / "big.yaml").write_text(f"name: big\nmax_trials: 1200\n{body}")
    assert len(load_registry(project).expand("big")) == 1200
