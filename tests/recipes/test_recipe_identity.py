"""A trial's identity follows its recipe: the source hash covers what the code does, an edit
changes the trials and says why, the delta axis reaches every threshold and only methods that
have one, and untracked registry files count as a dirty tree."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from pdmask.registry import load_registry
from pdmask.registry.recipe_source import source_hash
from tests.registry.conftest import ROOT, pdm

from .recipe_writing import recipe_call, write

# -- the source hash -----------------------------------------------------------------------------


def test_the_hash_covers_what_the_code_does_not_how_it_is_written():
    text = (ROOT / "recipes" / "pdm_agg.py").read_text()
    same = [
        text + "\n# a comment\n",
        text.replace('"""Predictive divergence mask', '"""Another docstring. PDM', 1),
        text.replace('color="#D55E00"', 'color="#000000"').replace(
            'display_name="PDM (agg. tail)"', 'display_name="renamed"'
        ),
        text.replace("RECIPE = Recipe(\n", "RECIPE = Recipe(  # reformatted\n\n"),
    ]
    for variant in same:
        assert source_hash(variant) == source_hash(text)
    different = [
        text.replace('direction="ddot_agg"', 'direction="ddot_uni"'),
        text.replace("needs=(", "version=2, needs=("),
        text.replace(
            "from pdmask.registry.common_params import DELTA, RATIO_CAP, TOPK",
            "from pdmask.registry.common_params import DELTA, RATIO_CAP, TOPK, EPS_LOW",
        ),
    ]
    for variant in different:
        assert source_hash(variant) != source_hash(text)


def test_a_param_description_is_cosmetic_and_its_default_is_not():
    """Rewording what a parameter does never turns trials back to todo; its value does."""
    text = (ROOT / "recipes" / "cispo.py").read_text()
    reworded = re.sub(r'(\n\s+description=)"[^"]*"', r'\1"reworded"', text, count=1)
    assert reworded != text
    assert source_hash(reworded) == source_hash(text)
    assert source_hash(text.replace("default=0.28", "default=0.3", 1)) != source_hash(text)


def test_editing_a_recipe_changes_its_trials_identity_and_says_why(project, tmp_path):
    from pdmask.tracking import TrialRun, TrialStatusIndex, ensure_experiment, open_client

    reg = load_registry(project)
    before = {t.method: t for t in reg.expand("smoke")}
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = open_client(uri)
    exp = ensure_experiment(client, "smoke")
    for trial in before.values():
        run = TrialRun.start_or_resume(client, exp, trial, {})
        run.log(0, {"critic/score/mean": 0.5})  # a run that logged nothing cannot finish
        run.finish()
    path = project / "recipes" / "pdm_agg.py"
    path.write_text(path.read_text().replace('direction="ddot_agg"', 'direction="ddot_bucket"'))
    after = {t.method: t for t in load_registry(project).expand("smoke")}
    assert after["pdm-agg"].trial_hash != before["pdm-agg"].trial_hash
    assert after["pdm-agg"].config_hash == before["pdm-agg"].config_hash
    assert after["dppo-topk-kl"].trial_hash == before["dppo-topk-kl"].trial_hash
    index = TrialStatusIndex.open(uri, "smoke")
    assert index.status_of(after["pdm-agg"]) == "todo (recipe changed)"
    assert index.status_of(after["dppo-topk-kl"]) == "done"
    # The run holds the code that trained it, and its hash.
    run = client.search_runs([exp], filter_string="tags.`pdm.method` = 'pdm-agg'")[0]
    assert run.data.tags["pdm.recipe_hash"] == before["pdm-agg"].recipe_source.hash
    stored = Path(client.download_artifacts(run.info.run_id, "recipe/pdm_agg.py", str(tmp_path)))
    assert stored.read_text() == before["pdm-agg"].recipe_source.text


def test_a_trial_trains_the_source_planned_with_its_sweep(project):
    reg = load_registry(project)
    trial = next(t for t in reg.expand("smoke") if t.method == "pdm-agg")
    path = project / "recipes" / "pdm_agg.py"
    path.write_text("raise RuntimeError('edited mid-sweep')\n")  # later trials must not see this
    recipe = trial.recipe()
    assert recipe.direction == "ddot_agg" and recipe.source == trial.recipe_source
    pytest.importorskip("verl")
    from pdmask.backends.verl.file_recipes import FileRecipe

    assert FileRecipe.of_trial(trial).source == trial.recipe_source.text


def test_the_delta_axis_sets_every_threshold_a_method_has(project):
    """A method with one threshold per advantage sign gives both the delta role: the sweep's
    delta axis sets both, a cell that sets one by name keeps its value, and trials that differ
    in it differ in name (the first declared threshold is the trial's delta)."""
    write(
        project,
        "two_thresholds",
        recipe_call(
            "two-thresholds",
            'proximity="kl_topk", direction="ddot_agg", '
            'params={"delta_pos": Param(default=0.1, ge=1e-6, role="delta", description="A > 0"), '
            '"delta_neg": Param(default=0.1, ge=1e-6, role="delta", description="A < 0")}, '
            'needs=("behaviour_topk",)',
        ),
    )
    grid = "method: [two-thresholds], model: [qwen3-4b-base], precision: [bf16]"
    (project / "sweeps" / "both.yaml").write_text(
        f"name: both\ndescription: x\nseeds: 1\ngrid: {{{grid}, delta: [0.05, 0.15]}}\n"
    )
    (project / "sweeps" / "apart.yaml").write_text(
        f"name: apart\ndescription: x\nseeds: 1\n"
        f"grid: {{{grid}, delta: [0.05], params.delta_neg: [0.05, 0.3]}}\n"
    )
    reg = load_registry(project)
    assert not reg.recipe_problems, reg.recipe_problems
    recipe = reg.recipes["two-thresholds"]
    assert recipe.role_params("delta") == ["delta_pos", "delta_neg"]
    both = {t.delta: t for t in reg.expand("both")}
    assert sorted(both) == [0.05, 0.15]
    for delta, t in both.items():
        assert t.params == {"delta_pos": delta, "delta_neg": delta}, t.params
        assert t.varied_params() == {} and f"-d{delta:g}-" in t.run_name()
    apart = reg.expand("apart")
    assert sorted(t.params["delta_neg"] for t in apart) == [0.05, 0.3]
    assert all(t.delta == 0.05 and t.params["delta_pos"] == 0.05 for t in apart)
    names = sorted(t.run_name() for t in apart)
    assert len(set(names)) == 2 and any("delta_neg0.3" in n for n in names), names
    assert recipe.with_roles(recipe.resolve_params({})[0], {"delta": 0.2}) == {
        "delta_pos": 0.2,
        "delta_neg": 0.2,
    }


# -- axes only where they apply ------------------------------------------------------------------


def test_a_recipe_without_delta_is_not_crossed_with_the_delta_axis(project):
    (project / "sweeps" / "ax.yaml").write_text(
        "name: ax\ndescription: x\nseeds: 1\n"
        "grid: {method: [cispo, pdm-agg], model: [qwen3-4b-base], precision: [bf16], "
        "delta: [0.05, 0.15]}\n"
    )
    trials = load_registry(project).expand("ax")
    cispo = [t for t in trials if t.method == "cispo"]
    assert len(cispo) == 1 and len([t for t in trials if t.method == "pdm-agg"]) == 2
    (one,) = cispo
    assert one.delta is None and "-d" not in one.run_name() and one.tags()["pdm.delta"] == ""
    plan = json.loads(pdm("sweep", "ax", "--dry-run", "--json", project=project, check=True).stdout)
    assert sorted(str(r["delta"]) for r in plan["trials"]) == ["0.05", "0.15", "None"]


def test_git_dirty_counts_untracked_registry_files(tmp_path):
    from pdmask.tracking.provenance import git_state

    repo = tmp_path / "repo"
    for name in ("recipes", "sweeps", "dashboards"):
        (repo / name).mkdir(parents=True)
    (repo / "recipes" / "a.py").write_text("x = 1\n")

    def git(*args):
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)

    git("init", "-q")
    git("-c", "user.email=t@e", "-c", "user.name=t", "add", ".")
    git("-c", "user.email=t@e", "-c", "user.name=t", "commit", "-qm", "init")
    assert git_state(repo)[1] is False
    (repo / "scratch.txt").write_text("untracked outside the registry folders\n")
    assert git_state(repo)[1] is False
    (repo / "recipes" / "new_method.py").write_text("x = 2\n")
    assert git_state(repo)[1] is True
