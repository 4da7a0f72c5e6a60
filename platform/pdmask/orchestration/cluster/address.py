"""A Ray address is refused before anything starts unless it parses and something answers on it.

Without this, ``RAY_ADDRESS=foo`` passed the dry run and the real run died with a traceback after
the store was created, and an address with nothing listening hung in ``ray.init`` for minutes.
The forms, by launch kind:

- Tune trials (``ray.init``): ``HOST:PORT`` (the head's GCS, 6379 by default), ``ray://HOST:PORT``
  (Ray Client), or ``auto`` (the Ray started on this machine, found by Ray itself);
- VeRL trials (Ray Jobs): the head's job API, ``http://HOST:PORT`` (8265 by default),
  ``https://...`` or ``HOST:PORT``.

"Answers" means a TCP connection within ``CONNECT_TIMEOUT_S``, as the tracking store's check
does for a server; what speaks on the port is Ray's own business.
"""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

from pdmask.errors import Problem

CONNECT_TIMEOUT_S = 3.0
WHERE = "--address / RAY_ADDRESS"


def address_problems(address: str | None, jobs: bool) -> list[Problem]:
    """Why ``address`` cannot be used for a sweep (``jobs``: its trials are Ray Jobs); empty when
    it can, or when there is none (an embedded Ray is started)."""
    if not address or (address == "auto" and not jobs):
        return []
    target = _host_port(address, jobs)
    if isinstance(target, str):
        return [Problem(WHERE, address, target)]
    host, port = target
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as err:
        why = "no answer" if isinstance(err, TimeoutError) else (err.strerror or str(err))
        return [
            Problem(
                WHERE,
                address,
                f"nothing answers on {host}:{port} within {CONNECT_TIMEOUT_S:.0f} s ({why}); "
                "is the Ray head started, and is this its address?",
            )
        ]
    return []


def _host_port(address: str, jobs: bool) -> tuple[str, int] | str:
    """(host, port) of ``address``, or what is wrong with it."""
    forms = (
        "http://HOST:PORT (the head's job API, port 8265)"
        if jobs
        else "HOST:PORT (the head's GCS, port 6379), ray://HOST:PORT or auto"
    )
    schemes = ("http", "https", "") if jobs else ("ray", "")
    parts = urlsplit(address if "://" in address else f"//{address}")
    try:
        port = parts.port
    except ValueError:
        return f"not a Ray address: its port is not a number; give {forms}"
    if parts.scheme not in schemes or not parts.hostname or parts.path not in ("", "/"):
        return f"not a Ray address; give {forms}"
    if port is None:
        if parts.scheme in ("http", "https"):
            port = 443 if parts.scheme == "https" else 80
        else:
            return f"not a Ray address: it names no port; give {forms}"
    return parts.hostname, port
