"""A recipe file trains on VeRL: the job carries it (as planned) to every worker."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl")
pytestmark = [pytest.mark.verl, pytest.mark.slow, pytest.mark.processes]

import torch  # noqa: E402
from verl.workers.config import ActorConfig  # noqa: E402

from pdmask.backends.verl import plugin  # noqa: E402
from pdmask.backends.verl.config import PDMPolicyLossConfig  # noqa: E402
from pdmask.backends.verl.file_recipes import ENV_VAR, FileRecipe  # noqa: E402
from pdmask.backends.verl.job_spec import job_specs  # noqa: E402
from pdmask.errors import ValidationFailed  # noqa: E402
from pdmask.registry import load_registry  # noqa: E402
from tests.registry.test_new_recipe import NEW_RECIPE  # noqa: E402

from .batches import make_batch  # noqa: E402
from .test_loss_path import ALL, math_api_step, verl_step  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
LOSS_MODE = "hard_topk_kl"
SWEEP = (
    "name: hard\ndescription: a new baseline on the cluster\nseeds: 1\nbackend: verl\n"
    "grid: {method: [hard-topk-kl, pdm-agg], model: [qwen3-4b-base], precision: [bf16], "
    "delta: [0.05]}\n"
)


@pytest.fixture
def project(tmp_path, monkeypatch):
    for name in ("recipes", "sweeps", "dashboards"):
        shutil.copytree(ROOT / name, tmp_path / name)
    (tmp_path / "recipes" / "hard_topk_kl.py").write_text(NEW_RECIPE)
    (tmp_path / "sweeps" / "hard.yaml").write_text(SWEEP)
    monkeypatch.setenv("PDM_HOME", str(tmp_path / ".pdm"))
    return tmp_path


def specs_of(project):
    reg = load_registry(project)
    sweep = reg.sweep("hard")
    trials = reg.expand("hard", backend="verl")
    specs = job_specs(reg, sweep, trials, cluster="h20x32", tracking_uri="sqlite:///x.db")
    return {spec.run_name.split("-")[0]: spec for spec in specs}, reg


def _kv(overrides):
    return {o.split("=", 1)[0].lstrip("+"): o.split("=", 1)[1] for o in overrides}


def test_job_of_a_new_recipe_carries_its_file_and_verl_accepts_the_config(project, carried):
    from hydra import compose, initialize_config_module
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    from pdmask.backends.verl.checks import config_problems

    specs = {s.trial_hash: s for s in specs_of(project)[0].values()}
    by_method = {}
    reg = load_registry(project)
    for trial in reg.expand("hard", backend="verl"):
        by_method[trial.method] = specs[trial.trial_hash]
    new, builtin = by_method["hard-topk-kl"], by_method["pdm-agg"]
    # Every method travels as its recipe file, the project's own included.
    shipped = json.loads(builtin.runtime_env["env_vars"][ENV_VAR])["pdm_agg"]
    assert shipped["source"] == (project / "recipes" / "pdm_agg.py").read_text()
    env = new.runtime_env["env_vars"]
    entry = json.loads(env[ENV_VAR])[LOSS_MODE]
    assert entry["source"] == NEW_RECIPE and entry["name"] == "hard-topk-kl"
    assert entry["params"]["delta"] == 0.05 and entry["uses_delta"] is True
    assert entry["precision"] == "bf16" and entry["native"] is False
    kv = _kv(new.overrides)
    assert kv["actor_rollout_ref.actor.policy_loss.loss_mode"] == LOSS_MODE
    assert kv["actor_rollout_ref.actor.policy_loss.pdm_delta"] == "0.05"

    carried(env[ENV_VAR])  # as on a worker of that job: verl's own config accepts it
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        config = compose(config_name="ppo_trainer", overrides=new.overrides)
    validate_config(
        config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config)
    )
    actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    assert actor.policy_loss.loss_mode == LOSS_MODE
    assert config_problems(config) == []
    # Outside that job the loss name means nothing to pdmask.
    carried("")
    assert LOSS_MODE not in plugin.pdm_loss_modes()


def test_a_recipe_needing_what_verl_cannot_supply_is_refused_before_any_job(project):
    path = project / "recipes" / "hard_topk_kl.py"
    path.write_text(NEW_RECIPE.replace('needs=("behaviour_topk",)', 'needs=("behaviour_full",)'))
    with pytest.raises(ValidationFailed) as err:
        specs_of(project)
    (problem,) = err.value.problems  # found when the sweep is expanded, before any job is built
    assert problem.file.endswith("hard.yaml") and problem.line is not None
    assert (
        "cannot supply ['behaviour_full']" in problem.message and "hard-topk-kl" in problem.message
    )


def test_plain_import_verl_in_a_job_process_registers_the_carried_loss(project):
    specs, _ = specs_of(project)
    env_value = specs["hard"].runtime_env["env_vars"][ENV_VAR]
    code = (
        "import verl, json\n"
        "from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY\n"
        "print('LOSSES' + json.dumps(sorted(POLICY_LOSS_REGISTRY)))\n"
    )
    found = {}
    for label, extra in (("job", {ENV_VAR: env_value}), ("plain", {})):
        env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
        env.update(extra, VERL_USE_EXTERNAL_MODULES="pdmask.backends.verl.plugin")
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        line = next(x for x in proc.stdout.splitlines() if x.startswith("LOSSES"))
        found[label] = set(json.loads(line[len("LOSSES") :]))
    assert LOSS_MODE in found["job"] and "pdm_agg" not in found["job"]  # its job's recipe only
    assert LOSS_MODE not in found["plain"] and "vanilla" in found["plain"]


def test_carried_recipe_loss_and_gradient_equal_the_math_api_with_its_mask(project, carried):
    reg = load_registry(project)
    recipe = reg.recipes["hard-topk-kl"]
    delta = 0.05
    fr = FileRecipe.of(recipe, {"delta": 0.3})
    carried(fr.env()[ENV_VAR])  # the job's pdm_delta (0.05) wins over the carried parameter
    config = ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        loss_agg_mode="token-mean",
        policy_loss=PDMPolicyLossConfig(
            loss_mode=LOSS_MODE, pdm_delta=delta, pdm_topk=5, pdm_chunk_size=7
        ),
    )
    batch = make_batch()
    loss, metrics = verl_step(batch, ALL, config)
    verl_grad = batch.leaf.grad.clone()
    batch.leaf.grad = None

    ref = math_api_step(batch, recipe.method({"delta": delta}))
    torch.testing.assert_close(loss, ref.loss.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(verl_grad, batch.leaf.grad, rtol=1e-5, atol=1e-7)
    masked = ref.metrics["masked_frac"]
    assert 0 < masked < 1, masked  # the recipe's own rule decided, not a math-API method's
    assert metrics["actor/pdm/masked_frac"].aggregate() == pytest.approx(masked)
    # Not the same tokens as the nearest math-API method: the recipe's mask really ran.
    other = math_api_step(batch, "dppo-topk-kl", delta=delta)
    assert not torch.equal(other.mask, ref.mask)
