"""What a cluster's nodes must share, refused from the settings alone before anything is submitted.

A job runs on whichever node Ray places it, and reads and writes the paths it is given there.
Settings that can only name the submitting machine lose results on a real cluster: a sqlite or
file store (each node writes its own, the figure reads none of them), a tracking URL on a loopback
name (``localhost`` is every node itself), an unset checkpoint root (the submitter's state folder:
a retry on another node starts again from step 0), unset or relative data paths. These are
refused (exit 2, every problem at once, each naming its setting and the fix) for any address that
is not a head pdm started on this machine; ``pdm cluster check`` then proves the rest from every
node (``cluster_check.py``). Pure functions of the settings: nothing is contacted.
"""

from __future__ import annotations

import ipaddress
from pathlib import PurePosixPath
from urllib.parse import urlsplit

from pdmask.errors import Problem

TRACKING = "--tracking-uri / MLFLOW_TRACKING_URI"
CHECKPOINTS = "PDM_VERL_CHECKPOINT_DIR"
DATA = "PDM_DATA_DIR"
MODELS = "PDM_MODEL_ROOT"
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


def _path_problem(value: str) -> str | None:
    if not PurePosixPath(value).is_absolute():
        return "a relative path: each node would resolve it against its own working folder; give an absolute path on shared storage"
    return None


def storage_problems(
    tracking_uri: str,
    *,
    checkpoint_dir: str | None,
    data_dir: str | None,
    model_root: str | None,
    data_built_here: bool = False,
) -> list[Problem]:
    """Every setting that cannot be shared by a cluster's nodes, as problems naming it.

    ``data_built_here``: the jobs read inputs pdm builds on this machine (the CPU profile's tiny
    task), at paths the per-node check proves; ``PDM_DATA_DIR`` is then not needed."""
    from pdmask.tracking.store import redact

    problems = []
    why = tracking_uri_problem(tracking_uri)
    if why:
        problems.append(Problem(TRACKING, redact(tracking_uri), why))
    if not checkpoint_dir:
        problems.append(
            Problem(
                CHECKPOINTS,
                "(unset)",
                "checkpoints would go to this machine's state folder, where no other node sees "
                "them (a retried job would start again from step 0): set it to a folder on "
                "storage every node can write, e.g. /shared/pdm-checkpoints",
            )
        )
    elif why := _path_problem(checkpoint_dir):
        problems.append(Problem(CHECKPOINTS, checkpoint_dir, why))
    if not data_dir and not data_built_here:
        problems.append(
            Problem(
                DATA,
                "(unset)",
                "the jobs would read the data from this machine's state folder: set it to the "
                "folder of `pdm data prepare`'s files on storage every node reads",
            )
        )
    elif data_dir and (why := _path_problem(data_dir)):
        problems.append(Problem(DATA, data_dir, why))
    if model_root and (why := _path_problem(model_root)):
        problems.append(Problem(MODELS, model_root, why))
    return problems
