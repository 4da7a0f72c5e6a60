"""The recipe contract: parameters and their roles, the source hash, snapshots, axes that apply,
and recipe code checked before anything launches (file and line in every problem)."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
import torch

from pdmask.errors import RecipeError
from pdmask.registry import Param, load_registry
from pdmask.registry.recipe_check import check_recipes
from pdmask.registry.recipe_files import load_recipe_file
from pdmask.registry.recipe_source import RecipeSource, source_hash
from tests.registry.conftest import pdm

ROOT = Path(__file__).resolve().parents[2]

HEADER = '"""A test recipe."""\n\nimport torch\n\nfrom pdmask.registry import Param, Recipe\n\n'


def write(project: Path, stem: str, body: str) -> Path:
    path = project / "recipes" / f"{stem}.py"
    path.write_text(HEADER + textwrap.dedent(body))
    return path


def recipe_call(name: str, extra: str) -> str:
    return (
        f'RECIPE = Recipe(name="{name}", display_name="{name}", color="#123456", '
        f'summary="s", {extra})\n'
    )


@pytest.fixture
def project(tmp_path: Path) -> Path:
    for name in ("recipes", "sweeps", "dashboards"):
        shutil.copytree(ROOT / name, tmp_path / name)
    return tmp_path


# -- parameters ----------------------------------------------------------------------------------


def test_param_check_refuses_nan_inf_and_floats_for_integers():
    delta = Param(default=0.1, ge=0.0, description="d")
    topk = Param(default=20, ge=0, description="k")
    for bad in (math.nan, math.inf, -math.inf):
        assert "finite" in delta.check(bad)
        assert topk.check(bad) is not None
    assert "integer" in topk.check(2.5)
    assert "integer" in topk.check(20.0)  # an integral float is still not an int
    assert topk.check(True) is not None and delta.check(True) is not None
    assert topk.check(12) is None and delta.check(1) is None
    assert delta.normalise(1) == 1.0 and isinstance(delta.normalise(1), float)
    typed = Param(default=None, type="int", description="an integer without a default")
    assert typed.check(3) is None and "integer" in typed.check(3.5)


def test_roles_are_declared_once_and_typed(project):
    write(
        project,
        "two_ks",
        recipe_call(
            "two-ks",
            'proximity="kl_topk", direction="ratio", '
            'params={"a": Param(default=8, role="topk", description="x"), '
            '"b": Param(default=20, role="topk", description="y")}',
        ),
    )
    write(
        project,
        "float_k",
        recipe_call(
            "float-k",
            'proximity="kl_topk", direction="ratio", '
            'params={"k": Param(default=2.0, role="topk", description="x")}',
        ),
    )
    reg = load_registry(project)
    messages = {Path(p.file).name: p.message for p in reg.recipe_problems}
    assert "already played" in messages["two_ks.py"]
    assert "needs a int parameter" in messages["float_k.py"]


def test_backends_ask_the_recipe_for_its_roles(project):
    """A recipe naming its parameters its own way: the roles, not the names, reach the backends."""
    from pdmask.backends.sim.backend import sim_config

    write(
        project,
        "renamed",
        recipe_call(
            "renamed",
            'proximity="kl_topk", direction="ddot_agg", '
            'params={"radius": Param(default=0.1, ge=1e-6, role="delta", description="r"), '
            '"k": Param(default=12, ge=1, role="topk", description="k"), '
            '"cap": Param(default=3.0, ge=1.0, role="ratio_cap", description="c")}, '
            'needs=("behaviour_topk",)',
        ),
    )
    (project / "sweeps" / "renamed.yaml").write_text(
        "name: renamed\ndescription: x\nseeds: 1\nprofile: smoke\n"
        "grid: {method: [renamed], model: [qwen3-4b-base], precision: [bf16], delta: [0.07]}\n"
    )
    reg = load_registry(project)
    (trial,) = reg.expand("renamed")
    assert trial.delta == 0.07 and trial.params["radius"] == 0.07  # the axis sets the role
    cfg = sim_config(trial)
    assert (cfg.delta, cfg.top_k, cfg.ratio_cap) == (0.07, 12, 3.0)
    pytest.importorskip("verl")
    from pdmask.backends.verl.jobs import trial_overrides

    kv = dict(o.split("=", 1) for o in trial_overrides(trial, reg.sweep("renamed"), "h20x32"))
    assert kv["+actor_rollout_ref.actor.policy_loss.pdm_delta"] == "0.07"
    assert kv["+actor_rollout_ref.actor.policy_loss.pdm_topk"] == "12"
    assert kv["+actor_rollout_ref.actor.policy_loss.pdm_ratio_cap"] == "3.0"


def test_a_stray_file_in_recipes_is_a_problem(project):
    (project / "recipes" / "notes.yaml").write_text("a: 1\n")
    (project / "recipes" / "README.md").write_text("documentation is fine\n")
    (project / "recipes" / "_helpers.py").write_text("x = 1\n")
    reg = load_registry(project)
    (problem,) = reg.recipe_problems
    assert problem.file.endswith("notes.yaml") and "not a recipe" in problem.message
    assert "pdm-agg" in reg.recipes  # the others still load


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


# -- recipe code runs before anything launches ---------------------------------------------------

WRONG_SHAPE = """
def per_sequence(batch):
    return batch.stats.kl_topk.max(-1).values > 0.1  # [B], not [B, T]


