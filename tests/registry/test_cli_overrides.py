"""`pdm sweep NAME key=value ...`: overrides validated like the sweep file, every problem named by
its override and reported at once, and filters that select trials without changing their hashes."""

from __future__ import annotations

import json

import pytest

from pdmask.errors import ValidationFailed
from pdmask.registry import load_registry
from pdmask.registry.cli_overrides import (
    COMMAND_LINE,
    OVERRIDES_TAG,
    canonical,
    overrides_tag,
    parse_overrides,
    with_overrides,
)

from .conftest import ROOT, pdm


@pytest.fixture(scope="module")
def reg():
    return load_registry(ROOT)


@pytest.fixture(scope="module")
def main_figure(reg) -> dict:
    return {t.trial_hash: t for t in reg.expand("main-figure")}


def _problems(reg, name: str, *words: str) -> list[str]:
    with pytest.raises(ValidationFailed) as err:
        with_overrides(reg, name, words).expand(name)
    return [str(p) for p in err.value.problems]


def test_the_acceptance_example_keeps_bf16_and_adds_seed_3_with_unchanged_hashes(reg, main_figure):
    trials = with_overrides(reg, "main-figure", ["precision=bf16", "seed=[0,1,2,3]"]).expand(
        "main-figure"
    )
    assert {t.precision for t in trials} == {"bf16"}
    assert sorted({t.seed for t in trials}) == [0, 1, 2, 3]
    # every bf16 trial of the file's own seeds is the very same trial: only seed 3 is new
    old = [t for t in trials if t.seed < 3]
    assert {t.trial_hash for t in old} == {
        h for h, t in main_figure.items() if t.precision == "bf16"
    }
    new = [t for t in trials if t.trial_hash not in main_figure]
    assert new and all(t.seed == 3 for t in new)
    assert len(new) == len(old) // 3


def test_filters_select_and_never_change_a_hash(reg, main_figure):
    cases = [
        ["method=pdm-agg"],
        ["method=[pdm-agg,pdm-uni]", "model=qwen3-8b-base"],
        ["delta=0.15", "seed=1"],
        ["sim.lr=0"],
    ]
    for words in cases:
        trials = with_overrides(reg, "main-figure", words).expand("main-figure")
        assert trials, words
        assert {t.trial_hash for t in trials} <= set(main_figure), words
    agg = with_overrides(reg, "main-figure", ["method=pdm-agg", "seed=1"]).expand("main-figure")
    assert {(t.method, t.seed) for t in agg} == {("pdm-agg", 1)} and len(agg) == 4


def test_a_setting_changes_what_is_trained_and_so_the_hash(reg, main_figure):
    trials = with_overrides(reg, "smoke", ["profile=default"]).expand("smoke")
    plain = reg.expand("smoke")
    assert [t.profile for t in trials] == ["default"] * len(plain)
    assert not {t.trial_hash for t in trials} & {t.trial_hash for t in plain}
    steps = with_overrides(reg, "smoke", ["steps=3"]).expand("smoke")
    assert {t.steps for t in steps} == {3}


def test_every_bad_override_is_named_all_at_once(reg):
    problems = _problems(
        reg,
        "main-figure",
        "precision=fp16",
        "seed=[x]",
        "stepz=3",
        "noequals",
        "steps=0",
        "profile=fulll",
        "method=[pdm-agg,foo]",
        "name=other",
        "delta=[0.15",
    )
    assert all(p.startswith(f"{COMMAND_LINE}: ") for p in problems), problems
    text = "\n".join(problems)
    expected = [
        "precision=fp16: 'fp16' is not on sweep main-figure's precision axis; did you mean "
        "'bf16'? known: bf16, fp8-e2e, fp8-rollout",
        "seed=[x]: Input should be a valid integer",
        "stepz=3: unknown field 'stepz'; did you mean 'steps'?",
        "noequals: an override is key=value",
        "steps=0: Input should be greater than or equal to 1",  # the file's own message
        "profile=fulll: unknown profile 'fulll'",
        "method=[pdm-agg,foo]: 'foo' is not on sweep main-figure's method axis",
        "name=other: a sweep's name is its file's",
        "delta=[0.15: not a YAML value",
    ]
    for words in expected:
        assert words in text, (words, text)
    assert len(problems) == len(expected), problems  # each once


def test_the_same_message_as_the_file_for_the_same_value(project):
    (project / "sweeps" / "bad.yaml").write_text(
        (ROOT / "sweeps" / "smoke.yaml")
        .read_text()
        .replace("name: smoke", "name: bad")
        .replace("seeds: 1", "seeds: [1, 1]")
        + "steps: 0\n"
    )
    reg = load_registry(project)
    with pytest.raises(ValidationFailed) as err:
        reg.expand("bad")
    from_file = {p.message for p in err.value.problems}
    words = ["steps=0", "seed=[1,1]"]
    from_line = _problems(load_registry(ROOT), "smoke", *words)
    assert {p.split(": ", 2)[2] for p in from_line} == from_file


def test_a_seed_filter_keeps_a_seed_of_the_sweep_only(reg):
    problems = _problems(reg, "main-figure", "seed=5")
    assert problems == [
        f"{COMMAND_LINE}: seed=5: 5 is not on sweep main-figure's seeds; known: 0, 1, 2"
    ]
    empty = _problems(reg, "main-figure", "method=grpo-clip-higher", "sim.lr=0")
    assert "together they keep no cell of the grid" in empty[0]


def test_canonical_text_is_the_same_however_it_was_typed():
    a, _ = parse_overrides(["seed=[0, 1,2]", "precision=bf16", "delta=0.150"])
    b, _ = parse_overrides(["delta=.15", "precision='bf16'", "seed=[0,1,2]"])
    assert canonical(a) == canonical(b) == "delta=0.15 precision=bf16 seed=[0, 1, 2]"
    assert overrides_tag(["precision=bf16"]) == {OVERRIDES_TAG: "precision=bf16"}
    assert overrides_tag([]) == {}


def test_the_dry_run_shows_the_overrides_and_only_the_selected_trials(project):
    out = pdm(
        "sweep",
        "main-figure",
        "precision=bf16",
        "seed=[0,1,2,3]",
        "--dry-run",
        "--json",
        project=project,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    plan = json.loads(out.stdout)
    assert plan["overrides"] == "precision=bf16 seed=[0, 1, 2, 3]"
    assert {row["precision"] for row in plan["trials"]} == {"bf16"}
    assert len(plan["trials"]) == 48 and plan["reused"] == {}
    bad = pdm("sweep", "main-figure", "precision=fp16", "seed=[x]", project=project)
    assert bad.returncode == 2
    assert "precision=fp16" in bad.stderr + bad.stdout and "seed=[x]" in bad.stderr + bad.stdout


def test_validate_takes_the_same_overrides(project):
    # (one call: `pdm validate` runs every recipe's code on synthetic batches, seconds each)
    bad = pdm("validate", "smoke", "precision=fp16", project=project)
    assert bad.returncode == 2
    assert "command line: precision=fp16: 'fp16' is not on sweep smoke's precision axis" in (
        bad.stdout + bad.stderr
    )
    alone = pdm("validate", "seed=1", project=project)
    assert alone.returncode == 2 and "name at least one" in alone.stdout + alone.stderr
