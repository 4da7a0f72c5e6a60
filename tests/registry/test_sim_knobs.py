"""Embedded-backend knobs as sweep axes (`sim.<knob>`): identity, tags, validation, other backends."""

from __future__ import annotations

from pdmask.registry import Trial, load_registry

from .conftest import pdm

KNOB_SWEEP = """name: knobs
description: a control cell and a task regime
seeds: 2
grid:
  union:
    - {method: [dppo-topk-kl], model: [qwen3-4b-base], precision: [bf16], delta: [0.15]}
    - {method: [dppo-topk-kl], model: [qwen3-4b-base], precision: [bf16], delta: [0.15],
       sim.lr: [0]}
    - {method: [dppo-topk-kl], model: [qwen3-4b-base], precision: [bf16], delta: [0.15],
       sim.task: [llm-like]}
"""

BAD_KNOBS = """name: badknobs
description: wrong knobs
seeds: 1
grid:
  method: [dppo-topk-kl]
  model: [qwen3-4b-base]
  precision: [bf16]
  sim.lr: [-1]
  sim.task: [gpt-like]
  sim.colour: [red]
"""


def test_knob_cells_are_distinct_trials_tagged_with_their_knobs(project):
    (project / "sweeps" / "knobs.yaml").write_text(KNOB_SWEEP)
    trials = load_registry(project).expand("knobs")
    assert len(trials) == 6 and len({t.trial_hash for t in trials}) == 6
    knobs = sorted((t.seed, tuple(sorted(t.sim.items()))) for t in trials)
    assert knobs == sorted(
        (seed, k) for seed in (0, 1) for k in ((), (("lr", 0.0),), (("task", "llm-like"),))
    )
    control = next(t for t in trials if t.sim == {"lr": 0.0})
    assert control.tags()["pdm.sim.lr"] == "0.0"
    assert "-lr0.0-" in control.run_name()
    plain = next(t for t in trials if not t.sim)
    assert not any(k.startswith("pdm.sim.") for k in plain.tags())
    # No knob, no change: the identity of a plain trial is what it was before knobs existed.
    assert "sim" not in plain.identity()
    assert Trial(**{**plain.model_dump(), "sim": {}}).trial_hash == plain.trial_hash
    # Other backends leave knob cells out (they are the embedded backend's experiments).
    assert [t.sim for t in load_registry(project).expand("knobs", backend="verl")] == [{}, {}]


def test_the_paper_sweeps_carry_one_mismatch_control_per_setting():
    registry = load_registry()
    for sweep, delta in (("main-figure", 0.15), ("delta-ablation", 0.05)):
        trials = registry.expand(sweep)
        controls = [t for t in trials if t.sim]
        assert len(trials) == 72 and len(controls) == 12
        assert {t.sim["lr"] for t in controls} == {0.0}
        # a recipe without a delta parameter (grpo-clip-higher) carries none
        assert {t.delta for t in trials if registry.recipes[t.method].uses_delta} == {delta}
        assert {t.method for t in controls} == {"dppo-topk-kl"}
        assert {(t.model, t.precision) for t in controls} == {
            (t.model, t.precision) for t in trials
        }
        # pdm-gram's cells (backend: sim) are left out on verl, which cannot supply its input.
        on_verl = registry.expand(sweep, backend="verl")
        assert len(on_verl) == 48 and "pdm-gram" not in {t.method for t in on_verl}


def test_bad_knobs_are_reported_with_file_and_line(project):
    (project / "sweeps" / "badknobs.yaml").write_text(BAD_KNOBS)
    out = pdm("sweep", "badknobs", "--dry-run", project=project)
    assert out.returncode == 2, out.stderr
    for line, text in (("badknobs.yaml:8", "greater than or equal to 0"),
                       ("badknobs.yaml:9", "llm-like"), ("badknobs.yaml:10", "colour")):  # fmt: skip
        assert any(line in row and text in row for row in out.stderr.splitlines()), (
            line,
            text,
            out.stderr,
        )
