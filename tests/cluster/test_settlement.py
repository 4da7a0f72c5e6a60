"""How a job's run and outcome are written to MLflow (a real sqlite store; the cluster's answers,
where a test needs one, are given by the test)."""

from __future__ import annotations

import io
import json

import pytest
from mlflow.entities import Metric
from rich.console import Console

from pdmask.backends.interface import load_backend
from pdmask.orchestration.interrupts import Interrupts
from pdmask.orchestration.jobs.cluster import JobView
from pdmask.orchestration.jobs.job_loop import JobRunner, TrialJob
from pdmask.orchestration.options import SweepOptions
from pdmask.orchestration.session import SweepSession
from pdmask.registry import load_registry
from pdmask.tracking import TrialRun, runs_by_hash
from pdmask.tracking.completeness import Plan
from tests.cluster.conftest import ROOT

pytestmark = pytest.mark.processes


@pytest.fixture(scope="module")
def store(main_figure_store):
    return main_figure_store


def _runner(client, experiment_id) -> tuple[JobRunner, io.StringIO]:
    out = io.StringIO()
    session = SweepSession(
        reg=None,
        sweep=load_registry(ROOT).sweeps["main-figure"],  # its cluster: what a run must hold
        trials=[],
        options=SweepOptions(),
        client=client,
        uri="",
        experiment_id=experiment_id,
        tags={},
        console=Console(file=out, width=200),
        interrupts=Interrupts(),
        started=0.0,
    )
    runner = JobRunner(
        session,
        cluster=None,  # settling a SUCCEEDED job reads only MLflow
        batch=None,  # nor does it build a job
    )
    return runner, out


def _job(client, experiment_id, tries_left: int, index: int) -> TrialJob:
    trial = load_registry(ROOT).expand("main-figure", backend="verl")[index]
    run = TrialRun.start_or_resume(client, experiment_id, trial, {}, log_params=False)
    job = TrialJob(trial, 8, tries_left=tries_left, attempts={1}, run_id=run.run_id)
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


def _log_until(client, runner, job, last: int, validations=None) -> None:
    """What a verl job logs: a training metric per step up to ``last``, each evaluation metric
    at ``validations`` (the plan's: before training and at the planned last step)."""
    plan = _plan(runner, job)
    steps = [Metric("training/global_step", s, 0, s) for s in range(1, last + 1)]
    checks = [
        Metric(m, 0.3, 0, s)
        for m in plan.eval_metrics
        for s in (plan.validations if validations is None else validations)
    ]
    client.log_batch(job.run_id, metrics=steps + checks)


def _plan(runner, job) -> Plan:
    backend = load_backend("verl")
    return Plan.of(backend.planned_steps(job.trial), backend.eval_metrics(runner.session.cluster))


def test_success_with_a_complete_run_finishes_it_and_says_who(store):
    client, exp = store
    runner, _ = _runner(client, exp)
    job = _job(client, exp, tries_left=0, index=1)
    _log_until(client, runner, job, _plan(runner, job).last_step)
    runner._settle(job, _succeeded(job))
    run = client.get_run(job.run_id)
    assert job.state == "finished" and run.info.status == "FINISHED"
    assert "SUCCEEDED" in run.data.tags["pdm.finished_by"]


