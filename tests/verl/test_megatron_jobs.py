"""The Megatron strategy's jobs: every Megatron trial the job builder generates composes in verl
0.9.1's own Hydra config (``ppo_trainer`` with ``model_engine=megatron``) and passes its
validation and config dataclasses (``McoreActorConfig``, ``McoreEngineConfig``, the optimizer's),
with the layout ``training_layout`` derived, the FP8 training keys and the rest; FSDP trials
carry none of it. (Composing needs no megatron-core: verl's config classes import none.)"""

from __future__ import annotations

import pytest

pytest.importorskip("verl")
pytestmark = pytest.mark.verl

from hydra import compose, initialize_config_module  # noqa: E402
from verl.trainer.ppo.utils import need_critic, need_reference_policy  # noqa: E402
from verl.utils.config import omega_conf_to_dataclass, validate_config  # noqa: E402

from pdmask.backends.verl.job_spec import job_spec  # noqa: E402
from pdmask.backends.verl.jobs import trial_overrides  # noqa: E402
from pdmask.backends.verl.jobs_setup import JobSettings  # noqa: E402
from pdmask.registry import CLUSTERS, load_registry  # noqa: E402
from pdmask.registry.training_layout import training_layout  # noqa: E402
from tests.methods import ROOT  # noqa: E402

GPU_PROFILES = [name for name, c in CLUSTERS.items() if c.device == "gpu"]
SETTINGS = JobSettings(data_dir="/data", checkpoint_dir="/ckpt", model_root="/models")


@pytest.fixture(scope="module")
def composer():
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        yield lambda overrides: compose(config_name="ppo_trainer", overrides=overrides)


@pytest.fixture(scope="module")
def main_figure():
    reg = load_registry(ROOT)
    sweep = reg.sweeps["main-figure"]
    trials = reg.expand("main-figure", backend="verl", cluster="h20x32")
    trials = [t for t in trials if t.method == "pdm-agg" and t.seed == 0]
    return sweep, trials


def _validated(config):
    validate_config(
        config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config)
    )
    return omega_conf_to_dataclass(config.actor_rollout_ref.actor)


def _megatron_profile(cluster, monkeypatch):
    """``cluster`` with fp8-e2e on Megatron (as the paper's profile has it)."""
    profile = CLUSTERS[cluster].model_copy(update={"megatron_precisions": ("fp8-e2e",)})
    monkeypatch.setitem(CLUSTERS, cluster, profile)


@pytest.mark.parametrize("cluster", GPU_PROFILES)
def test_every_megatron_job_composes_and_passes_verls_validation(
    composer, main_figure, cluster, monkeypatch, carry
):
    sweep, trials = main_figure
    _megatron_profile(cluster, monkeypatch)
    carry("pdm-agg", delta=0.15)
    for trial in trials:
        overrides = trial_overrides(trial, sweep, cluster, settings=SETTINGS)
        actor = _validated(composer(overrides))
        if trial.precision != "fp8-e2e":
            assert actor.strategy.startswith("fsdp") and "model_engine=megatron" not in overrides
            assert not any(".megatron." in o for o in overrides)
            continue
        layout = training_layout(trial.model, trial.precision, cluster, fp8=True)
        assert "model_engine=megatron" in overrides and actor.strategy == "megatron"
        m = actor.megatron
        assert (m.tensor_model_parallel_size, m.pipeline_model_parallel_size) == (
            layout.tp,
            layout.pp,
        )
        assert (m.expert_model_parallel_size, m.expert_tensor_parallel_size) == (
            layout.ep,
            layout.etp,
        )
        assert m.context_parallel_size == 1 and m.sequence_parallel == (layout.tp > 1)
        assert m.seed == trial.seed and m.use_mbridge and not m.vanilla_mbridge
        tc = m.override_transformer_config
        assert (tc["fp8"], tc["fp8_recipe"], tc["moe_router_dtype"]) == (
            "e4m3",
            "blockwise",
            "fp32",
        )
        assert (tc["recompute_granularity"], tc["recompute_method"]) == ("full", "uniform")
        assert actor.optim.override_optimizer_config["fp8_recipe"] == "blockwise"
        assert actor.policy_loss.loss_mode == "pdm_agg" and actor.policy_loss.pdm_delta == 0.15


def test_the_papers_fp8_end_to_end_jobs_say_fp8_training(main_figure, tmp_path):
    sweep, trials = main_figure
    for trial in trials:
        spec = job_spec(
            trial, sweep, cluster="h20x32", tracking_uri=f"sqlite:///{tmp_path}/m.db",
            settings=SETTINGS,
        )  # fmt: skip
        env = spec.runtime_env["env_vars"]
        if trial.precision == "fp8-e2e":
            assert spec.training["engine"] == "megatron" and spec.training["fp8_training"]
            assert (spec.training["tensor_parallel"], spec.training["expert_parallel"]) == (
                2,
                8,
            )
            assert "trains in FP8 on verl's Megatron engine" in spec.precision
            assert env["NVTE_FP8_BLOCK_SCALING_FP32_SCALES"] == "1"
        else:
            assert spec.training == {"engine": "fsdp"}
            assert "NVTE_FP8_BLOCK_SCALING_FP32_SCALES" not in env
