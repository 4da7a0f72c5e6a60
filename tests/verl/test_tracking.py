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
from pdmask.errors import TrackingError  # noqa: E402

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
    uri, client, experiment_id = store
    run_id = client.create_run(experiment_id, run_name="trial-2").info.run_id
    for key, value in job_env(tracking_uri=uri, run_id=run_id).items():
        monkeypatch.setenv(key, value)
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
