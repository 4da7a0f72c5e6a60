"""pdmask's trainer and worker classes against verl 0.9.1's (construction on CPU; no GPUs, no Ray)."""

from __future__ import annotations

import pytest

pytest.importorskip("verl")
pytestmark = pytest.mark.verl

from hydra import compose, initialize_config_module  # noqa: E402
from omegaconf import OmegaConf, open_dict  # noqa: E402
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


@pytest.mark.parametrize("damaged", [False, True])
def test_a_resumed_retry_logs_the_first_attempts_params_into_its_run(
    composer, carry, tmp_path, monkeypatch, damaged
):
    """verl's v1 trainer loads the checkpoint in init() and logs the config as MLflow params in
    fit(): a retry that resumes from an older checkpoint than verl would pick must not change the
    logged config, or MLflow refuses the params and verl trains without it (seen in CI: the
    engine-killed trial's retry died with "verl's MLflow backend did not start"). ``damaged``:
    step 2 was logged as well, but its shard lost its tail: verl's choice would fail to load in
    every attempt, so the retry moves it aside and resumes from step 1 all the same."""
    import mlflow
    import torch
    from verl.utils.tracking import Tracking

    from pdmask.backends.verl import tracking
    from pdmask.backends.verl.overrides import job_env
    from pdmask.backends.verl.trainer import PDMTrainerSync

    from .test_tracking import attempt_failed

    carry("pdm-agg", delta=0.15)
    config = composer(verl_overrides("pdm-agg", 0.15, precision="bf16", **TRIAL))
    checkpoints = tmp_path / "checkpoints"
    with open_dict(config):
        config.trainer.default_local_dir = str(checkpoints)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    experiment = client.create_experiment(config.trainer.project_name, (tmp_path / "a").as_uri())
    run_id = client.create_run(experiment, run_name="t").info.run_id
    for key, value in job_env(tracking_uri=uri, run_id=run_id).items():
        monkeypatch.setenv(key, value)

    def verl_tracking():
        return Tracking(
            project_name=config.trainer.project_name,
            experiment_name=config.trainer.experiment_name,
            default_backend=config.trainer.logger,
            config=OmegaConf.to_container(config, resolve=True),
        )

    class Loads:  # the actor worker group and the dataloader: what was loaded
        def __init__(self):
            self.paths = []

        def load_checkpoint(self, local_path, del_local_after_load):
            self.paths.append(local_path)

    try:
        first = verl_tracking()  # attempt 1: params logged, step 1 logged, died in step 2
        first.log({tracking.STEP_METRIC: 1.0}, step=1)
        if damaged:
            first.log({tracking.STEP_METRIC: 2.0}, step=2)
        attempt_failed(run_id, monkeypatch)
        for step in (1, 2):
            (checkpoints / f"global_step_{step}" / "actor").mkdir(parents=True)
            shard = checkpoints / f"global_step_{step}" / "actor" / "model_world_size_1_rank_0.pt"
            torch.save({"w": torch.ones(64)}, shard)
        if damaged:
            shard.write_bytes(shard.read_bytes()[:-100])
        (checkpoints / "latest_checkpointed_iteration.txt").write_text("2")

        retry = PDMTrainerSync.__new__(PDMTrainerSync)  # only what _load_checkpoint reads
        retry.config, retry.actor_rollout_wg = config, Loads()
        retry.use_critic, retry.trainer_mode, retry.train_dataloader = False, "sync", None
        retry._load_checkpoint()
        assert retry.actor_rollout_wg.paths == [str(checkpoints / "global_step_1" / "actor")]
        assert retry.global_steps == 1
        assert (config.trainer.resume_mode, config.trainer.resume_from_path) == ("auto", None)

        second = verl_tracking()  # the retry's fit()
        assert "mlflow" in second.logger and mlflow.active_run().info.run_id == run_id
        tracking.start_of_training(config, second)
        tags = client.get_run(run_id).data.tags
        assert tags["pdm.verl.resumed_from"] == str(checkpoints / "global_step_1")
        set_aside = tags.get("pdm.verl.checkpoint_set_aside", "")
        assert (
            set_aside.startswith(
                "checkpoint global_step_2 damaged (actor/model_world_size_1_rank_0.pt: "
            )
            == damaged
        ), set_aside
        assert (checkpoints / "global_step_2").exists() != damaged
    finally:
        while mlflow.active_run():
            mlflow.end_run()
