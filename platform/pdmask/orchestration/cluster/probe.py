"""The cluster's half of `pdm cluster check`: a Ray job that runs one tiny task on every alive node.

The submitting machine reaches a cluster only through its job API (port 8265), so the check is
itself a Ray job: this file, its two siblings (``FILES``) and a spec (``SPEC_FILE``) travel as the
job's working directory, its driver starts one zero-CPU task pinned to each alive node
(``NodeAffinitySchedulingStrategy``, not soft: a node that cannot run it is reported, never
replaced by another), and prints one line, ``MARK`` + JSON, which the submitter reads from the
job's log (``check.py``).

It imports nothing but the standard library and Ray (torch only inside the probes that need it):
a node without pdmask, or with another one, is a finding of the check, not a crash of it. Each
node checks, as the trials' processes there would see things (``CHECKS``, one function each; a
failure carries its ``fix``):

- ``tracking``, ``checkpoints``, ``space``, ``data``, ``models``, ``hub``: what the jobs read and
  write outside their processes (``probe_inputs.py``); ``checkpoints`` takes two more
  rounds: the files every other node wrote are seen from each node (shared, not merely
  writable), then each node deletes its own;
- ``versions``: pdmask (its version and a digest of its source files, so that another commit or
  local edits are seen), verl, and on training nodes vLLM, torch and flash-attn, against the
  expected versions; a package with no expected version must be the same on every node;
- ``driver``, ``gpus``, ``attention``, ``fp8`` (Transformer Engine, where a setting trains in
  FP8), ``allreduce``: on the nodes where the jobs' workers run (``probe_training.py``).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import uuid
from importlib import metadata

try:  # in the check job: shipped beside this file, never the node's own (perhaps stale) pdmask
    import probe_inputs as inputs
    import probe_training as training
except ImportError:  # imported from the package: the submitter, the tests
    from pdmask.orchestration.cluster import probe_inputs as inputs
    from pdmask.orchestration.cluster import probe_training as training

MARK = "PDM-CLUSTER-CHECK "
SPEC_FILE = "pdm_cluster_check.json"
# the check job's working directory
FILES = ("probe.py", "probe_inputs.py", "probe_training.py")
CHECKS = (
    "tracking",
    "checkpoints",
    "space",
    "data",
    "models",
    "hub",
    "versions",
    "driver",
    "gpus",
    "attention",
    "fp8",
    "allreduce",
)
TRAINING_CHECKS = ("driver", "gpus", "attention", "fp8", "allreduce")
ROUND_TIMEOUT_S = 90.0  # a node whose task has not answered by then is reported as silent
INSTALL = (
    "install the submitter's pdmask commit, with its extra, on every node (docs/cluster.md, "
    "section 2)"
)

result = inputs.result


def installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def package_folder(package: str) -> str | None:
    """Where ``import package`` would load it from, asked of the import system's finders
    themselves (an editable install's too), not of ``sys.modules``: what is installed, not
    what this process happens to have imported."""
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        spec = find(package, None) if find else None
        if spec is not None:
            return spec.submodule_search_locations[0] if spec.submodule_search_locations else None
    return None


def source_digest(package: str = "pdmask") -> str | None:
    """The first 12 hex digits of a SHA-256 over the package's ``.py`` files (relative path and
    content, in path order): the same sources give the same digest wherever they are installed,
    and another commit or a local edit another one."""
    root = package_folder(package)
    if root is None:
        return None
    digest = hashlib.sha256()
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = sorted(s for s in subfolders if s != "__pycache__")
        for name in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(folder, name)
            digest.update(os.path.relpath(path, root).replace(os.sep, "/").encode() + b"\0")
            with open(path, "rb") as fh:
                digest.update(fh.read() + b"\0")
    return digest.hexdigest()[:12]


def node_version(name: str) -> str | None:
    """A package's version as the check compares it; pdmask's with the digest of its sources."""
    version = installed(name)
    if name == "pdmask" and version is not None:
        return f"{version} (source {source_digest()})"
    return version


def same_version(have: str | None, want: str) -> bool:
    """``want`` without a local part (``2.11.0``) accepts any build of it (``2.11.0+cu130``)."""
    if have is None:
        return False
    return have == want or ("+" not in want and have.split("+")[0] == want)


def check_versions(expected: dict[str, str | None]) -> dict:
    have = {name: node_version(name) for name in expected}
    wrong = [
        f"{name} {have[name] or 'not installed'} (expected: {want})"
        for name, want in expected.items()
        if want is not None and not same_version(have[name], want)
    ]
    shown = ", ".join(f"{name} {v or 'missing'}" for name, v in have.items())
    out = result(not wrong, "; ".join(wrong) or shown, INSTALL)
    return {**out, "installed": have}


def disagreements(installed_by_node: dict[str, dict[str, str | None]], names) -> dict[str, str]:
    """For each package of ``names`` (those with no expected version), the nodes whose version
    differs from another node's, with what each has."""
    out: dict[str, list[str]] = {}
    for name in names:
        seen = {n: v[name] for n, v in installed_by_node.items() if name in v}
        if len(set(seen.values())) > 1:
            listing = ", ".join(f"{n[:8]}: {v or 'missing'}" for n, v in sorted(seen.items()))
            for node in seen:
                out.setdefault(node, []).append(f"{name} differs between nodes ({listing})")
    return {node: "; ".join(found) for node, found in out.items()}


def not_training(resource: str | None) -> dict:
    if resource is None:
        return result(True, "not checked (the spec names no training nodes)")
    return result(True, f"no {resource} in Ray's resources here: no job's workers run here")


