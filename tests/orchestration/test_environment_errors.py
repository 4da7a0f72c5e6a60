"""The machine's failures (full disk, unusable state folder) are one line and exit 2, not
hundreds of lines of tracebacks; ``PDM_DEBUG=1`` shows the traceback."""

from __future__ import annotations

import errno

import pytest

from pdmask.errors import environment_error

from .conftest import pdm

pytestmark = pytest.mark.processes


def test_each_machine_failure_says_what_to_do():
    full = environment_error(OSError(errno.ENOSPC, "No space left on device", "/x/mlflow.db"))
    assert "No space left on device (/x/mlflow.db): the disk is full" in full
    assert "run the same command again" in full
    assert "read-only" in environment_error(OSError(errno.EROFS, "Read-only file system"))
    assert environment_error(OSError(errno.ECONNRESET, "reset")) is None  # not the machine's


@pytest.mark.parametrize("args", [["sweep", "smoke", "--dry-run"], ["sweep", "smoke"]])
def test_a_state_folder_that_cannot_exist_is_one_line(project, args):
    unusable = {"PDM_HOME": "/dev/null/state"}
    out = pdm(project, *args, timeout=120, env=unusable)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Not a directory (/dev/null/state)" in lines[0], out.stderr
    debug = pdm(project, *args, timeout=120, env={**unusable, "PDM_DEBUG": "1"})
    assert debug.returncode != 0 and "Traceback" in debug.stderr
