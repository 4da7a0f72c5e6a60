"""The job's MLflow run with verl's real ``Tracking`` against a sqlite store: tags, config, FAILED."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("verl")
pytestmark = pytest.mark.verl

import mlflow  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from verl.utils.tracking import Tracking  # noqa: E402

from pdmask.backends.verl import tracking  # noqa: E402
from pdmask.backends.verl.overrides import job_env  # noqa: E402
from pdmask.errors import IncompleteRun, TrackingError  # noqa: E402
from pdmask.orchestration.jobs.cluster import last_exception  # noqa: E402
from pdmask.tracking.runs import FailureKind, exception_kind  # noqa: E402

SWEEP_TAGS = {
    "pdm.sweep": "main-figure",
    "pdm.trial_hash": "abc123",
    "pdm.method": "pdm-agg",
    "pdm.delta": "0.15",
}


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    """One sqlite store for the module (creating one costs seconds); tests use distinct runs."""
    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    experiment_id = client.create_experiment(
        "main-figure", artifact_location=(root / "artifacts").as_uri()
    )
    return uri, client, experiment_id


@pytest.fixture
def store(db, monkeypatch):
    for key in ("MLFLOW_RUN_ID", "MLFLOW_RUN_CONTEXT"):
        monkeypatch.delenv(key, raising=False)
    yield db
    while mlflow.active_run():
        mlflow.end_run()


def job_config():
    return OmegaConf.create(
        {
            "trainer": {
                "logger": ["mlflow"],
                "project_name": "main-figure",
                "experiment_name": "trial-1",
            },
            "actor_rollout_ref": {
                "actor": {"policy_loss": {"loss_mode": "pdm_agg", "pdm_mu_source": "rollout"}},
                "rollout": {"quantization": "fp8", "engine_kwargs": {"vllm": {}}},
            },
        }
    )


def start_verl_tracking(config):
    return Tracking(
        project_name=config.trainer.project_name,
        experiment_name=config.trainer.experiment_name,
        default_backend=list(config.trainer.logger),
        config=OmegaConf.to_container(config),
    )


def job_of_a_new_run(store, monkeypatch, run_name: str) -> str:
    """A pre-created run and the job env that attaches to it, as a sweep's job gets them."""
    uri, client, experiment_id = store
    run_id = client.create_run(experiment_id, run_name=run_name).info.run_id
    for key, value in job_env(tracking_uri=uri, run_id=run_id).items():
        monkeypatch.setenv(key, value)
    return run_id


def attempt_failed(run_id: str, monkeypatch) -> None:
    """The attempt's job died: its run ends FAILED, and the retry's job env names the run again
    (ending the active run unsets MLFLOW_RUN_ID in this process)."""
    mlflow.end_run(status="FAILED")
    monkeypatch.setenv("MLFLOW_RUN_ID", run_id)


def test_tags_at_creation_and_failed_status(store, monkeypatch):
    uri, client, experiment_id = store
    for key, value in job_env(tracking_uri=uri, tags=SWEEP_TAGS).items():
        monkeypatch.setenv(key, value)
    config = job_config()
    logger = start_verl_tracking(config)
    tracking.start_of_training(config, logger)
    run_id = mlflow.active_run().info.run_id
    logger.log({"actor/pdm/masked_frac": 0.1}, step=1)
    with pytest.raises(RuntimeError, match="boom"), tracking.failure_marked():
        raise RuntimeError("boom in step 2")
    logger.finish()  # what verl's TaskRunner does afterwards: must not turn FAILED into FINISHED

    run = client.get_run(run_id)
    assert run.info.status == "FAILED" and "boom in step 2" in run.data.tags[tracking.FAILURE_TAG]
    assert {k: run.data.tags[k] for k in SWEEP_TAGS} == SWEEP_TAGS  # the sweep finds it by its tags
    assert (
        run.data.tags["pdm.verl.version"] == "0.9.1"
        and run.data.tags["pdm.verl.rollout_quantization"] == "fp8"
    )
    assert run.info.run_name == "trial-1" and run.info.experiment_id == experiment_id
    assert run.data.metrics["actor/pdm/masked_frac"] == pytest.approx(0.1)
    found = client.search_runs([experiment_id], filter_string="tags.`pdm.trial_hash` = 'abc123'")
    assert [r.info.run_id for r in found] == [run_id]
    artifact = mlflow.artifacts.download_artifacts(
        run_id=run_id, artifact_path=tracking.CONFIG_ARTIFACT, tracking_uri=uri
    )
    with open(artifact) as fh:
        assert "pdm_agg" in fh.read()


