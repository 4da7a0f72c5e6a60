"""The cluster's half of `pdm cluster check`: a Ray job that runs one tiny task on every alive node.

The submitting machine reaches a cluster only through its job API (port 8265), so the check is
itself a Ray job: this file and a spec (``SPEC_FILE``) travel as the job's working directory, its
driver starts one zero-CPU task pinned to each alive node (``NodeAffinitySchedulingStrategy``,
not soft: a node that cannot run it is reported, never replaced by another), and prints one line,
``MARK`` + JSON, which the submitter reads from the job's log (``cluster_check.py``).

It imports nothing but the standard library and Ray: a node without pdmask, or with another
version, is a finding of the check, not a crash of it. Each node checks, as the trials' processes
there would see things:

- ``tracking``: the MLflow server answers an API call (not only a TCP connect);
- ``checkpoints``: a file written under the checkpoint root is read back, and, in a second
  round, the files every other node wrote are seen there too (shared, not merely writable);
  each node then deletes its own file;
- ``data``: every data file exists and can be read;
- ``models``: the model root and every model folder the jobs will load exist;
- ``versions``: pdmask, verl and vllm as installed in the node's Ray workers, against the
  submitter's (a package the submitter lacks is shown, not compared).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import socket
import sys
import urllib.error
import urllib.request
import uuid
from importlib import metadata
from urllib.parse import urlsplit, urlunsplit

MARK = "PDM-CLUSTER-CHECK "
SPEC_FILE = "pdm_cluster_check.json"
CHECKS = ("tracking", "checkpoints", "data", "models", "versions")
HTTP_TIMEOUT_S = 5.0
ROUND_TIMEOUT_S = 90.0  # a node whose task has not answered by then is reported as silent


def _result(ok: bool, detail: str) -> dict:
    return {"ok": ok, "detail": detail}


def _shown(uri: str) -> str:
    """``uri`` without its user and password (what the node reports back)."""
    parts = urlsplit(uri)
    if parts.username is None and parts.password is None:
        return uri
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit(parts._replace(netloc=netloc))


def check_tracking(uri: str) -> dict:
    parts = urlsplit(uri)
    if parts.scheme in ("http", "https"):
        base = _shown(uri).rstrip("/")
        request = urllib.request.Request(f"{base}/api/2.0/mlflow/experiments/search?max_results=1")
        if parts.username is not None:
            pair = f"{parts.username}:{parts.password or ''}".encode()
            request.add_header("Authorization", "Basic " + base64.b64encode(pair).decode())
        try:
            with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
                json.load(response)
        except urllib.error.HTTPError as err:
            return _result(False, f"{base} answers HTTP {err.code} to an MLflow API call")
        except (OSError, ValueError) as err:
            reason = getattr(err, "reason", None) or err
            return _result(False, f"cannot reach {base} from this node ({reason})")
        return _result(True, f"{base} answers")
    if parts.hostname and parts.port:  # a database URI: the database must accept a connection
        try:
            with socket.create_connection((parts.hostname, parts.port), HTTP_TIMEOUT_S):
                pass
        except OSError as err:
            return _result(False, f"cannot connect to {parts.hostname}:{parts.port} ({err})")
        return _result(True, f"{parts.hostname}:{parts.port} accepts a connection")
    return _result(
        False, f"{_shown(uri)} is not a server: each node would write a store of its own"
    )


def write_probe(root: str | None, folder: str, node_id: str) -> dict:
    """Round 1 of ``checkpoints``: write this node's file, read it back."""
    if not root:
        return _result(False, "no checkpoint root is set")
    path = os.path.join(root, folder, node_id)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as fh:
            fh.write(node_id)
        with open(path) as fh:
            if fh.read() != node_id:
                return _result(False, f"{path} reads back different content")
    except OSError as err:
        return _result(False, f"cannot write under {root}: {err.strerror or err}")
    return _result(True, f"{root} writable")


def shared_probe(root: str, folder: str, writers: list[str]) -> dict:
    """Round 2 of ``checkpoints``: the files every node wrote in round 1 are seen here."""
    where = os.path.join(root, folder)
    try:
        seen, why = set(os.listdir(where)), ""
    except OSError as err:
        seen, why = set(), f" ({err.strerror or err})"
    missing = [w for w in writers if w not in seen]
    if missing:
        short = ", ".join(m[:8] for m in missing)
        return _result(
            False,
            f"{root} is not shared: the files node(s) {short} wrote there are not seen from "
            f"this node{why}",
        )
    return _result(True, f"{root} writable, shared by {len(writers)} node(s)")


