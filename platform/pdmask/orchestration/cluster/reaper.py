"""The reaper: kills an embedded Ray instance's processes when the sweep driver that owns it ends.

Ray ties its GCS and raylet to the driver, but not everything they start: after a SIGKILL of the
driver its dashboard and runtime-env agents live on for a minute or more, still listening. So the
driver starts this small process first, in a session of its own (a terminal's Ctrl-C does not
reach it), with the read end of a pipe whose write end only the driver holds. The kernel closes
that end when the driver exits, however it exits; the read then returns and the reaper kills the
instance's processes, found two ways so that neither blind spot hides one:

- **The driver's process tree, as recorded while the driver lived.** The reaper looks at it every
  ``LOOK_S`` seconds; a process keeps its place in the record after its parent dies and it is
  re-parented. Ray's agents rename themselves (setproctitle), which overwrites their environment
  as /proc shows it, so only the tree finds them.
- **The mark.** Every process of the instance inherits ``PDM_RAY_OWNER=<token>``, set by the driver
  before it started Ray; the mark catches a process started since the last look.

A recorded process is identified by its pid and its start time, so a reused pid is never killed.

    python -m pdmask.orchestration.cluster.reaper TOKEN DRIVER_PID   # stdin: the pipe; started for you
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

OWNER_ENV = "PDM_RAY_OWNER"
GRACE_SECONDS = 5.0  # SIGTERM first (Ray's processes clean up their files), then SIGKILL
LOOK_S = 0.5  # how often the driver's tree is recorded: a /proc scan costs a few milliseconds
START_TIME_FIELD = 19  # in /proc/PID/stat after the command name: field 22, "starttime"

_KEEP: list[int] = []


def start_reaper() -> str:
    """Mark this process's future children and start their reaper; returns the token."""
    token = uuid.uuid4().hex
    read_end, write_end = os.pipe()  # both close-on-exec: Ray's processes never hold them
    env = {k: v for k, v in os.environ.items() if k != OWNER_ENV}
    reaper = subprocess.Popen(
        [sys.executable, "-m", "pdmask.orchestration.cluster.reaper", token, str(os.getpid())],
        stdin=read_end,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )
    os.close(read_end)
    # The write end stays open, unused, until this process ends: that is the signal.
    _KEEP.append(write_end)
    _REAPERS.add(reaper.pid)
    os.environ[OWNER_ENV] = token
    return token


_REAPERS: set[int] = set()  # in the driver: its reapers, never among what it reaps itself


def _processes() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, start time) of every live, non-zombie process."""
    from pdmask.process_group import live_stats

    return {pid: (int(f[1]), int(f[START_TIME_FIELD])) for pid, f in live_stats().items()}


class Tree:
    """The descendants of ``root`` seen so far, each as pid -> start time."""

    def __init__(self, root: int, exclude: set[int] = frozenset()) -> None:
        self.root = root
        self.exclude = {os.getpid(), *exclude}
        self.seen: dict[int, int] = {}

    def look(self) -> dict[int, tuple[int, int]]:
        """Record the current descendants of the root and of every recorded live process."""
        table = _processes()
        children: dict[int, list[int]] = {}
        for pid, (parent, _) in table.items():
            children.setdefault(parent, []).append(pid)
        frontier = [self.root, *self.alive(table)]
        while frontier:
            for child in children.get(frontier.pop(), ()):
                if child not in self.seen and child not in self.exclude:
                    self.seen[child] = table[child][1]
                    frontier.append(child)
        return table

    def alive(self, table: dict[int, tuple[int, int]]) -> set[int]:
        return {pid for pid, start in self.seen.items() if table.get(pid, (0, None))[1] == start}


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


def _targets(token: str, tree: Tree | None) -> set[int]:
    if tree is None:
        return set(marked(token))
    return (set(marked(token)) | tree.alive(tree.look())) - tree.exclude


def reap(token: str, tree: Tree | None = None, grace: float = GRACE_SECONDS) -> set[int]:
    """SIGTERM the instance's processes (marked, or in ``tree``), SIGKILL those left after
    ``grace``; returns the pids."""
    pids = _targets(token, tree)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and _targets(token, tree):
        time.sleep(0.1)
    for pid in _targets(token, tree):  # re-read: a pid may have been reused by now
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return pids


def reap_own(token: str, grace: float) -> set[int]:
    """In the driver: reap what it started for the instance ``token`` (its reapers excepted)."""
    tree = Tree(os.getpid(), exclude=_REAPERS)
    tree.look()
    return reap(token, tree, grace)


def main() -> None:
    token, driver = sys.argv[1], int(sys.argv[2])
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # A driver already gone (its pid perhaps reused) has no tree to trust: the mark alone remains.
    tree = Tree(driver) if os.getppid() == driver else None
    while True:
        if tree is not None:
            tree.look()
        if select.select([0], [], [], LOOK_S)[0] and not os.read(0, 4096):
            break  # b"": the driver, the only writer, has exited
    reap(token, tree)


if __name__ == "__main__":
    main()