def test_attach_to_a_precreated_run(store, monkeypatch):
    uri, client, experiment_id = store
    tags = {**SWEEP_TAGS, "pdm.trial_hash": "def456"}
    run_id = client.create_run(experiment_id, run_name="trial-1", tags=tags).info.run_id
    env = job_env(tracking_uri=uri, run_id=run_id, tags=tags)
    assert (
        "MLFLOW_RUN_CONTEXT" not in env
        and env["VERL_USE_EXTERNAL_MODULES"] == "pdmask.backends.verl.plugin"
    )
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    config = job_config()
    logger = start_verl_tracking(config)
    tracking.start_of_training(config, logger)
    assert mlflow.active_run().info.run_id == run_id
    logger.finish()
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["pdm.backend"] == "verl"
    assert run.data.params["trainer/experiment_name"] == "trial-1"  # verl's params landed in it


def test_failure_before_training_marks_the_precreated_run(store, monkeypatch):
    _, client, _ = store
    run_id = job_of_a_new_run(store, monkeypatch, "trial-2")
    with pytest.raises(ValueError), tracking.failure_marked():
        raise ValueError("bad worker config")
    run = client.get_run(run_id)
    assert (
        run.info.status == "FAILED" and "bad worker config" in run.data.tags[tracking.FAILURE_TAG]
    )


def test_silently_disabled_mlflow_is_refused(store):
    class NoMlflow:  # what verl's Tracking holds after its MLflow start-up failed
        logger = {"console": object()}

    with pytest.raises(TrackingError, match="did not start"):
        tracking.start_of_training(job_config(), NoMlflow())
    assert json.loads(job_env(tracking_uri="sqlite://", tags={"a": 1})["MLFLOW_RUN_CONTEXT"]) == {
        "a": "1"
    }


def test_a_retry_whose_config_changed_names_the_params_mlflow_refused(store, monkeypatch):
    run_id = job_of_a_new_run(store, monkeypatch, "trial-4")
    config = job_config()
    start_verl_tracking(config)  # attempt 1 logs its params
    attempt_failed(run_id, monkeypatch)
    config.trainer.experiment_name = "trial-4-changed"  # the retry's config differs
    monkeypatch.setattr("verl.utils.tracking.MLFLOW_SLEEP_SECONDS", 0)
    second = start_verl_tracking(config)
    assert "mlflow" not in second.logger  # verl gave up on MLflow, silently
    with pytest.raises(TrackingError) as err:
        tracking.start_of_training(config, second)
    assert "trainer/experiment_name: 'trial-1' -> 'trial-4-changed'" in str(err.value)


def test_a_retried_job_never_logs_a_step_twice(store, monkeypatch):
    """Attempt 2 resumes from the checkpoint at step 1 and verl logs steps 2-3 again."""
    _, client, _ = store
    run_id = job_of_a_new_run(store, monkeypatch, "trial-3")
    config = job_config()

    first = start_verl_tracking(config)
    tracking.start_of_training(config, first)
    for step in range(4):
        first.log(
            data={"critic/score/mean": float(step), "val-core/acc@16": 10.0 + step}, step=step
        )
    attempt_failed(run_id, monkeypatch)  # the job died after step 3

    second = start_verl_tracking(config)
    assert mlflow.active_run().info.run_id == run_id
    tracking.start_of_training(config, second)
    for step in range(2, 6):
        second.log(data={"critic/score/mean": 100.0 + step}, step=step)
        second.log(data={"val-core/acc@16": 200.0 + step, "only/attempt2": 1.0}, step=step)
    second.finish()

    def history(key):
        return [(m.step, m.value) for m in client.get_metric_history(run_id, key)]

    assert sorted(history("critic/score/mean")) == [
        (0, 0.0), (1, 1.0), (2, 2.0), (3, 3.0), (4, 104.0), (5, 105.0)
    ]  # fmt: skip
    assert [s for s, _ in sorted(history("val-core/acc_at_16"))] == [0, 1, 2, 3, 4, 5]
    assert [s for s, _ in sorted(history("only/attempt2"))] == [2, 3, 4, 5]  # per metric


