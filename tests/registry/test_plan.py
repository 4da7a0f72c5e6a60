"""The paper's sweeps expand into the right grids; the plan is printable and scriptable."""

from __future__ import annotations

import json
from collections import Counter

from pdmask.registry import load_registry

from .conftest import ROOT, pdm

SETTINGS = {
    ("qwen3-4b-base", "bf16"),
    ("qwen3-8b-base", "bf16"),
    ("qwen3-30b-a3b-base", "fp8-e2e"),
    ("qwen3-30b-a3b-base", "fp8-rollout"),
}
METHODS = {"grpo-clip-higher", "dppo-topk-kl", "pdm-agg", "pdm-uni"}
SIM_ONLY_METHODS = {"pdm-gram"}  # needs the lm head's input: its cells are the embedded backend's


def _check_figure_grid(plan: dict, delta: float) -> None:
    by_seed: dict[int, set] = {}
    for row in plan["trials"]:
        # A recipe without a delta parameter is not crossed with the delta axis.
        assert row["delta"] == (None if row["method"] == "grpo-clip-higher" else delta)
        by_seed.setdefault(row["seed"], set()).add((row["method"], row["model"], row["precision"]))
    assert len(by_seed) >= 2
    for cells in by_seed.values():
        methods = METHODS | SIM_ONLY_METHODS
        assert cells == {(m, mo, p) for m in methods for mo, p in SETTINGS}  # the 20 cells


def test_main_figure_and_delta_ablation_dry_run_json():
    for sweep, delta in (("main-figure", 0.15), ("delta-ablation", 0.05)):
        out = pdm("sweep", sweep, "--dry-run", "--json", check=True)
        plan = json.loads(out.stdout)
        _check_figure_grid(plan, delta)
        row = plan["trials"][0]
        assert {"trial_hash", "resources", "est_gpu_hours", "status", "config", "tags"} <= set(row)
        assert row["tags"]["pdm.trial_hash"] == row["trial_hash"]


def test_a_piped_table_shows_every_cell_whole():
    """Off a terminal nothing reflows the table later: no cell is cut to an assumed width, and
    the lr = 0 control rows say what they are."""
    out = pdm("sweep", "main-figure", "--dry-run", check=True)
    lines = out.stdout.splitlines()
    assert sum("pdm-agg" in line for line in lines) == 12
    assert sum("fp8-rollout" in line for line in lines) == 18  # 5 methods x 3 seeds + 3 controls
    assert sum("dppo-topk-kl (lr = 0 mismatch control)" in line for line in lines) == 12
    assert not [line for line in lines if "…" in line], lines


def test_dry_run_writes_nothing(project):
    pdm("sweep", "main-figure", "--dry-run", project=project, check=True)
    assert not (project / ".pdm" / "mlflow.db").exists()


def test_grid_operators_product_zip_union_and_overrides(project):
    (project / "sweeps" / "ops.yaml").write_text(
        """
name: ops
description: operators
seeds: [3, 4]
grid:
  union:
    - product:
        - method: [pdm-agg, dppo-topk-kl]
        - zip: {model: [qwen3-4b-base, qwen3-8b-base], precision: [bf16, fp8-rollout]}
      delta: 0.1
    - {method: grpo-clip-higher, model: qwen3-4b-base, precision: bf16}
overrides:
  - where: {method: pdm-agg, model: qwen3-8b-base}
    set: {delta: 0.3}
  - where: {method: grpo-clip-higher}
    set: {params.eps_high: 0.4}
""".replace("      delta: 0.1", "    - delta: [0.1]").replace(
            "  union:\n    - product:", "  union:\n    - product:"
        )
    )
    text = (project / "sweeps" / "ops.yaml").read_text()
    text = text.replace("    - delta: [0.1]\n    - {method", "    - {method")
    text = text.replace(
        "        - zip: {model: [qwen3-4b-base, qwen3-8b-base], precision: [bf16, fp8-rollout]}\n",
        "        - zip: {model: [qwen3-4b-base, qwen3-8b-base], precision: [bf16, fp8-rollout]}\n        - delta: [0.1]\n",
    )
    (project / "sweeps" / "ops.yaml").write_text(text)
    trials = load_registry(project).expand("ops")
    assert len(trials) == (2 * 2 + 1) * 2
    cells = Counter((t.method, t.model, t.precision, t.delta) for t in trials)
    assert cells[("pdm-agg", "qwen3-8b-base", "fp8-rollout", 0.3)] == 2
    assert cells[("pdm-agg", "qwen3-4b-base", "bf16", 0.1)] == 2
    grpo = [t for t in trials if t.method == "grpo-clip-higher"]
    assert {t.params["eps_high"] for t in grpo} == {0.4} and {t.seed for t in grpo} == {3, 4}


def test_search_sweep_plans_its_base():
    trials = load_registry(ROOT).expand("delta-search")
    assert len(trials) == 1 and trials[0].method == "pdm-agg"


def test_trials_that_differ_in_a_recipe_parameter_differ_in_name_and_plan_row(project):
    """Two topk values of one method: the run names and the plan rows say which is which (the
    parameter at its default stays out of both)."""
    (project / "sweeps" / "topk.yaml").write_text(
        "name: topk\ndescription: two top-K sizes\nseeds: 1\n"
        "grid: {method: [dppo-topk-kl], model: [qwen3-4b-base], precision: [bf16], "
        "delta: [0.15], params.topk: [20, 8]}\n"
    )
    trials = load_registry(project).expand("topk")
    names = sorted(t.run_name() for t in trials)
    assert names == ["dppo-topk-kl-4b-bf16-d0.15-s0", "dppo-topk-kl-topk8-4b-bf16-d0.15-s0"]
    plan = pdm("sweep", "topk", "--dry-run", project=project, check=True).stdout
    assert "dppo-topk-kl (topk = 8)" in plan and plan.count("dppo-topk-kl") == 2, plan


def test_the_plan_says_which_cells_a_backend_leaves_out():
    """On verl, main-figure's pdm-gram cells (the embedded backend's only) and its lr = 0 controls
    (an embedded-backend knob) are not run: the plan counts them and says why."""
    reg = load_registry()
    left = reg.left_out("main-figure", backend="verl")
    assert {r: (lo.trials, lo.methods) for r, lo in left.items()} == {
        "cells for the sim backend only": (12, ["pdm-gram"]),  # 4 settings x 3 seeds
        "cells setting sim.lr (embedded-backend knobs)": (12, ["dppo-topk-kl"]),
    }
    assert reg.left_out("main-figure", backend="sim") == {}
    planned = len(reg.expand("main-figure", backend="verl"))
    assert planned + 24 == len(reg.expand("main-figure", backend="sim")) == 72
    out = pdm("sweep", "main-figure", "--dry-run", "--backend", "verl", check=True).stdout
    assert (
        "left out on backend verl: 12 trial(s), cells for the sim backend only (method pdm-gram)"
        in out
    )
    plan = json.loads(
        pdm("sweep", "main-figure", "--dry-run", "--backend", "verl", "--json", check=True).stdout
    )
    assert sum(entry["trials"] for entry in plan["left_out"]) == 24
    assert len(plan["trials"]) == planned
