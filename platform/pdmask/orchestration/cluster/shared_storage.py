"""What a cluster's nodes must share, refused from the settings alone before anything is submitted.

A job runs on whichever node Ray places it, and reads and writes the paths it is given there.
Settings that can only name the submitting machine lose results on a real cluster. The job loop's
own one is the tracking store every job logs into: a sqlite or file store (each node writes its
own, the figure reads none of them) or a tracking URL on a loopback name (``localhost`` is every
node itself) is refused here. The paths a backend's jobs read and write (checkpoints, data,
models) are the backend's to judge (``JobBatch.unshared``; VeRL: ``backends/verl/site_inputs``).
Both are refused (exit 2, every problem at once, each naming its setting and the fix) for any
address that is not a head pdm started on this machine; ``pdm cluster check`` then proves the rest
from every node (``check.py``). Pure functions of the settings: nothing is contacted.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from pdmask.errors import Problem

TRACKING = "--tracking-uri / MLFLOW_TRACKING_URI"
SERVER_FIX = (
    "start an MLflow server the nodes can reach (docs/cluster.md, section 4) and pass "
    "--tracking-uri http://TRACKING_HOST:5000"
)


def is_loopback_host(host: str | None) -> bool:
    """True for a name or address that means "this machine" to whichever node reads it."""
    if not host:
        return True
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False  # a host name: it names one machine for every node
    return ip.is_loopback or ip.is_unspecified


def tracking_uri_problem(uri: str) -> str | None:
    """Why the nodes cannot all log into the store ``uri`` (None: they may)."""
    parts = urlsplit(uri)
    scheme = parts.scheme.lower() or uri.lower()
    if scheme.startswith("databricks"):  # a hosted service (`databricks`, `databricks://profile`)
        return None
    if scheme in ("sqlite", "file") or "://" not in uri:
        return (
            f"a file store on one machine: each node would write a store of its own; {SERVER_FIX}"
        )
    if is_loopback_host(parts.hostname):
        return (
            f"names {parts.hostname or 'no host'}, which on every node is that node itself; "
            "give the tracking server's name or address as the nodes reach it"
        )
    return None


def tracking_problems(tracking_uri: str) -> list[Problem]:
    """The tracking store's problem for a cluster's nodes, as a ``Problem`` naming the setting
    (its password redacted), or none."""
    from pdmask.tracking.store import redact

    why = tracking_uri_problem(tracking_uri)
    return [Problem(TRACKING, redact(tracking_uri), why)] if why else []