def probe_node(spec: dict, node_id: str, ray_gpus: float, trains: bool) -> dict:
    """Round 1 on one node: every check but the sharing half of ``checkpoints`` and the
    all-reduce. ``trains``: the node has the training resource (``spec['training']``)."""
    need = spec.get("training")
    expected = dict(spec["versions"])
    root = spec["checkpoint_root"]
    out = {
        "node_id": node_id,
        "host": socket.gethostname(),
        "python": sys.executable,
        "tracking": inputs.check_tracking(spec["tracking_uri"]),
        "checkpoints": inputs.write_probe(root, spec["folder"], node_id),
        "space": inputs.check_space(
            root, spec.get("checkpoint_need_bytes"), spec.get("checkpoint_written")
        ),
        "data": inputs.check_files(spec["data_files"]),
        "models": inputs.check_models(spec["model_root"], spec["model_paths"]),
        "hub": inputs.check_hub(spec.get("hub_models", []), spec.get("hub_endpoint")),
    }
    if need is None or not trains:
        skipped = not_training(need and need["resource"])
        out.update({check: skipped for check in TRAINING_CHECKS})
    else:
        expected.update(need["packages"])
        out.update(
            driver=training.check_driver(need["min_driver"]),
            gpus=training.check_gpus(need["gpus"], ray_gpus),
            attention=training.check_attention(need["attention"]),
            fp8=training.check_fp8_training(need.get("fp8_training")),
        )
    out["versions"] = check_versions(expected)
    return out


def _run(spec: dict) -> dict:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ray.init(log_to_driver=False)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    spec = {**spec, "folder": f".pdm-cluster-check-{uuid.uuid4().hex[:12]}"}
    need = spec.get("training")
    resource = need["resource"] if need else None
    first = ray.remote(num_cpus=0, max_retries=0)(probe_node)
    second = ray.remote(num_cpus=0, max_retries=0)(inputs.shared_probe)
    third = ray.remote(num_cpus=0, max_retries=0)(inputs.remove_probe)
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

    def gpus_of(node) -> float:
        return float(node.get("Resources", {}).get("GPU", 0))

    def trains(node) -> bool:
        return resource is not None and node.get("Resources", {}).get(resource, 0) > 0

    results = {}
    answers = gather(
        {n["NodeID"]: pinned(first, n, spec, n["NodeID"], gpus_of(n), trains(n)) for n in nodes}
    )
    for node_id, value in answers.items():
        results[node_id] = value if isinstance(value, dict) else _silent(node_id, value)
    expected = {**spec["versions"], **(need["packages"] if need else {})}
    unpinned = [name for name, want in expected.items() if want is None]
    seen = {i: r["versions"]["installed"] for i, r in results.items() if not r.get("silent")}
    for node_id, why in disagreements(seen, unpinned).items():
        versions = results[node_id]["versions"]
        detail = why if versions["ok"] else f"{versions['detail']}; {why}"
        results[node_id]["versions"] = {**versions, **result(False, detail, INSTALL)}
    writers = [i for i, r in results.items() if r["checkpoints"]["ok"]]
    writing = [n for n in nodes if n["NodeID"] in writers]
    shared = {n["NodeID"]: pinned(second, n, root, folder, writers) for n in writing}
    for node_id, value in gather(shared).items():
        results[node_id]["checkpoints"] = (
            value if isinstance(value, dict) else result(False, value, inputs.SHARE_FIX)
        )
    gather({n["NodeID"]: pinned(third, n, root, folder, n["NodeID"]) for n in writing})
    ranks = [n for n in nodes if trains(n) and not results[n["NodeID"]].get("silent")]
    if need is not None and ranks:
        for node_id, value in _all_reduce(ray, ranks, need["collective"], pinned, gather).items():
            results[node_id]["allreduce"] = (
                value
                if isinstance(value, dict)
                else result(False, value, "see the node's Ray logs")
            )
    for n in nodes:
        results[n["NodeID"]].update(
            ip=n.get("NodeManagerAddress", ""),
            head="node:__internal_head__" in n.get("Resources", {}),
        )
    return {"nodes": list(results.values())}


def _all_reduce(ray, ranks: list[dict], backend: str, pinned, gather) -> dict:
    """One all-reduce across the training nodes, one rank each, the first node the master."""
    actor = ray.remote(num_cpus=0, max_restarts=0)(training.Rank)
    actors = {n["NodeID"]: pinned(actor, n) for n in ranks}
    master = ranks[0].get("NodeManagerAddress", "")
    try:
        port = gather({"port": actors[ranks[0]["NodeID"]].open.remote(master)})["port"]
        if not isinstance(port, int):
            return {
                n["NodeID"]: f"the master rank could not listen on {master}: {port}" for n in ranks
            }
        return gather(
            {
                n["NodeID"]: actors[n["NodeID"]].all_reduce.remote(
                    backend, master, port, i, len(ranks), n.get("NodeManagerAddress", "")
                )
                for i, n in enumerate(ranks)
            }
        )
    finally:
        for a in actors.values():
            ray.kill(a)


def _silent(node_id: str, why: str) -> dict:
    out = {c: result(False, why, "see the node's Ray logs") for c in CHECKS}
    return {"node_id": node_id, "host": "?", "silent": True, **out}


def main() -> None:
    with open(SPEC_FILE) as fh:
        spec = json.load(fh)
    print(MARK + json.dumps(_run(spec)), flush=True)


if __name__ == "__main__":
    main()
