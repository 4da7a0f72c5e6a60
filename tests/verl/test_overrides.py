"""verl's own Hydra config composes and validates with the overrides generated for every trial."""

from __future__ import annotations

import itertools

import pytest

pytest.importorskip("verl")
pytestmark = pytest.mark.verl

from hydra import compose, initialize_config_module  # noqa: E402
from omegaconf import OmegaConf, open_dict  # noqa: E402
from verl.trainer.ppo.utils import need_critic, need_reference_policy  # noqa: E402
from verl.utils.config import omega_conf_to_dataclass, validate_config  # noqa: E402

from pdmask.backends.verl.checks import check_job_config, config_problems  # noqa: E402
from pdmask.backends.verl.config import PDMPolicyLossConfig  # noqa: E402
from pdmask.backends.verl.overrides import PRECISIONS, verl_overrides  # noqa: E402
from pdmask.errors import ValidationFailed  # noqa: E402

MAIN_METHODS = ("grpo-clip-higher", "dppo-topk-kl", "pdm-agg", "pdm-uni")
TRIAL = dict(
    model_path="Qwen/Qwen3-4B-Base",
    nnodes=4,
    n_gpus_per_node=8,
    experiment="main-figure",
    run_name="pdm-agg-4b-seed0",
)


@pytest.fixture(scope="module")
def composer():
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        yield lambda overrides: compose(config_name="ppo_trainer", overrides=overrides)


def _validated(config):
    """What verl's driver does before anything runs, plus the dataclasses the workers build."""
    validate_config(
        config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config)
    )
    actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    rollout = omega_conf_to_dataclass(config.actor_rollout_ref.rollout)
    return actor, rollout


@pytest.mark.parametrize("method,precision", list(itertools.product(MAIN_METHODS, PRECISIONS)))
def test_every_main_trial_composes_and_validates(composer, method, precision, carry):
    carry(method, delta=0.15)  # the trainer process of the job sees its recipe
    config = composer(verl_overrides(method, 0.15, precision=precision, **TRIAL))
    actor, rollout = _validated(config)
    assert isinstance(actor.policy_loss, PDMPolicyLossConfig)
    assert config_problems(config) == []
    assert (
        config.trainer.project_name == "main-figure"
        and config.trainer.v1.trainer_mode == "pdm_sync"
    )
    assert (rollout.quantization == "fp8") == (precision != "bf16")
    kv_cache = OmegaConf.select(
        config, "actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_dtype"
    )
    assert (kv_cache == "fp8") == (precision == "fp8-e2e")
    if method == "grpo-clip-higher":
        assert actor.policy_loss.loss_mode == "vanilla"
        assert (actor.clip_ratio_low, actor.clip_ratio_high) == (0.2, 0.28)
        assert rollout.custom is None
    else:
        assert actor.policy_loss.loss_mode == method.replace("-", "_")
        assert actor.policy_loss.pdm_delta == 0.15 and actor.policy_loss.pdm_topk == 20
        assert rollout.custom == {"pdm_topk": 20}
        assert rollout.agent.default_agent_loop == "pdm_single_turn"


def test_recompute_source_and_large_k(composer, carry):
    carry("pdm-uni", delta=0.05)
    config = composer(
        verl_overrides("pdm-uni", 0.05, precision="bf16", mu_source="recompute", topk=32, **TRIAL)
    )
    actor, rollout = _validated(config)
    assert actor.policy_loss.pdm_mu_source == "recompute"
    assert config.algorithm.rollout_correction.bypass_mode is False
    assert rollout.custom is None  # vLLM is not asked for a top-K it would not need
    assert config_problems(config) == []
    config = composer(verl_overrides("pdm-uni", 0.05, precision="bf16", topk=32, **TRIAL))
    assert config.actor_rollout_ref.rollout.engine_kwargs.vllm.max_logprobs == 32
    assert config_problems(config) == []


def test_extra_overrides_replace_generated_ones(composer):
    extra = {
        "actor_rollout_ref.rollout.n": 16,
        "actor_rollout_ref.actor.strategy": "fsdp",
        "data.train_batch_size": 64,
    }
    overrides = verl_overrides("pdm-agg", 0.15, precision="bf16", extra=extra, **TRIAL)
    assert sum(o.startswith("actor_rollout_ref.actor.strategy=") for o in overrides) == 1
    config = composer(overrides)
    assert (
        config.actor_rollout_ref.actor.strategy == "fsdp"
        and config.actor_rollout_ref.rollout.n == 16
    )
    _validated(config)


def test_bad_trial_inputs_are_all_reported():
    with pytest.raises(ValidationFailed) as err:
        verl_overrides(
            "pdm-nope", -1.0, precision="fp4", mu_source="oracle", topk=0, **{**TRIAL, "nnodes": 0}
        )
    fields = {p.field for p in err.value.problems}
    assert fields == {"method", "precision", "mu_source", "topk", "nnodes", "delta"}
    with pytest.raises(ValidationFailed, match="delta"):
        verl_overrides("dppo-topk-kl", None, precision="bf16", **TRIAL)


def test_startup_checks_name_every_broken_setting(composer, carry):
    carry("pdm-agg", delta=0.15)
    config = composer(verl_overrides("pdm-agg", 0.15, precision="bf16", **TRIAL))
    with open_dict(config):
        config.actor_rollout_ref.model.use_fused_kernels = True
        config.actor_rollout_ref.rollout.top_p = 0.9
        config.actor_rollout_ref.rollout.custom.pdm_topk = 10
        config.actor_rollout_ref.rollout.agent.default_agent_loop = "single_turn_agent"
    with pytest.raises(ValidationFailed) as err:
        check_job_config(config)
    assert {p.field for p in err.value.problems} == {
        "actor_rollout_ref.model.use_fused_kernels",
        "actor_rollout_ref.rollout.top_p",
        "actor_rollout_ref.rollout.custom.pdm_topk",
        "actor_rollout_ref.rollout.agent.default_agent_loop",
    }
