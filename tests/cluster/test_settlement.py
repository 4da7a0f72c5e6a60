"""How a finished job's outcome is written to its MLflow run (a real sqlite store, no cluster)."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from pdmask.orchestration.ray_jobs import JobRunner, TrialJob
from pdmask.orchestration.ray_jobs_cluster import JobView
from pdmask.registry import load_registry
from pdmask.tracking import TrialRun, ensure_experiment, open_client
from tests.cluster.conftest import ROOT

pytestmark = pytest.mark.processes


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One store for the module (creating a sqlite store takes seconds); each test its own trial."""
    home = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PDM_HOME", str(home))
        client = open_client(f"sqlite:///{home / 'mlflow.db'}")
        yield client, ensure_experiment(client, "main-figure")


def _runner(client, experiment_id) -> tuple[JobRunner, io.StringIO]:
    out = io.StringIO()
    runner = JobRunner(
        sweep=None,
        cluster=None,  # settling a SUCCEEDED job reads only MLflow
        cluster_name="h20x32",
        settings=None,
        client=client,
        uri="",
        experiment_id=experiment_id,
        tags={},
        console=Console(file=out, width=200),
    )
    return runner, out


def _job(client, experiment_id, tries_left: int, index: int) -> TrialJob:
    trial = load_registry(ROOT).expand("main-figure", backend="verl")[index]
    run = TrialRun.start_or_resume(client, experiment_id, trial, {}, log_params=False)
    job = TrialJob(trial, [], 8, tries_left=tries_left, attempts={1}, run_id=run.run_id)
    job.sid, job.state = f"pdm-main-figure-{trial.trial_hash}-a1", "active"
    return job


def _succeeded(job: TrialJob) -> JobView:
    return JobView(job.sid, "SUCCEEDED", job.run_id, "", 0, None)


def test_success_without_metrics_is_a_failed_attempt(store):
    client, exp = store
    runner, out = _runner(client, exp)
    job = _job(client, exp, tries_left=1, index=0)
    runner._settle(job, _succeeded(job))
    assert job.state == "queued" and "retrying" in out.getvalue()
    run = client.get_run(job.run_id)
    assert run.info.status == "FAILED"  # until the retry resumes it
    assert "SUCCEEDED, but its MLflow run has no metrics" in run.data.tags["pdm.failure_reason"]
    job.tries_left, job.state = 0, "active"
    client.update_run(job.run_id, status="RUNNING")
    runner._settle(job, _succeeded(job))
    assert job.state == "failed" and "no retries left" in out.getvalue()
    assert len(json.loads(client.get_run(job.run_id).data.tags["pdm.failures"])) == 2


def test_success_with_metrics_finishes_the_run_and_says_who(store):
    client, exp = store
    runner, _ = _runner(client, exp)
    job = _job(client, exp, tries_left=0, index=1)
    client.log_metric(job.run_id, "val-core/aime24/acc/mean_at_16", 0.3, step=0)
    runner._settle(job, _succeeded(job))
    run = client.get_run(job.run_id)
    assert job.state == "finished" and run.info.status == "FINISHED"
    assert "SUCCEEDED" in run.data.tags["pdm.finished_by"]


def test_success_with_a_failed_run_keeps_the_run_s_reason(store):
    client, exp = store
    runner, _ = _runner(client, exp)
    job = _job(client, exp, tries_left=0, index=2)
    client.set_tag(job.run_id, "pdm.failure_reason", "ValueError: from the trainer")
    client.set_terminated(job.run_id, status="FAILED")
    runner._settle(job, _succeeded(job))
    reason = client.get_run(job.run_id).data.tags["pdm.failure_reason"]
    assert job.state == "failed"
    assert "its MLflow run ended FAILED: ValueError: from the trainer" in reason
