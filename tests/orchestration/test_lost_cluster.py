"""A sweep whose raylet dies ends within a bound with one line, leaves nothing running, and the
same command resumes it. Before the cluster watch, Tune looped on "Cluster resources not
detected" for as long as one waited, its trial processes orphaned."""

from __future__ import annotations

import os
import signal
import time

import pytest

from . import procs
from .conftest import ONE_TRIAL, SLOW, pdm, pdm_background, sweep_runs, write_sweep
from .test_signals import _wait_for
from .test_sweep_runs import _pid_files, finished_exactly_once

pytestmark = [pytest.mark.slow, pytest.mark.processes]

# Ray marks a dead raylet's node dead after ~20 s of missed health checks; the watch then waits
# NO_NODE_S (10 s) and the sweep settles its runs: well inside this.
ENDS_WITHIN_S = 120


def _raylet(pids: set[int]) -> int | None:
    return next((p for p in pids if "raylet/raylet" in procs.command(p)), None)


def test_a_lost_raylet_ends_the_sweep_and_the_same_command_resumes_it(project):
    (project / "recipes" / "slow.py").write_text(SLOW)  # still training when the raylet dies
    write_sweep(project, "two", ONE_TRIAL.replace("method: [pdm-agg]", "method: [slow]"))
    proc = pdm_background(project, "sweep", "two", start_new_session=True)
    watch = procs.Watch(proc.pid)
    _wait_for(lambda: bool(_pid_files(project)), proc)  # a trial is training
    raylet = _raylet(procs.descendants(proc.pid))
    assert raylet, "no raylet among the sweep's processes"
    os.kill(raylet, signal.SIGKILL)
    killed = time.monotonic()
    out, _ = proc.communicate(timeout=ENDS_WITHIN_S + 60)
    took = time.monotonic() - killed
    watch.stop()
    assert proc.returncode == 1, out
    assert took < ENDS_WITHIN_S, f"the sweep took {took:.0f} s to end"
    text = " ".join(out.split())
    assert "sweep stopped: the Ray cluster has no live node" in text, out[-3000:]
    assert "run the same command again to resume" in text
    assert not procs.survivors(project, watch), "processes outlived the sweep"
    assert all(r.info.status in ("FINISHED", "KILLED") for r in sweep_runs(project, "two"))
    again = pdm(project, "sweep", "two")
    assert again.returncode == 0, again.stdout + again.stderr
    finished_exactly_once(project, "two")
    print(f"the sweep ended {took:.0f} s after its raylet was killed")
