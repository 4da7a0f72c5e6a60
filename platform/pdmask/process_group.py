"""Run a command as a process group that never outlives the process that started it.

    python -m pdmask.process_group PARENT_PID -- COMMAND [ARG ...]

Started with ``start_new_session=True``, this guard leads its own process group; COMMAND and
everything COMMAND starts (a server's workers and helpers) join that group. The guard takes the
whole group down, SIGTERM first and SIGKILL after a grace period, when

- its parent dies, however it dies (SIGKILL included): on Linux the kernel sends the guard SIGTERM
  (``PR_SET_PDEATHSIG``), elsewhere a poll of the parent's pid notices within a fraction of a second;
- it receives SIGTERM, SIGINT or SIGHUP;
- COMMAND exits (its helpers must not linger on their own).

It exits with COMMAND's exit code (0 when it was asked to stop).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
GRACE_S = 10.0  # what a server gets to shut down cleanly before SIGKILL
POLL_S = 0.2


def signal_when_parent_dies(sig: int = signal.SIGTERM) -> None:
    """Have the kernel send this process ``sig`` when its parent dies, however it dies (Linux;
    elsewhere a no-op: the guard's poll in ``run`` covers it). Usable as a ``preexec_fn``."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)


def live_stats() -> dict[int, list[str]]:
    """pid -> the fields of ``/proc/PID/stat`` after the command name (``[0]`` is the state,
    ``[1]`` the parent, ``[2]`` the process group, ``[19]`` the start time) of every live, non-zombie
    process (Linux /proc)."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):  # gone meanwhile
            continue
        if fields[0] != "Z":
            table[int(entry)] = fields
    return table


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group ``pgid``, this one excluded (Linux /proc)."""
    me = os.getpid()
    return [pid for pid, fields in live_stats().items() if pid != me and int(fields[2]) == pgid]


def _reap() -> None:
    # Our own exited children would otherwise stay zombies, and a zombie still counts as alive.
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def stop_group(grace: float = GRACE_S) -> None:
    """SIGTERM to every other member of our group; SIGKILL to those still there after ``grace``."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the group signal reaches us too
    pgid = os.getpgrp()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    if not os.path.isdir("/proc"):  # no way to list the group: wait, then kill it, us included
        time.sleep(grace)
        os.killpg(pgid, signal.SIGKILL)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        _reap()
        if not group_members(pgid):
            return
        time.sleep(POLL_S)
    for pid in group_members(pgid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    _reap()


def run(parent: int, command: list[str]) -> int:
    stop: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, _frame: stop.append(signum))
    signal_when_parent_dies(signal.SIGTERM)
    if os.getppid() != parent:  # the parent died before the line above took effect
        return 0
    child = subprocess.Popen(command)
    while not stop and child.poll() is None and os.getppid() == parent:
        time.sleep(POLL_S)
    code = child.returncode
    stop_group()
    return 0 if code is None else code


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--" or not argv[0].isdigit():
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    return run(int(argv[0]), argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
