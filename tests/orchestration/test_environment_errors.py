"""The machine's failures (full disk, unusable state folder) are one line and exit 2, not
hundreds of lines of tracebacks; ``PDM_DEBUG=1`` shows the traceback."""

from __future__ import annotations

import errno
import shutil
import sqlite3
import subprocess

import pytest

from pdmask.errors import TrackingError, environment_error

from . import procs
from .conftest import ONE_TRIAL, SLOW, pdm, pdm_background, write_sweep
from .test_signals import _wait_for
from .test_sweep_runs import _pid_files, finished_exactly_once

pytestmark = pytest.mark.processes


def test_each_machine_failure_says_what_to_do():
    full = environment_error(OSError(errno.ENOSPC, "No space left on device", "/x/mlflow.db"))
    assert "No space left on device (/x/mlflow.db): the disk is full" in full
    assert "run the same command again" in full
    assert "read-only" in environment_error(OSError(errno.EROFS, "Read-only file system"))
    assert environment_error(OSError(errno.ECONNRESET, "reset")) is None  # not the machine's


def _raised_from(cause: BaseException) -> BaseException:
    """An error of the store's own type raised from ``cause``, as MLflow's are from sqlite's."""
    try:
        try:
            raise cause
        except BaseException as err:
            raise TrackingError("store update failed") from err
    except TrackingError as outer:
        return outer


def test_sqlites_reports_of_the_same_failures_are_read_through_the_store_error():
    gone = environment_error(
        _raised_from(sqlite3.OperationalError("attempt to write a readonly database"))
    )
    assert "the tracking store cannot be written" in gone and "deleted" in gone
    full = environment_error(_raised_from(sqlite3.OperationalError("database or disk is full")))
    assert "the disk is full" in full
    assert environment_error(_raised_from(sqlite3.OperationalError("no such table: runs"))) is None
    assert environment_error(_raised_from(OSError(errno.ENOSPC, "No space left"))) is not None


@pytest.mark.slow
def test_a_state_folder_deleted_mid_sweep_is_one_line_and_the_same_command_runs_again(project):
    (project / "recipes" / "slow.py").write_text(SLOW)  # still training when the folder goes
    write_sweep(project, "two", ONE_TRIAL.replace("method: [pdm-agg]", "method: [slow]"))
    proc = pdm_background(project, "sweep", "two", start_new_session=True)
    watch = procs.Watch(proc.pid)
    _wait_for(lambda: bool(_pid_files(project)), proc)  # a trial is training
    # Renamed first so the folder is gone at once: a trial still writing into it would make a
    # plain rmtree race with it ("Directory not empty"). What it writes after that is litter.
    gone = project / "deleted-state"
    (project / ".pdm").rename(gone)
    shutil.rmtree(gone, ignore_errors=True)
    out, _ = proc.communicate(timeout=300)
    watch.stop()
    assert proc.returncode == 2, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "the tracking store cannot be written" in errors[0], out[-3000:]
    assert "retrying" not in out, out[-3000:]  # a retry would crash on the same store
    assert not procs.survivors(project, watch), "processes outlived the sweep"
    again = pdm(project, "sweep", "two", timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    finished_exactly_once(project, "two")


@pytest.mark.parametrize("args", [["sweep", "smoke", "--dry-run"], ["sweep", "smoke"]])
def test_a_state_folder_that_cannot_exist_is_one_line(project, args):
    unusable = {"PDM_HOME": "/dev/null/state"}
    out = pdm(project, *args, timeout=120, env=unusable)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Not a directory (/dev/null/state)" in lines[0], out.stderr
    debug = pdm(project, *args, timeout=120, env={**unusable, "PDM_DEBUG": "1"})
    assert debug.returncode != 0 and "Traceback" in debug.stderr


@pytest.fixture
def small_disk(project):
    """A 64 MB tmpfs of the test's own (root may mount one; elsewhere the test cannot run)."""
    mount = project / "disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mount)],
                          capture_output=True, text=True)  # fmt: skip
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to fill here: {made.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.slow
def test_a_disk_filled_mid_sweep_is_one_line_and_the_same_command_resumes(project, small_disk):
    (project / "recipes" / "slow.py").write_text(SLOW)  # still training when the disk fills
    write_sweep(project, "two", ONE_TRIAL.replace("method: [pdm-agg]", "method: [slow]"))
    state = {"PDM_HOME": str(small_disk / "state")}
    proc = pdm_background(project, "sweep", "two", env=state, start_new_session=True)
    watch = procs.Watch(proc.pid)
    trials = small_disk / "state" / "trials"
    _wait_for(lambda: trials.is_dir() and any(trials.glob("*/pid")), proc)  # a trial trains
    filler = small_disk / "filler"
    subprocess.run(
        ["dd", "if=/dev/zero", f"of={filler}", "bs=1M", "count=100"], capture_output=True
    )  # fmt: skip  (stops at the disk's end: ENOSPC)
    out, _ = proc.communicate(timeout=300)
    watch.stop()
    assert proc.returncode == 2, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "the disk is full" in errors[0], out[-3000:]
    assert str(small_disk / "state") in errors[0]  # names the folder that could not be written
    assert not procs.survivors(project, watch), "processes outlived the sweep"
    filler.unlink()
    again = pdm(project, "sweep", "two", timeout=300, env=state)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]


@pytest.mark.slow
def test_a_disk_full_before_the_sweep_is_one_line_and_nothing_starts(project, small_disk):
    write_sweep(project, "two", ONE_TRIAL)
    filler = small_disk / "filler"
    subprocess.run(
        ["dd", "if=/dev/zero", f"of={filler}", "bs=1M", "count=100"], capture_output=True
    )  # fmt: skip  (stops at the disk's end: ENOSPC)
    state = {"PDM_HOME": str(small_disk / "state")}
    out = pdm(project, "sweep", "two", timeout=300, env=state)
    assert out.returncode == 2, out.stdout[-3000:] + out.stderr[-3000:]
    assert "Traceback" not in out.stdout + out.stderr, out.stderr[-3000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "the disk is full" in errors[0], out.stderr[-3000:]
    left = {p.name for p in (small_disk / "state").glob("*")}
    assert "ray" not in left and "mlflow.db" not in left, left  # nothing started, no empty store
    filler.unlink()
    again = pdm(project, "sweep", "two", timeout=300, env=state)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "1 trials, 0 already finished, 1 to run" in again.stdout  # nothing half-written
