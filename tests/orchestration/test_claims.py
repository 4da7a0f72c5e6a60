"""Claims and the end-of-sweep settle: no trial run twice, no state overwritten from a stale read."""

from __future__ import annotations

import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
from rich.console import Console

from pdmask.orchestration import session as runner
from pdmask.orchestration.claims import Claim, claim_path
from pdmask.orchestration.options import SweepOptions

pytestmark = pytest.mark.processes

HOLD = """
import sys, time
from pdmask.orchestration.claims import Claim
with Claim(sys.argv[1]) as ok:
    print("held" if ok else "refused", flush=True)
    time.sleep(float(sys.argv[2]))
"""


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("PDM_HOME", str(tmp_path / ".pdm"))
    return tmp_path


def hold_in_other_process(trial_hash: str, seconds: float) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, trial_hash, str(seconds)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_claim_held_by_a_live_process_is_refused_then_free_after_it_exits(state):
    other = hold_in_other_process("abc", 30)
    try:
        with Claim("abc", wait=0.2) as ok:
            assert ok is False
    finally:
        other.kill()
        other.wait()
    with Claim("abc", wait=0) as ok:  # the kernel dropped the dead process's lock
        assert ok is True
        assert claim_path("abc").read_text().strip().isdigit()


def test_claim_held_for_a_moment_is_waited_for(state):
    other = hold_in_other_process("abc", 0.5)
    started = time.monotonic()
    with Claim("abc", wait=10) as ok:
        assert ok is True
    assert time.monotonic() - started < 10
    other.wait()


class Store:
    """The few MLflow calls `settle` makes, over a store whose snapshot can be stale."""

    def __init__(self, snapshot_status: str, live_status: str):
        self.snapshot, self.live, self.terminated = snapshot_status, live_status, []

    def run(self, status: str):
        return SimpleNamespace(
            info=SimpleNamespace(status=status, run_id="r1"),
            data=SimpleNamespace(tags={"pdm.trial_hash": "abc"}, metrics={}),
        )

    def set_terminated(self, run_id, status):
        self.terminated.append(status)
        self.live = status


def settle(store: Store, monkeypatch):
    monkeypatch.setattr(runner, "runs_by_hash", lambda c, e: {"abc": [store.run(store.snapshot)]})
    monkeypatch.setattr(
        "pdmask.tracking.runs.find_trial_runs", lambda c, e, h: [store.run(store.live)]
    )
    sweep = SimpleNamespace(search=None, cluster="this-machine", max_concurrent=None)
    trials = [SimpleNamespace(trial_hash="abc", backend="sim")]
    session = runner.SweepSession(
        reg=None,
        sweep=sweep,
        trials=trials,
        options=SweepOptions(),
        client=store,
        uri="",
        experiment_id="1",
        tags={},
        console=Console(quiet=True),
        interrupts=None,
        started=0.0,
    )
    return session.settle(0)


def test_settle_never_kills_a_run_that_finished_after_the_snapshot(state, monkeypatch):
    store = Store(snapshot_status="RUNNING", live_status="FINISHED")
    outcome = settle(store, monkeypatch)
    assert store.terminated == [] and outcome.finished == 1 and outcome.interrupted == 0


def test_settle_marks_an_orphaned_running_run_killed(state, monkeypatch):
    store = Store(snapshot_status="RUNNING", live_status="RUNNING")
    outcome = settle(store, monkeypatch)
    assert store.terminated == ["KILLED"] and outcome.interrupted == 1


def test_settle_leaves_a_run_claimed_by_another_invocation_alone(state, monkeypatch):
    other = hold_in_other_process("abc", 30)
    try:
        store = Store(snapshot_status="RUNNING", live_status="RUNNING")
        outcome = settle(store, monkeypatch)
    finally:
        other.kill()
        other.wait()
    assert store.terminated == [] and outcome.elsewhere == 1


def test_the_dry_run_shows_a_killed_sweeps_running_trial_as_interrupted(project, monkeypatch):
    """A SIGKILLed sweep leaves its run RUNNING; only a live claim makes it `running`."""
    import json

    from .conftest import ONE_TRIAL, pdm, store_client, write_sweep

    write_sweep(project, "one", ONE_TRIAL)
    (row,) = json.loads(pdm(project, "sweep", "one", "--dry-run", "--json").stdout)["trials"]
    client = store_client(project)
    experiment = client.create_experiment("one")
    client.create_run(experiment, tags={"pdm.trial_hash": row["trial_hash"]})  # left RUNNING

    def status() -> str:
        out = pdm(project, "sweep", "one", "--dry-run", "--json")
        return json.loads(out.stdout)["trials"][0]["status"]

    assert status() == "interrupted"
    monkeypatch.setenv("PDM_HOME", str(project / ".pdm"))
    other = hold_in_other_process(row["trial_hash"], 60)
    try:
        assert status() == "running"
    finally:
        other.kill()
        other.wait()
    written = claim_path(row["trial_hash"]).read_text()
    assert status() == "interrupted"
    assert claim_path(row["trial_hash"]).read_text() == written  # the dry run writes nothing