@pytest.mark.parametrize("closed", ["FINISHED", "RUNNING"])
def test_a_run_whose_metrics_stop_early_is_not_finished(store, closed):
    """verl's MLflow adapter drops a step's metrics after three failed writes, trains on and its
    TaskRunner closes the run FINISHED: the job SUCCEEDED, but the run stops before the planned
    last step. It is a failed attempt naming the gap (retried), never FINISHED."""
    client, exp = store
    runner, out = _runner(client, exp)
    job = _job(client, exp, tries_left=1, index=6 if closed == "FINISHED" else 7)
    last = _plan(runner, job).last_step
    _log_until(client, runner, job, last // 2, validations=[0])
    client.set_terminated(job.run_id, status=closed)
    runner._settle(job, _succeeded(job))
    run = client.get_run(job.run_id)
    assert job.state == "queued" and "retrying" in out.getvalue()
    assert run.info.status == "FAILED"
    assert run.data.tags["pdm.failure_kind"] == "incomplete"
    assert (
        f"its metrics stop at step {last // 2}, before the planned last step {last}"
        in run.data.tags["pdm.failure_reason"]
    )
    assert "pdm.finished_by" not in run.data.tags


def test_a_run_without_its_last_validation_is_not_finished(store):
    """Every step trained and logged, but the validation at the last step never reached the run:
    its curves would end before the result the figure reads."""
    client, exp = store
    runner, _ = _runner(client, exp)
    job = _job(client, exp, tries_left=0, index=8)
    plan = _plan(runner, job)
    _log_until(client, runner, job, plan.last_step, validations=[0])
    client.set_terminated(job.run_id, status="FINISHED")
    runner._settle(job, _succeeded(job))
    run = client.get_run(job.run_id)
    assert job.state == "failed" and run.info.status == "FAILED"
    reason = run.data.tags["pdm.failure_reason"]
    assert "its planned validations are missing" in reason
    assert all(f"{m} at step {plan.last_step}" in reason for m in plan.eval_metrics)


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


class _SubmittedFirst:
    """A cluster on which another invocation submitted the attempt first, logging to ``run_id``
    (the job API refuses the second submission: ``JobCluster.submit`` returns True)."""

    address = "http://127.0.0.1:8265"

    def __init__(self, run_id: str):
        self.run_id = run_id

    def submit(self, spec, metadata) -> bool:
        return True

    def view(self, sid: str) -> JobView:
        return JobView(sid, "RUNNING", self.run_id, "", None, None)


def test_two_submitters_of_one_attempt_leave_one_run_and_no_orphan(store, monkeypatch):
    """Both invocations found no run and created one; the other one's job went in first: ours is
    deleted and the job's run is the trial's, so no run stays RUNNING without a job."""
    monkeypatch.setenv("PDM_VERL_CHECKPOINT_DIR", "/shared/ckpt")
    client, exp = store
    reg = load_registry(ROOT)
    sweep, trial = reg.sweeps["main-figure"], reg.expand("main-figure", backend="verl")[3]
    theirs = TrialRun.start_or_resume(client, exp, trial, {}, log_params=False)
    runner, out = _runner(client, exp)
    runner.cluster, runner.session.sweep = _SubmittedFirst(theirs.run_id), sweep
    runner.batch = load_backend("verl").job_batch(
        reg, sweep, [trial], cluster="h20x32", tracking_uri=""
    )
    job = TrialJob(trial, 8, tries_left=2)
    ours = client.create_run(exp, tags={**trial.tags(), "pdm.attempts": "1"})  # the race's run
    monkeypatch.setattr(
        TrialRun,
        "start_or_resume",
        classmethod(lambda cls, *a, **k: cls(client, ours.info.run_id, -1, 1, resumed=False)),
    )
    runner._submit(job)
    assert job.state == "active" and job.run_id == theirs.run_id
    assert "submitted by another invocation" in out.getvalue()
    assert client.get_run(ours.info.run_id).info.lifecycle_stage == "deleted"
    kept = runs_by_hash(client, exp)[trial.trial_hash]
    assert [r.info.run_id for r in kept] == [theirs.run_id]


def test_a_resumed_run_continues_after_its_last_logged_step_whatever_its_tag_says(store):
    """The store commits a batch's metrics and the ``pdm.last_step`` tag in two transactions: a
    process killed between them leaves the tag behind. The next attempt must not log that step
    again (seen: a SIGKILLed sweep's validation at steps 0, 0, 2, 4)."""
    client, exp = store
    trial = load_registry(ROOT).expand("main-figure")[5]
    run = TrialRun.start_or_resume(client, exp, trial, {}, log_params=False)
    assert run.log(0, {"val-core/a/acc": 0.1}) and run.log(2, {"val-core/a/acc": 0.2})
    client.log_metric(run.run_id, "val-core/a/acc", 0.3, step=4)  # committed; then the kill
    client.set_terminated(run.run_id, status="KILLED")
    assert client.get_run(run.run_id).data.tags["pdm.last_step"] == "2"
    again = TrialRun.start_or_resume(client, exp, trial, {}, log_params=False)
    assert again.run_id == run.run_id and again.last_step == 4
    assert not again.log(4, {"val-core/a/acc": 0.3})  # not twice
    assert again.log(6, {"val-core/a/acc": 0.4})
    steps = [m.step for m in client.get_metric_history(run.run_id, "val-core/a/acc")]
    assert steps == [0, 2, 4, 6]
