"""Which TCP sockets a process tree listens on, and which processes it had (from /proc: no tools,
no privileges beyond ours)."""

from __future__ import annotations

import contextlib
import os
import threading

from pdmask.orchestration.cluster.local_head import _proc_stat, tree_of

_LISTEN = "0A"


def _listening_inodes() -> dict[str, str]:
    """socket inode -> local address of every listening TCP socket on the machine."""
    out = {}
    for table, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        with contextlib.suppress(OSError), open(table) as fh:
            for line in fh.readlines()[1:]:
                fields = line.split()
                if fields[3] != _LISTEN:
                    continue
                address, port = fields[1].split(":")
                out[fields[9]] = f"{_address(address, v6)}:{int(port, 16)}"
    return out


def _address(hex_address: str, v6: bool) -> str:
    raw = bytes.fromhex(hex_address)
    if not v6:
        return ".".join(str(b) for b in raw[::-1])
    words = [raw[i : i + 4][::-1] for i in range(0, 16, 4)]
    groups = b"".join(words)
    return ":".join(groups[i : i + 2].hex() for i in range(0, 16, 2))


def is_loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0]
    return (
        host.startswith("127.")
        or host == "0000:0000:0000:0000:0000:0000:0000:0001"  # ::1
        or host.startswith("0000:0000:0000:0000:0000:ffff:7f")  # ::ffff:127.x
    )


def listening(pids) -> dict[int, list[str]]:
    """pid -> addresses it listens on, for the given pids."""
    inodes = _listening_inodes()
    out: dict[int, list[str]] = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target.startswith("socket:[") and target[8:-1] in inodes:
                        out.setdefault(pid, []).append(inodes[target[8:-1]])
    return out


class ListenWatch:
    """Samples, every ``period`` seconds, what a process tree listens on and the titles of its
    processes; keeps what it saw."""

    def __init__(self, root_pid: int, period: float = 2.0):
        self.root_pid, self.period = root_pid, period
        self.seen: dict[str, set[str]] = {}  # address -> process names
        # pid -> every title it had (Ray's workers start as ray::IDLE, then take their actor's)
        self.titles: dict[int, set[str]] = {}
        self.parents: dict[int, int] = {}  # pid -> its parent when first seen
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ListenWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            pids = tree_of(self.root_pid)
            for pid in pids:
                self.titles.setdefault(pid, set()).add(process_title(pid))
                if pid not in self.parents:
                    self.parents[pid] = parent_of(pid)
            for pid, addresses in listening(pids).items():
                name = process_name(pid)
                for address in addresses:
                    self.seen.setdefault(address, set()).add(name)
            self.samples += 1

    def pids_titled(self, prefix: str) -> set[int]:
        """The processes that had a title starting with ``prefix``, less their forks: a child
        forked by such a process shows its parent's title until it runs a program of its own
        (a library starting a subprocess), and is its parent's, not a process of that kind."""
        titled = {
            p for p, titles in self.titles.items() if any(t.startswith(prefix) for t in titles)
        }
        return {p for p in titled if self.parents.get(p) not in titled}

    def beyond_loopback(self) -> dict[str, set[str]]:
        return {a: names for a, names in self.seen.items() if not is_loopback(a)}


def process_name(pid: int) -> str:
    """The process's command name (``/proc/PID/comm``), or its pid once it is gone."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/comm") as fh:
        return fh.read().strip()
    return str(pid)


def parent_of(pid: int) -> int | None:
    """The process's parent pid, or None once it is gone."""
    stat = _proc_stat(pid)
    return None if stat is None else int(stat[1])


def process_title(pid: int) -> str:
    """The process's title as ``ps`` shows it (Ray's ``ray::Actor``, vLLM's ``VLLM::Worker_TP0``:
    the first word of ``/proc/PID/cmdline``, which such titles overwrite), or ``""`` once gone."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as fh:
        words = fh.read().split(b"\0")[0].decode(errors="replace").split()
        return words[0] if words else ""
    return ""


def is_alive_as(pid: int, titles: set[str]) -> bool:
    """The process lives with one of the titles it was seen with (not a reused pid)."""
    return process_title(pid) in titles - {""}


def listening_now() -> list[str]:
    """The local address of every TCP socket listening on this machine now."""
    return list(_listening_inodes().values())
