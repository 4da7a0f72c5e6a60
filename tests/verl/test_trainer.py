"""pdmask's trainer and worker classes against verl 0.9.1's (construction on CPU; no GPUs, no Ray)."""

from __future__ import annotations

import pytest

pytest.importorskip("verl")
pytestmark = pytest.mark.verl

from hydra import compose, initialize_config_module  # noqa: E402
from omegaconf import open_dict  # noqa: E402
from verl.single_controller.base.decorator import MAGIC_ATTR  # noqa: E402
from verl.trainer.ppo.v1 import get_trainer_cls  # noqa: E402
from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync  # noqa: E402
from verl.workers.engine_workers import ActorRolloutRefWorker  # noqa: E402

from pdmask.backends.verl.overrides import verl_overrides  # noqa: E402
from pdmask.backends.verl.worker import PDMActorRolloutRefWorker  # noqa: E402
from pdmask.errors import ValidationFailed  # noqa: E402

TRIAL = dict(
    model_path="Qwen/Qwen3-4B-Base", nnodes=1, n_gpus_per_node=8, experiment="smoke", run_name="t"
)


@pytest.fixture(scope="module")
def composer():
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        yield lambda overrides: compose(config_name="ppo_trainer", overrides=overrides)


@pytest.mark.parametrize("mu_source", ["rollout", "recompute"])
def test_trainer_is_verls_sync_trainer(composer, mu_source, carry):
    carry("pdm-agg", delta=0.15)  # the job's recipe, as its trainer process sees it
    config = composer(
        verl_overrides("pdm-agg", 0.15, precision="bf16", mu_source=mu_source, **TRIAL)
    )
    trainer = get_trainer_cls(config.trainer.v1.trainer_mode)(config)
    # verl branches on the literal "sync": anything else would pick the asynchronous replay buffer
    assert trainer.trainer_mode == "sync" and not isinstance(
        trainer.replay_buffer, ReplayBufferAsync
    )
    assert trainer.recompute_mu == (mu_source == "recompute")


def test_trainer_refuses_a_broken_config_before_anything_runs(composer, carry):
    carry("dppo-topk-kl", delta=0.15)
    config = composer(verl_overrides("dppo-topk-kl", 0.15, precision="fp8-rollout", **TRIAL))
    with open_dict(config):
        config.actor_rollout_ref.rollout.logprobs_mode = "raw_logprobs"
        config.algorithm.rollout_correction.bypass_mode = False
    with pytest.raises(ValidationFailed) as err:
        get_trainer_cls("pdm_sync")(config)
    assert {p.field for p in err.value.problems} == {
        "actor_rollout_ref.actor.policy_loss.pdm_mu_source"
    }
    with open_dict(config):
        config.algorithm.rollout_correction.bypass_mode = True
    with pytest.raises(ValidationFailed, match="logprobs_mode"):
        get_trainer_cls("pdm_sync")(config)


@pytest.mark.parametrize("method", ["init_model", "update_actor", "compute_log_prob"])
def test_worker_methods_keep_verls_dispatch(method):
    """The worker group binds only decorated methods; an override must carry the same dispatch."""
    ours = getattr(getattr(PDMActorRolloutRefWorker, method), MAGIC_ATTR)
    base = getattr(getattr(ActorRolloutRefWorker, method), MAGIC_ATTR)
    assert ours["execute_mode"] == base["execute_mode"] and ours["blocking"] == base["blocking"]
    if isinstance(base["dispatch_mode"], dict):  # nd dispatch over a named mesh
        assert (
            ours["dispatch_mode"]["dispatch_fn"].args == base["dispatch_mode"]["dispatch_fn"].args
        )
        assert (
            ours["dispatch_mode"]["dispatch_fn"].func is base["dispatch_mode"]["dispatch_fn"].func
        )
    else:
        assert ours["dispatch_mode"] == base["dispatch_mode"]
