"""The loopback address every server pdmask starts binds to, the host names that mean it, and
free ports on it.

Nothing pdmask starts listens beyond loopback unless the user asks for it; the places that warn
when a host is not loopback (``pdm ui --host``, a local sqlite store handed to a cluster) read
``LOOPBACK_HOSTS``.
"""

from __future__ import annotations

import contextlib
import socket

LOOPBACK = "127.0.0.1"
LOOPBACK_HOSTS = frozenset({LOOPBACK, "localhost", "::1"})


def free_port(host: str = LOOPBACK) -> int:
    """A port that is free on ``host`` now (the kernel's choice)."""
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = LOOPBACK) -> list[int]:
    """``count`` distinct ports that are free on ``host`` now.

    Every socket stays bound until all are chosen: ports picked one at a time, each released
    before the next is asked for, can repeat, and a Ray head handed one port for two of its
    servers refuses to start.
    """
    with contextlib.ExitStack() as held:
        sockets = [held.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in sockets]