def test_a_job_whose_steps_never_reached_mlflow_ends_failed(store, monkeypatch):
    """verl's MLflow adapter drops a step whose log_metrics failed three times and trains on, and
    verl's TaskRunner would end the run FINISHED: the guard refuses the step at once, and the
    end of training refuses a run without its last step, naming why."""
    _, client, _ = store
    run_id = job_of_a_new_run(store, monkeypatch, "trial-5")
    config = job_config()
    logger = start_verl_tracking(config)
    tracking.start_of_training(config, logger)
    logger.log({"val-core/aime24/acc/mean@16": 0.1}, step=0)  # validation alone is no training
    with pytest.raises(TrackingError, match="no training metrics at all"):
        tracking.require_training_metrics(config, last_step=1)
    logger.log({tracking.STEP_METRIC: 1, "actor/pg_loss": 0.5}, step=1)
    tracking.require_training_metrics(config, last_step=1)  # step 1 is held: nothing to refuse
    # Step 2: MLflow refuses the batch (a value that is not a number); verl's adapter would warn
    # only and train on, pdmask's guard ends the attempt naming the step.
    refused = pytest.raises(IncompleteRun, match=r"refused step 2's metrics \(2 values\).* 3 times")
    with refused, tracking.failure_marked():  # as the job's fit() is wrapped
        logger.log({tracking.STEP_METRIC: 2, "actor/pg_loss": "not a number"}, step=2)
    assert [m.step for m in client.get_metric_history(run_id, tracking.STEP_METRIC)] == [1]
    run = client.get_run(run_id)  # FAILED, and the job's log names an incomplete run: retried
    assert run.info.status == "FAILED"
    refusal = last_exception(run.data.tags[tracking.FAILURE_TAG])
    assert exception_kind(refusal) == FailureKind.INCOMPLETE, refusal
    monkeypatch.setenv("MLFLOW_RUN_ID", run_id)  # ending the run unset it in this process
    with pytest.raises(TrackingError, match="after step 1"), tracking.failure_marked():
        tracking.require_training_metrics(config, last_step=2)
    logger.finish()  # verl's TaskRunner, afterwards
    run = client.get_run(run_id)
    reason = run.data.tags[tracking.FAILURE_TAG]
    assert run.info.status == "FAILED" and "training ended at step 2" in reason
    assert "three failed log_metrics calls" in reason
    with pytest.raises(TrackingError, match="before its first step"):
        tracking.require_training_metrics(config, last_step=0)
    console_only = OmegaConf.merge(config, {"trainer": {"logger": ["console"]}})
    tracking.require_training_metrics(console_only, last_step=2)  # no MLflow: nothing to hold


@pytest.mark.parametrize("engine", ["fsdp", "megatron"])
def test_the_job_labels_its_precision_by_the_engine_that_trains_it(store, monkeypatch, engine):
    """The submitter tags fp8-e2e with the VeRL backend's label (BF16 training); a job that trains
    on Megatron in FP8 says so on its run, in the tag and the description alike."""
    from pdmask.registry.catalog import PRECISIONS
    from pdmask.tracking.store import DESCRIPTION_TAG

    uri, client, experiment_id = store
    spec = PRECISIONS["fp8-e2e"]
    submitted = spec.label_on("verl")
    tags = {
        **SWEEP_TAGS,
        "pdm.trial_hash": f"label-{engine}",
        "pdm.precision": "fp8-e2e",
        "pdm.precision_label": submitted,
        DESCRIPTION_TAG: f"pdm-agg on qwen3-30b-a3b-base, fp8-e2e ({submitted}), seed 0: ...",
    }
    run_id = client.create_run(experiment_id, run_name="trial-1", tags=tags).info.run_id
    for key, value in job_env(tracking_uri=uri, run_id=run_id, tags=tags).items():
        monkeypatch.setenv(key, value)
    config = job_config()
    if engine == "megatron":
        actor = config.actor_rollout_ref.actor
        actor.strategy = "megatron"
        actor.megatron = {"override_transformer_config": {"fp8": "e4m3", "fp8_recipe": "blockwise"}}
    logger = start_verl_tracking(config)
    tracking.start_of_training(config, logger)
    logger.finish()
    run = client.get_run(run_id).data.tags
    label = spec.label_on("verl", engine)
    assert run["pdm.precision_label"] == label and f"fp8-e2e ({label})" in run[DESCRIPTION_TAG]
    assert ("FP8 training" in label) == (engine == "megatron")
