"""The loopback address every server pdmask starts binds to, the host names that mean it, and
free ports on it.

Nothing pdmask starts listens beyond loopback unless the user asks for it; the places that warn
when a host is not loopback (``pdm ui --host``, a local sqlite store handed to a cluster) read
``LOOPBACK_HOSTS``.
"""

from __future__ import annotations

import socket

LOOPBACK = "127.0.0.1"
LOOPBACK_HOSTS = frozenset({LOOPBACK, "localhost", "::1"})


def free_port(host: str = LOOPBACK) -> int:
    """A port that is free on ``host`` now (the kernel's choice)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
