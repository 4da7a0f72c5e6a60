"""The reaper: kills an embedded Ray instance's processes when the sweep driver that owns it ends.

Ray ties its GCS and raylet to the driver, but not everything they start: after a SIGKILL of the
driver its dashboard and runtime-env agents live on, still listening. So the driver starts this
small process first, in a session of its own (a terminal's Ctrl-C does not reach it), with the
read end of a pipe whose write end only the driver holds. The kernel closes that end when the
driver exits, however it exits; the read then returns and the reaper kills every process marked
as this instance's: their environment carries ``PDM_RAY_OWNER=<token>``, which the driver set
before starting Ray and every process of the instance inherits. The mark, unlike a process tree,
survives re-parenting and catches processes started a moment before the driver died.

    python -m pdmask.orchestration.reaper TOKEN     # stdin: the pipe; normally started for you
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

OWNER_ENV = "PDM_RAY_OWNER"
GRACE_SECONDS = 5.0  # SIGTERM first (Ray's processes clean up their files), then SIGKILL


def start_reaper() -> str:
    """Mark this process's future children and start their reaper; returns the token."""
    token = uuid.uuid4().hex
    read_end, write_end = os.pipe()  # both close-on-exec: Ray's processes never hold them
    env = {k: v for k, v in os.environ.items() if k != OWNER_ENV}
    subprocess.Popen(
        [sys.executable, "-m", "pdmask.orchestration.reaper", token],
        stdin=read_end,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )
    os.close(read_end)
    # The write end stays open, unused, until this process ends: that is the signal.
    _KEEP.append(write_end)
    os.environ[OWNER_ENV] = token
    return token


_KEEP: list[int] = []


def marked(token: str) -> list[int]:
    """Pids of the live processes whose environment carries ``token``."""
    needle = f"{OWNER_ENV}={token}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:  # gone, or not ours to read
            continue
    return found


def reap(token: str, grace: float = GRACE_SECONDS) -> list[int]:
    """SIGTERM every marked process, SIGKILL those left after ``grace``; returns the pids."""
    pids = marked(token)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and marked(token):
        time.sleep(0.1)
    for pid in marked(token):  # re-read: a pid may have been reused by now
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return pids


def main() -> None:
    (token,) = sys.argv[1:]
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while os.read(0, 4096):  # returns b"" once the driver, the only writer, has exited
        pass
    reap(token)


if __name__ == "__main__":
    main()