""" + recipe_call("wrong-shape", "mask=per_sequence")

NAN_ON_SHORT = """
def unstable(batch):
    per_row = batch.sequence_sum(batch.log_prob) / (batch.sequence_lengths - 1)
    return -batch.advantages * batch.per_token(per_row)


""" + recipe_call("nan-on-short", "loss=unstable")

DETACHED = """
def detached(batch):
    return -batch.advantages * batch.stats.ratio


""" + recipe_call("detached", "loss=detached")

RAISES = """
def broken(batch):
    value = batch.params["missing"]
    return batch.response_mask


""" + recipe_call("raises", "mask=broken")


RANDOM_MASK = """
import torch


def coin(batch):
    return torch.rand(batch.response_mask.shape) < 0.5


""" + recipe_call("random-mask", "mask=coin")

FP8_ONLY_BUG = """
def only_in_fp8_rollout(batch):
    if batch.precision == "fp8-rollout":
        return batch.response_mask[:, 0]
    return batch.response_mask & False


""" + recipe_call("fp8-only", "mask=only_in_fp8_rollout")


def test_recipe_code_problems_name_the_file_function_and_line(project):
    paths = {
        "wrong-shape": write(project, "wrong_shape", WRONG_SHAPE),
        "nan-on-short": write(project, "nan_on_short", NAN_ON_SHORT),
        "detached": write(project, "detached", DETACHED),
        "raises": write(project, "raises", RAISES),
        "random-mask": write(project, "random_mask", RANDOM_MASK),
        "fp8-only": write(project, "fp8_only", FP8_ONLY_BUG),
    }
    reg = load_registry(project)
    assert not reg.recipe_problems  # their fields are fine: only running them shows the bugs
    problems = {Path(p.file).stem: p for p in check_recipes(reg.recipes)}
    assert set(problems) == {p.stem for p in paths.values()}, problems
    lines = {name: path.read_text().splitlines() for name, path in paths.items()}

    def line_of(name, text):
        return 1 + next(i for i, line in enumerate(lines[name]) if text in line)

    shape = problems["wrong_shape"]
    assert shape.field == "mask" and "shape (4,)" in shape.message and "[B, T]" in shape.message
    assert shape.line == line_of("wrong-shape", "def per_sequence")
    nan = problems["nan_on_short"]
    assert nan.field == "loss" and "not finite" in nan.message
    assert nan.line == line_of("nan-on-short", "def unstable")
    assert "no gradient" in problems["detached"].message
    raised = problems["raises"]
    assert "KeyError" in raised.message and raised.line == line_of("raises", 'params["missing"]')
    random = problems["random_mask"]
    assert random.field == "mask" and "draws from torch's" in random.message
    assert random.line == line_of("random-mask", "def coin")
    fp8 = problems["fp8_only"]  # a branch that runs only under one precision is checked too
    assert fp8.field == "mask" and "fp8-rollout" in fp8.message, fp8
    assert not check_recipes({n: r for n, r in reg.recipes.items() if n in project_names()})


def project_names():
    return set(load_registry(ROOT).recipes)


def test_a_recipe_error_during_training_names_its_file(project):
    path = write(project, "wrong_shape", WRONG_SHAPE)
    recipe, problems = load_recipe_file(path)
    assert not problems
    from pdmask.registry.recipe_check import synthetic_batch
    from pdmask.trust_region import apply_method

    data = synthetic_batch("sim", "float32")
    with pytest.raises(RecipeError) as err:
        apply_method(
            recipe.method({}), data.stats, data.advantages, data.response_mask, backend="sim"
        )
    assert err.value.problem.file == str(path) and err.value.exit_code == 2
    assert f"{path}:" in str(err.value)


def test_validate_and_sweep_refuse_a_wrong_shape_before_launch(project):
    path = write(project, "wrong_shape", WRONG_SHAPE)
    (project / "sweeps" / "bad.yaml").write_text(
        "name: bad\ndescription: x\nseeds: 1\nprofile: smoke\n"
        "grid: {method: [wrong-shape], model: [qwen3-4b-base], precision: [bf16]}\n"
    )
    line = 1 + next(
        i for i, t in enumerate(path.read_text().splitlines()) if "def per_sequence" in t
    )
    for args in (("validate",), ("sweep", "bad", "--dry-run"), ("sweep", "bad")):
        out = pdm(*args, project=project)
        assert out.returncode == 2, (args, out.stderr)
        assert f"{path}:{line}: mask:" in out.stderr and "[B, T]" in out.stderr, out.stderr
    assert not (project / ".pdm" / "mlflow.db").exists()


def test_recipes_list_shows_the_valid_and_reports_the_broken(project):
    (project / "recipes" / "syntax.py").write_text("RECIPE = (\n")
    (project / "recipes" / "notes.yaml").write_text("a: 1\n")
    out = pdm("recipes", "list", "--json", project=project)
    assert out.returncode == 2
    listed = {r["name"] for r in json.loads(out.stdout)}
    assert {"pdm-agg", "cispo", "gspo"} <= listed
    assert "syntax.py:1" in out.stderr and "notes.yaml" in out.stderr


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


def test_the_contract_states_what_a_recipe_receives():
    from pdmask.registry.recipe_check import synthetic_batch
    from pdmask.trust_region import Method, apply_method

    seen = {}

    def spy(batch):
        seen["batch"] = batch
        return torch.zeros_like(batch.response_mask)

    data = synthetic_batch("verl", "float32")
    apply_method(
        Method("spy", mask=spy, params={"x": 1}),
        data.stats,
        data.advantages,
        data.response_mask,
        log_prob=data.log_prob,
        mu_log_prob=data.mu_log_prob,
        backend="verl",
        precision="fp8-rollout",
    )
    batch = seen["batch"]
    b, t = batch.response_mask.shape
    assert batch.sequence_lengths.tolist() == [6, 1, 4, 3] and batch.dtype == torch.float32
    assert batch.log_prob.requires_grad and not batch.stats.logp.requires_grad
    assert batch.stats.kl_topk.shape == (b, t) and batch.advantages.shape == (b, t)
    assert (batch.backend, batch.precision, dict(batch.params)) == ("verl", "fp8-rollout", {"x": 1})
    with pytest.raises(TypeError):
        batch.params["x"] = 2  # read-only
    assert RecipeSource.of("x.py", "x = 1").hash == source_hash("x = 1")


def _outside(batch):
    kl = batch.stats.kl_topk  # the synthetic batch's KL is large: mask its upper half
    return kl > kl[batch.response_mask].median()


def _pg_plus_penalty(batch):
    """-r A everywhere, plus 0.1 * log pi on the masked tokens (acts only where the mask is)."""
    pg = -torch.exp(batch.log_prob - batch.mu_log_prob) * batch.advantages
    penalty = torch.where(batch.mask, 0.1 * batch.log_prob, torch.zeros_like(batch.log_prob))
    return torch.where(batch.mask, penalty, pg)


def _pg_only(batch):
    return -torch.exp(batch.log_prob - batch.mu_log_prob) * batch.advantages


def test_a_loss_that_sees_the_mask_acts_on_masked_tokens_and_the_share_stays_the_masks():
    """float64 reference: on masked tokens the loss is the recipe's own penalty (not 0), on the
    others the policy-gradient term; the mask the backends log is the recipe's."""
    from pdmask.registry import Recipe
    from pdmask.registry.recipe_check import synthetic_batch
    from pdmask.trust_region import apply_method

    def run(recipe):
        data = synthetic_batch("sim", "float64")
        out = apply_method(
            recipe.method({}), data.stats, data.advantages, data.response_mask, backend="sim"
        )
        return data, out

    common = dict(display_name="x", color="#123456", summary="s", mask=_outside)
    sees = Recipe(name="sees-mask", loss=_pg_plus_penalty, loss_sees_mask=True, **common)
    blind = Recipe(name="blind", loss=_pg_only, **common)
    data, out = run(sees)
    valid = data.response_mask
    logp = data.stats.logp.detach()
    mu = data.stats.mu_logp.detach()
    kl = data.stats.kl_topk
    expected_mask = (kl > kl[valid].median()) & valid
    assert torch.equal(out.mask, expected_mask) and 0 < int(expected_mask.sum()) < int(valid.sum())
    expected = torch.where(expected_mask, 0.1 * logp, -torch.exp(logp - mu) * data.advantages)
    expected = torch.where(valid, expected, 0.0)
    assert torch.allclose(out.token_loss.detach(), expected, rtol=1e-12, atol=1e-12)
    assert bool((out.token_loss[expected_mask] != 0).all())  # kept where the mask is

    data, out = run(blind)  # the default composition: masked tokens contribute nothing
    assert out.batch.mask is None
    assert bool((out.token_loss[out.mask] == 0).all())
    assert torch.equal(out.mask, expected_mask)


def test_loss_sees_mask_without_an_own_loss_is_refused():
    from pdmask.registry import Recipe

    with pytest.raises(ValueError, match="loss_sees_mask"):
        Recipe(
            name="nothing-to-see",
            display_name="x",
            color="#123456",
            summary="s",
            mask=_outside,
            loss_sees_mask=True,
        )


def test_a_recipe_metric_name_verl_would_misreduce_or_a_non_finite_value_is_refused():
    from pdmask.registry.recipe_check import synthetic_batch
    from pdmask.trust_region import Method, apply_method

    def reports(name, value):
        def mask(batch):
            batch.report(name, value)
            return batch.response_mask & False

        data = synthetic_batch("sim", "float32")
        return apply_method(
            Method("r", mask=mask), data.stats, data.advantages, data.response_mask, backend="sim"
        )

    assert reports("bonus_size", torch.tensor(0.5)).batch.reported == {"bonus_size": 0.5}
    for name in ("kl_max", "Bonus", "share-of"):  # verl would take the max; not a plain name
        with pytest.raises(ValueError, match="recipe metric name"):
            reports(name, 1.0)
    with pytest.raises(ValueError, match="not finite"):
        reports("bonus_size", math.nan)
