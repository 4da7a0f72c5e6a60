"""Signals to a running sweep, sent to real processes: one exit code for "interrupted,
resumable", no process left behind (Ray's agents included), and the next run finishes the rest."""

from __future__ import annotations

import os
import signal
import time

import pytest

from . import procs
from .conftest import TWO_TRIALS, pdm, pdm_background, sweep_runs, write_sweep
from .test_sweep_runs import _pid_files, finished_exactly_once

pytestmark = [pytest.mark.slow, pytest.mark.processes]


def _ray_started(project, proc) -> bool:
    pids = procs.descendants(proc.pid) | procs.of_project(project)
    return any("gcs_server" in procs.command(p) for p in pids)


def _wait_for(condition, proc, timeout: float = 240) -> None:
    deadline = time.time() + timeout
    while not condition() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert proc.poll() is None, "the sweep ended before the signal"


# (signal, to whom, when) -> expected exit code. A terminal's Ctrl-C reaches the whole process
# group; SIGTERM and SIGKILL come from a process manager, to the driver only.
CASES = {
    "ctrl-c-while-ray-starts": (signal.SIGINT, "group", "ray", 130),
    "ctrl-c-while-training": (signal.SIGINT, "group", "training", 130),
    "sigterm-while-training": (signal.SIGTERM, "driver", "training", 130),
    "sigkill-while-training": (signal.SIGKILL, "driver", "training", -signal.SIGKILL),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_signal_leaves_no_process_and_the_sweep_resumes(project, case):
    sig, target, moment, expected = CASES[case]
    write_sweep(project, "two", TWO_TRIALS)
    proc = pdm_background(project, "sweep", "two", start_new_session=True)
    watch = procs.Watch(proc.pid)
    if moment == "ray":
        _wait_for(lambda: _ray_started(project, proc), proc)
    else:
        _wait_for(lambda: bool(_pid_files(project)), proc)  # a trial is starting to train
    if target == "group":
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    out, _ = proc.communicate(timeout=240)
    watch.stop()
    assert proc.returncode == expected, out
    assert "Traceback" not in out and "SIGSEGV" not in out, out
    assert not procs.survivors(project, watch), "processes outlived the sweep"  # agents included
    runs = sweep_runs(project, "two")
    if sig != signal.SIGKILL:  # a killed driver cannot mark its runs; the next run does
        assert all(r.info.status in ("FINISHED", "KILLED") for r in runs), out
    if moment == "ray":
        assert "interrupted" in out
        return
    again = pdm(project, "sweep", "two")
    assert again.returncode == 0, again.stdout + again.stderr
    finished_exactly_once(project, "two")


def test_an_ignored_sighup_stays_ignored_and_an_ignored_sigint_is_handled():
    """`nohup pdm sweep` asks the sweep to outlive its terminal; a background job's inherited
    SIGINT-ignore must not make Ctrl-C (or `kill -INT`) do nothing."""
    from pdmask.orchestration.interrupts import handled

    before = {s: signal.getsignal(s) for s in (signal.SIGHUP, signal.SIGINT)}
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with handled():
            assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
            assert callable(signal.getsignal(signal.SIGINT))
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN  # restored
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        with handled():  # a closed terminal stops the sweep like SIGTERM
            assert callable(signal.getsignal(signal.SIGHUP))
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
