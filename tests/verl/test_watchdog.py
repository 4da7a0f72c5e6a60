"""The VeRL job's watchdog: when a job that stopped making progress is ended, and how.

The decisions run on a fake clock (no waiting); the fault action runs for real in a subprocess
against a sqlite MLflow store: the process must end non-zero with the run FAILED and the reason
in its tags. The dead-engine check is exercised end to end in ``tests/verl_cpu`` (a real vLLM
engine core killed mid-trial).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from pdmask.backends.verl.jobs import STALL_FLOOR_SECONDS, STALL_STEPS, watchdog_bounds, workload
from pdmask.backends.verl.jobs_setup import JobSettings
from pdmask.backends.verl.watchdog import JobWatchdog
from pdmask.registry import CLUSTERS
from pdmask.registry.cost import trial_cost
from pdmask.watchdog import WATCHDOG_ENV, WATCHDOG_TAG, Bounds


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _watchdog(clock, startup=100.0, stall=50.0) -> JobWatchdog:
    return JobWatchdog(Bounds(startup, stall), lambda: [], lambda reason: None, clock=clock)


def test_start_up_may_take_its_bound_then_is_a_stall():
    clock = Clock()
    dog = _watchdog(clock)
    clock.now += 100.0
    assert dog.fault() is None
    clock.now += 0.5
    reason = dog.fault()
    assert reason and "start-up bound" in reason and "100 s" in reason


def test_each_beat_restarts_the_stall_bound_and_the_reason_names_the_last_progress():
    clock = Clock()
    dog = _watchdog(clock)
    clock.now += 90.0
    dog.beat("step 1")
    clock.now += 50.0
    assert dog.fault() is None  # 140 s after the start, but 50 s after a beat
    dog.beat("step 2")
    clock.now += 60.0
    reason = dog.fault()
    assert reason and "after step 2" in reason and "stall bound 50 s" in reason


def test_the_thread_calls_the_fault_action_once():
    faults: list[str] = []
    done = threading.Event()

    def on_fault(reason):
        faults.append(reason)
        done.set()

    dog = JobWatchdog(Bounds(0.05, 0.05, poll_seconds=0.02), lambda: [], on_fault).start()
    assert done.wait(5), "the watchdog never fired"
    dog._thread.join(5)
    assert len(faults) == 1 and "start-up" in faults[0]


def test_bounds_travel_in_the_job_env():
    bounds = Bounds(900.0, 600.0, poll_seconds=5.0)
    assert Bounds.from_env({WATCHDOG_ENV: bounds.to_env()}) == bounds
    assert Bounds.from_env({}) is None  # a job without bounds runs unwatched


def test_bounds_follow_the_profile_and_the_models_step_time():
    class Trial:
        model = "qwen3-30b-a3b-base"
        precision = "bf16"
        steps = None

    bounds = watchdog_bounds(Trial, "h20x32")
    cost = trial_cost(Trial.model, "h20x32", workload(Trial, "h20x32"))
    one_save = cost.save_seconds / 15  # 300 steps, a save every 20
    assert bounds.stall_seconds == pytest.approx(STALL_STEPS * cost.step_seconds + one_save)
    assert bounds.stall_seconds > STALL_FLOOR_SECONDS
    assert bounds.startup_seconds == CLUSTERS["h20x32"].job_startup_seconds
    Trial.model = "qwen3-tiny"
    tiny = watchdog_bounds(Trial, "this-machine")
    assert tiny.stall_seconds == STALL_FLOOR_SECONDS  # 3 s steps: the floor decides
    assert tiny.startup_seconds == CLUSTERS["this-machine"].job_startup_seconds < 3600
    site = JobSettings.from_env({"PDM_STALL_SECONDS": "300", "PDM_STARTUP_SECONDS": "120"})
    assert watchdog_bounds(Trial, "this-machine", site) == Bounds(120.0, 300.0)


FAULT = """
import mlflow, os, threading, time
from pdmask.backends.verl import watchdog
from pdmask.watchdog import Bounds
run = mlflow.MlflowClient().create_run(mlflow.MlflowClient().create_experiment("w"))
os.environ["MLFLOW_RUN_ID"] = run.info.run_id
print(run.info.run_id, flush=True)
dog = watchdog.JobWatchdog(
    Bounds(0.1, 0.1, poll_seconds=0.05), lambda: [], watchdog.end_job
).start()
time.sleep(60)  # a job stuck waiting: only the watchdog ends this process
raise SystemExit(0)
"""


def test_a_fault_ends_the_process_with_the_run_failed_and_the_reason_tagged(tmp_path):
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    done = subprocess.run(
        [sys.executable, "-c", FAULT], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1, done.stderr[-2000:]
    assert "pdmask watchdog: ending: stalled" in done.stderr
    run = mlflow.MlflowClient(uri).get_run(done.stdout.split()[0])
    assert run.info.status == "FAILED"
    assert run.data.tags[WATCHDOG_TAG].startswith("stalled:")
    assert run.data.tags["pdm.failure_reason"] == run.data.tags[WATCHDOG_TAG]


def _failed_run(tmp_path, monkeypatch, cause):
    """A job's run after ``failure_marked(cause)`` saw the trainer raise."""
    import mlflow
    import pytest

    from pdmask.backends.verl import tracking

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    run = client.create_run(client.create_experiment("w", artifact_location=str(tmp_path / "a")))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_RUN_ID", run.info.run_id)
    with pytest.raises(RuntimeError), tracking.failure_marked(cause):
        raise RuntimeError("replay buffer: no batch (its rollout raised)")
    return client.get_run(run.info.run_id)


def test_a_trainer_failure_after_an_engine_death_names_the_engine(tmp_path, monkeypatch):
    """verl's own error after an engine dies depends on where its loop was; the watchdog's
    probe, asked when the trainer fails, names the cause whichever side noticed first."""
    dead = "vLLM engine failed: vLLM's engine core is dead (EngineDeadError)"
    dog = JobWatchdog(Bounds(100.0, 50.0), lambda: [], lambda reason: None)
    dog.probe = lambda: dead
    run = _failed_run(tmp_path, monkeypatch, dog.cause)
    assert run.info.status == "FAILED"
    assert run.data.tags[WATCHDOG_TAG] == f"{dead} (found when the trainer failed)"
    assert "replay buffer: no batch" in run.data.tags["pdm.failure_reason"]


def test_a_trainer_failure_with_healthy_engines_or_a_failing_probe_is_its_own(
    tmp_path, monkeypatch
):
    dog = JobWatchdog(Bounds(100.0, 50.0), lambda: [], lambda reason: None)
    assert dog.cause() is None  # no servers yet: nothing is wrong with them

    def unreachable():
        raise ConnectionError("the server actor does not answer")

    dog.probe = unreachable
    assert dog.cause() is None
    run = _failed_run(tmp_path, monkeypatch, dog.cause)
    assert run.info.status == "FAILED" and WATCHDOG_TAG not in run.data.tags
    assert "replay buffer: no batch" in run.data.tags["pdm.failure_reason"]