def remove_probe(root: str, folder: str, node_id: str) -> None:
    """Round 3: this node's file removed (and the folder, by the last node to get there)."""
    where = os.path.join(root, folder)
    for remove, path in ((os.remove, os.path.join(where, node_id)), (os.rmdir, where)):
        with contextlib.suppress(OSError):
            remove(path)


def check_files(paths: list[str]) -> dict:
    if not paths:
        return _result(True, "no files to check")
    bad = []
    for path in paths:
        try:
            with open(path, "rb") as fh:
                fh.read(1)
        except OSError as err:
            bad.append(f"{path} ({err.strerror or err})")
    if bad:
        return _result(False, "cannot read " + ", ".join(bad))
    return _result(True, f"{len(paths)} file(s) readable")


def check_models(root: str | None, paths: list[str]) -> dict:
    folders = ([root] if root else []) + [p for p in paths if p != root]
    if not folders:
        return _result(True, "no model root set: models come from the Hugging Face Hub")
    missing = [f for f in folders if not os.path.isdir(f)]
    if missing:
        return _result(False, "no folder " + ", ".join(missing))
    return _result(True, f"{len(folders)} folder(s) present")


def installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def check_versions(expected: dict[str, str | None]) -> dict:
    parts, wrong = [], []
    for name, want in expected.items():
        have = installed(name)
        parts.append(f"{name} {have or 'missing'}")
        if want is not None and have != want:
            wrong.append(f"{name} {have or 'not installed'} (submitter: {want})")
    if wrong:
        return _result(False, "; ".join(wrong))
    return _result(True, ", ".join(parts))


def probe_node(spec: dict, node_id: str) -> dict:
    """Round 1 on one node: every check but the sharing half of ``checkpoints``."""
    return {
        "node_id": node_id,
        "host": socket.gethostname(),
        "python": sys.executable,
        "tracking": check_tracking(spec["tracking_uri"]),
        "checkpoints": write_probe(spec["checkpoint_root"], spec["folder"], node_id),
        "data": check_files(spec["data_files"]),
        "models": check_models(spec["model_root"], spec["model_paths"]),
        "versions": check_versions(spec["versions"]),
    }


def _run(spec: dict) -> dict:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ray.init(log_to_driver=False)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    spec = {**spec, "folder": f".pdm-cluster-check-{uuid.uuid4().hex[:12]}"}
    first = ray.remote(num_cpus=0, max_retries=0)(probe_node)
    second = ray.remote(num_cpus=0, max_retries=0)(shared_probe)
    third = ray.remote(num_cpus=0, max_retries=0)(remove_probe)
    root, folder = spec["checkpoint_root"], spec["folder"]

    def pinned(fn, node, *args):
        strategy = NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
        return fn.options(scheduling_strategy=strategy).remote(*args)

    def gather(refs: dict) -> dict:
        if not refs:
            return {}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=ROUND_TIMEOUT_S)
        out = {}
        for node_id, ref in refs.items():
            if ref not in ready:
                out[node_id] = f"no answer within {ROUND_TIMEOUT_S:.0f} s"
                continue
            try:
                out[node_id] = ray.get(ref)
            except Exception as err:  # the task could not run there (a broken node, an import)
                out[node_id] = f"the check task failed on this node: {type(err).__name__}: {err}"
        return out

    results = {}
    answers = gather({n["NodeID"]: pinned(first, n, spec, n["NodeID"]) for n in nodes})
    for node_id, value in answers.items():
        results[node_id] = value if isinstance(value, dict) else _silent(node_id, value)
    writers = [i for i, r in results.items() if r["checkpoints"]["ok"]]
    writing = [n for n in nodes if n["NodeID"] in writers]
    shared = {n["NodeID"]: pinned(second, n, root, folder, writers) for n in writing}
    for node_id, value in gather(shared).items():
        results[node_id]["checkpoints"] = (
            value if isinstance(value, dict) else _result(False, value)
        )
    gather({n["NodeID"]: pinned(third, n, root, folder, n["NodeID"]) for n in writing})
    for n in nodes:
        results[n["NodeID"]].update(
            ip=n.get("NodeManagerAddress", ""),
            head="node:__internal_head__" in n.get("Resources", {}),
        )
    return {"nodes": list(results.values())}


def _silent(node_id: str, why: str) -> dict:
    return {"node_id": node_id, "host": "?", **{c: _result(False, why) for c in CHECKS}}


def main() -> None:
    with open(SPEC_FILE) as fh:
        spec = json.load(fh)
    print(MARK + json.dumps(_run(spec)), flush=True)


if __name__ == "__main__":
    main()
