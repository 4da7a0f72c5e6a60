"""The processes of one test's sweep and the sockets they listen on, read from /proc.

A sweep's processes are found two ways, so neither re-parenting nor a short-lived child hides
one: the descendants of the driver, recorded while it runs (``Watch``: Ray's agents rename
themselves, which blanks their environment in /proc), and every process whose environment names
the test's scratch project (``PDM_PROJECT``, inherited by Ray's processes and set in its workers'
runtime env). Only those are listed: other Ray instances on the machine are not ours.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import threading
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
LISTEN_TCP = "0A"
UNCONNECTED_UDP = "07"


@dataclass(frozen=True)
class Listener:
    pid: int
    command: str
    protocol: str
    address: str
    port: int

    @property
    def loopback_only(self) -> bool:
        ip = ipaddress.ip_address(self.address)
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return ip.is_loopback


def _parents() -> dict[int, int]:
    out = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            out[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return out


def descendants(root: int) -> set[int]:
    parents = _parents()
    found, frontier = {root}, [root]
    while frontier:
        pid = frontier.pop()
        children = [c for c, p in parents.items() if p == pid and c not in found]
        found.update(children)
        frontier.extend(children)
    return found & set(parents)


def of_project(project: Path) -> set[int]:
    """Live processes whose environment has PDM_PROJECT=<project>."""
    needle = f"PDM_PROJECT={project}".encode()
    found = set()
    for entry in PROC.iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    found.add(int(entry.name))
            except OSError:
                continue
    return found


def command(pid: int) -> str:
    try:
        return (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]
    except OSError:
        return "?"


def _address(hexaddr: str) -> tuple[str, int]:
    ip, port = hexaddr.split(":")
    raw = bytes.fromhex(ip)
    if len(raw) == 16:  # four host-order 32-bit words
        raw = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
        return socket.inet_ntop(socket.AF_INET6, raw), int(port, 16)
    return socket.inet_ntop(socket.AF_INET, raw[::-1]), int(port, 16)


def _listening_inodes() -> dict[int, tuple[str, str, int]]:
    out = {}
    for table, protocol, state in (
        ("tcp", "tcp", LISTEN_TCP),
        ("tcp6", "tcp", LISTEN_TCP),
        ("udp", "udp", UNCONNECTED_UDP),
        ("udp6", "udp", UNCONNECTED_UDP),
    ):
        path = PROC / "net" / table
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == state:
                out[int(fields[9])] = (protocol, *_address(fields[1]))
    return out


def listeners(pids: set[int]) -> list[Listener]:
    """Every listening TCP socket and bound UDP socket held by ``pids``."""
    sockets = _listening_inodes()
    found = []
    for pid in sorted(pids):
        try:
            fds = list((PROC / str(pid) / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inode = int(target[len("socket:[") : -1])
                if inode in sockets:
                    found.append(Listener(pid, command(pid), *sockets[inode]))
    return sorted(set(found), key=lambda s: (s.pid, s.port))


def _start_time(pid: int) -> int | None:
    try:
        return int((PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError):
        return None


class Watch:
    """Records every descendant of ``root`` (pid and start time) until stopped: a process that
    outlives the root loses its ancestry, not its place here."""

    def __init__(self, root: int, every: float = 0.1) -> None:
        self.root, self.every = root, every
        self.seen: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.look()
            self._stop.wait(self.every)

    def look(self) -> None:
        for pid in descendants(self.root) | self.alive():
            start = _start_time(pid)
            if pid != self.root and start is not None:
                self.seen.setdefault(pid, start)

    def alive(self) -> set[int]:
        return {pid for pid, start in list(self.seen.items()) if _start_time(pid) == start}

    def stop(self) -> Watch:
        self._stop.set()
        self._thread.join()
        self.look()
        return self


def survivors(project: Path, watch: Watch | None = None, wait: float = 20.0) -> list[str]:
    """Processes of the project (or seen by ``watch``) still alive after up to ``wait`` seconds
    (the reaper gives Ray's processes a few seconds to end on SIGTERM), with their commands."""
    import time

    deadline = time.monotonic() + wait
    while True:
        alive = of_project(project) | (watch.alive() if watch else set())
        if not alive or time.monotonic() > deadline:
            return [f"{p}: {command(p)}" for p in sorted(alive)]
        time.sleep(0.5)
