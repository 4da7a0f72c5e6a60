"""Exclusive claims on trials, so two `pdm sweep` invocations never run a trial twice.

A claim is an ``flock`` on ``<state>/claims/<trial hash>.lock`` held by the process that trains the
trial. The kernel drops it when that process exits for any reason (finished, crashed, killed), so
a claim never outlives its owner and needs no heartbeat. Claims are as wide as the state folder:
on a multi-node Ray cluster running the embedded backend, put ``PDM_HOME`` on a shared filesystem.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from pdmask.paths import state_dir


def claim_path(trial_hash: str) -> Path:
    folder = state_dir() / "claims"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{trial_hash}.lock"


class Claim:
    """``with Claim(h) as ok:`` — ``ok`` is False when another live process holds the trial."""

    def __init__(self, trial_hash: str):
        self.path = claim_path(trial_hash)
        self.fd: int | None = None

    def __enter__(self) -> bool:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.fd)
            self.fd = None
            return False
        os.ftruncate(self.fd, 0)
        os.write(self.fd, str(os.getpid()).encode())
        return True

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def is_claimed(trial_hash: str) -> bool:
    """True while some live process holds the trial's claim."""
    path = claim_path(trial_hash)
    if not path.exists():
        return False
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)
