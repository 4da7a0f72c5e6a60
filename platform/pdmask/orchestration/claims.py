"""Exclusive claims on trials, so two `pdm sweep` invocations never run a trial twice.

A claim is an ``flock`` on ``<state>/claims/<trial hash>.lock`` held by the process that trains the
trial. The kernel drops it when that process exits for any reason (finished, crashed, killed), so
a claim never outlives its owner and needs no heartbeat. Claims are as wide as the state folder:
on a multi-node Ray cluster running the embedded backend, put ``PDM_HOME`` on a shared filesystem.

A sweep that settles its trials' final states also takes the claim (briefly, for a few store
calls) before it marks a RUNNING run KILLED, so it can never overwrite the state of a run another
invocation is finishing at that moment. That is why taking a claim waits a little before giving
up: a claim held for a moment by a settling sweep is not a trial running elsewhere.

The claim file names its holder's experiment (``claim_holder``): two *different* sweeps that share
a trial (same hash, so the same checkpoint folder) each need a run of it in their own experiment;
the second waits for the first to release the trial, then trains its own (``tune/trainable.py``).
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from pdmask.paths import state_dir

# Longer than a settling sweep holds a claim (a few sqlite calls), far shorter than any trial.
WAIT_SECONDS = 5.0


def _claim_file(trial_hash: str) -> Path:
    return state_dir() / "claims" / f"{trial_hash}.lock"


def claim_path(trial_hash: str) -> Path:
    """The trial's claim file, its folder made."""
    path = _claim_file(trial_hash)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


class Claim:
    """``with Claim(h) as ok:`` — ``ok`` is False when another live process holds the trial.

    ``wait``: seconds to keep trying before deciding the trial is held elsewhere.
    """

    def __init__(self, trial_hash: str, wait: float = WAIT_SECONDS, holder: str = ""):
        self.path = claim_path(trial_hash)
        self.wait = wait
        self.holder = holder  # the experiment the claimant trains the trial into
        self.fd: int | None = None

    def __enter__(self) -> bool:
        return self.take()

    def take(self) -> bool:
        """Take the claim (True), or find it held by another live process for ``wait`` s."""
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
        os.write(fd, f"{os.getpid()} {self.holder}".strip().encode())
        return True

    def __exit__(self, *exc) -> None:
        self.release()

    def release(self) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def claim_holder(trial_hash: str) -> str | None:
    """The experiment the current holder of a trial's claim trains it into (None: unknown, e.g.
    an older pdm's claim or one being written right now)."""
    try:
        parts = claim_path(trial_hash).read_text().split()
    except OSError:
        return None
    return parts[1] if len(parts) > 1 else None


def claim_held(trial_hash: str) -> bool:
    """Whether a live process holds the trial's claim right now; takes nothing, writes nothing
    (the dry run asks it of a RUNNING run: a SIGKILLed sweep leaves its runs RUNNING)."""
    try:
        fd = os.open(_claim_file(trial_hash), os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)
