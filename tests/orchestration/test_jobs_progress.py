"""The job loop's progress line (``orchestration/jobs/progress.py``): each running job's steps
read from its run in a real sqlite MLflow store, a retried attempt's steps told apart, the line
printed when the counts change and on the heartbeat, its ETA the one rule's (``eta.py``)
hand-computed. The job loop itself printing it against a real local Ray head:
``tests/library/test_job_backend.py``."""

from __future__ import annotations

import pytest

from pdmask.orchestration.canary import TRAINING_METRIC
from pdmask.orchestration.eta import Capacity, Planned
from pdmask.orchestration.jobs.job_loop import TrialJob
from pdmask.orchestration.jobs.progress import JobsProgress
from pdmask.orchestration.progress_view import HEARTBEAT_S, duration
from pdmask.registry import load_registry

T0 = 1_800_000_000.0  # wall-clock seconds, as MLflow's timestamps are


class Clock:
    def __init__(self):
        self.now = T0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def store(tmp_path):
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    return client, client.create_experiment("jobs")


def _log_steps(client, run_id: str, steps: range, at: float, every: float) -> None:
    for i, step in enumerate(steps):
        stamp = int((T0 + at + i * every) * 1000)
        client.log_metric(run_id, TRAINING_METRIC, 0.5, timestamp=stamp, step=step)


def test_the_line_follows_the_jobs_steps_in_mlflow_and_prints_on_change_and_heartbeat(
    project, store
):
    client, experiment = store
    trials = load_registry(project).expand("main-figure", backend="verl")[:2]
    plans = {
        t.trial_hash: Planned("c", steps=100, width=8, step_s=20.0, startup_s=100.0) for t in trials
    }
    clock, lines = Clock(), []
    progress = JobsProgress("main-figure", client, plans, Capacity(8), lines.append, clock=clock)
    first, second = (TrialJob(t, gpus=8, tries_left=2) for t in trials)
    jobs = [first, second]
    run_id = client.create_run(experiment).info.run_id
    first.state, first.run_id = "active", run_id
    progress.submitted(first.trial.trial_hash)

    progress.tick(jobs)  # submitted at T0: nothing measured, the plan's prices
    # the first: 100 s + 100 x 20 s = 2100 s; the second after it on the 8 GPUs: 4200 s
    assert lines[-1].endswith("0/2 done, 1 running, 0 failed, 1 queued; elapsed 0s, ETA 1h10m")
    clock.now = T0 + HEARTBEAT_S - 1
    progress.tick(jobs)
    assert len(lines) == 1  # nothing changed, not due

    _log_steps(client, run_id, range(1, 12), at=50.0, every=10.0)  # steps 1..11 at 50..150 s
    clock.now = T0 + 150.0
    progress.tick(jobs)
    # its own rate, 10 s a step: 89 steps left, 890 s; the second: the measured start-up (50 s)
    # and its cell's measured 10 s a step, 1050 s after: 1940 s
    assert len(lines) == 2 and lines[-1].endswith("elapsed 2m30s, ETA 32m20s")

    first.state = "queued"  # the attempt failed: to be retried, still counted as running
    clock.now = T0 + 200.0
    progress.tick(jobs)  # the same counts, but the heartbeat is due (150 + 45 s)
    # nothing of the next attempt measured: the plan's 100 s + 89 steps left x 20 s, then the
    # second's 2100 s
    assert lines[-1].endswith("0/2 done, 1 running, 0 failed, 1 queued; elapsed 3m20s, ETA 1h06m")
    clock.now = T0 + 201.0
    first.state = "active"  # resubmitted at 201 s; it resumes from step 11, logged at 260 s
    progress.submitted(first.trial.trial_hash)
    progress.tick(jobs)
    _log_steps(client, run_id, range(11, 13), at=260.0, every=10.0)
    clock.now = T0 + 240.0
    progress.tick(jobs)  # the counts are the same and the heartbeat not due (245 s): no line
    assert len(lines) == 3
    clock.now = T0 + 315.0
    progress.tick(jobs)
    # this attempt only: step 11 at 260 s, step 12 at 270 s; at 315 s its rate is 55 s a step
    # (a step in progress counts): 88 steps left; the second: this attempt's start-up (59 s)
    # and 100 steps at the cell's 55 s
    assert len(lines) == 4 and lines[-1].endswith(f"ETA {duration(88 * 55 + 59 + 100 * 55)}")

    first.state = "finished"
    second.state, second.run_id = "active", client.create_run(experiment).info.run_id
    progress.submitted(second.trial.trial_hash)
    progress.tick(jobs)
    assert "1/2 done, 1 running, 0 failed, 0 queued" in lines[-1]
    second.state = "finished"
    progress.tick(jobs)
    assert lines[-1].endswith("2/2 done, 0 running, 0 failed, 0 queued; elapsed 5m15s, ETA 0s")
