"""Exclusive claims on trials, so two `pdm sweep` invocations never run a trial twice.

A claim is an ``flock`` on ``<state>/claims/<trial hash>.lock`` held by the process that trains the
trial. The kernel drops it when that process exits for any reason (finished, crashed, killed), so
a claim never outlives its owner and needs no heartbeat. Claims are as wide as the state folder:
on a multi-node Ray cluster running the embedded backend, put ``PDM_HOME`` on a shared filesystem.

A sweep that settles its trials' final states also takes the claim (briefly, for a few store
calls) before it marks a RUNNING run KILLED, so it can never overwrite the state of a run another
invocation is finishing at that moment. That is why taking a claim waits a little before giving
up: a claim held for a moment by a settling sweep is not a trial running elsewhere.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from pdmask.paths import state_dir

# Longer than a settling sweep holds a claim (a few sqlite calls), far shorter than any trial.
WAIT_SECONDS = 5.0


def claim_path(trial_hash: str) -> Path:
    folder = state_dir() / "claims"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{trial_hash}.lock"


class Claim:
    """``with Claim(h) as ok:`` — ``ok`` is False when another live process holds the trial.

    ``wait``: seconds to keep trying before deciding the trial is held elsewhere.
    """

    def __init__(self, trial_hash: str, wait: float = WAIT_SECONDS):
        self.path = claim_path(trial_hash)
        self.wait = wait
        self.fd: int | None = None

    def __enter__(self) -> bool:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self.wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    return False
                time.sleep(0.05)
        self.fd = fd
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        return True

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None
