"""The probes of ``pdm cluster check`` that concern what a cluster's jobs read and write outside
their own processes, seen from one node: the tracking server, the checkpoint share (writable,
shared, with room), the data files, the model folders (complete) or the Hugging Face Hub.

Shipped next to ``probe.py`` in the check job's working directory; the standard library
only. Every probe returns ``result``: ``ok``, ``detail`` and, when it fails, the ``fix``.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import socket
import urllib.error
import urllib.request
from urllib.parse import quote, urlsplit, urlunsplit

HTTP_TIMEOUT_S = 15.0  # an MLflow server or the Hub answering a loaded node, not a dead one
HUB = "https://huggingface.co"


def result(ok: bool, detail: str, fix: str | None = None) -> dict:
    """A probe's answer: whether it passed, what it saw, and on failure what to do."""
    return {"ok": ok, "detail": detail, **({"fix": fix} if fix and not ok else {})}


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
    fix = "start the tracking server where every node reaches it (docs/cluster.md, section 4)"
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
            return result(False, f"{base} answers HTTP {err.code} to an MLflow API call", fix)
        except (OSError, ValueError) as err:
            reason = getattr(err, "reason", None) or err
            return result(False, f"cannot reach {base} from this node ({reason})", fix)
        return result(True, f"{base} answers")
    if parts.hostname and parts.port:  # a database URI: the database must accept a connection
        try:
            with socket.create_connection((parts.hostname, parts.port), HTTP_TIMEOUT_S):
                pass
        except OSError as err:
            return result(False, f"cannot connect to {parts.hostname}:{parts.port} ({err})", fix)
        return result(True, f"{parts.hostname}:{parts.port} accepts a connection")
    return result(
        False, f"{_shown(uri)} is not a server: each node would write a store of its own", fix
    )


SHARE_FIX = "set PDM_VERL_CHECKPOINT_DIR to a folder on storage every node mounts at that path"


def write_probe(root: str | None, folder: str, node_id: str) -> dict:
    """Round 1 of ``checkpoints``: write this node's file, read it back."""
    if not root:
        return result(False, "no checkpoint root is set", SHARE_FIX)
    path = os.path.join(root, folder, node_id)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as fh:
            fh.write(node_id)
        with open(path) as fh:
            if fh.read() != node_id:
                return result(False, f"{path} reads back different content", SHARE_FIX)
    except OSError as err:
        return result(False, f"cannot write under {root}: {err.strerror or err}", SHARE_FIX)
    return result(True, f"{root} writable")


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
        return result(
            False,
            f"{root} is not shared: the files node(s) {short} wrote there are not seen from "
            f"this node{why}",
            SHARE_FIX,
        )
    return result(True, f"{root} writable, shared by {len(writers)} node(s)")


def remove_probe(root: str, folder: str, node_id: str) -> None:
    """Round 3: this node's file removed (and the folder, by the last node to get there)."""
    where = os.path.join(root, folder)
    for remove, path in ((os.remove, os.path.join(where, node_id)), (os.rmdir, where)):
        with contextlib.suppress(OSError):
            remove(path)


def _size(n: float) -> str:
    """Bytes in decimal units, as disks are sold."""
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:,.1f} TB"


def check_space(root: str | None, need_bytes: int | None, written: str | None = None) -> dict:
    """Free space on the checkpoint share against what the plan says the sweep will write there
    (the root's nearest existing folder counts: the jobs create the root). ``written``: the
    sweep's folder under the root, whose files are part of the need already on the share (a
    resumed sweep's saves)."""
    if need_bytes is None:
        return result(True, "not checked (the plan gives no checkpoint size)")
    if not root:
        return result(False, "no checkpoint root is set", SHARE_FIX)
    existing = root
    while not os.path.exists(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)
    try:
        free = shutil.disk_usage(existing).free
    except OSError as err:
        return result(
            False, f"cannot read the free space of {root}: {err.strerror or err}", SHARE_FIX
        )
    already = _bytes_under(os.path.join(root, written)) if written else 0
    left = max(need_bytes - already, 0)
    shown = f"{_size(free)} free under {root}, the plan writes {_size(need_bytes)}"
    if already:
        shown += f" ({_size(already)} of it written already)"
    if free < left:
        return result(
            False,
            shown,
            "free space on the share, or keep fewer checkpoints (trainer.max_actor_ckpt_to_keep "
            "in PDM_VERL_OVERRIDES)",
        )
    return result(True, shown)


def _bytes_under(folder: str) -> int:
    """The size of every file below ``folder`` (0 when it does not exist)."""
    total = 0
    for top, _, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):  # removed meanwhile (pdm clean, a rotation)
                total += os.lstat(os.path.join(top, name)).st_size
    return total


def check_files(paths: list[str]) -> dict:
    if not paths:
        return result(True, "no files to check")
    bad = []
    for path in paths:
        try:
            with open(path, "rb") as fh:
                fh.read(1)
        except OSError as err:
            bad.append(f"{path} ({err.strerror or err})")
    if bad:
        return result(
            False,
            "cannot read " + ", ".join(bad),
            "write the data with `pdm data prepare --out` to the folder PDM_DATA_DIR names, on "
            "storage every node mounts",
        )
    return result(True, f"{len(paths)} file(s) readable")


def safetensors_problem(path: str) -> str | None:
    """None when the file is as long as its header says (8 bytes of header length, the JSON
    header, then every tensor's bytes up to the largest ``data_offsets`` end); else what is
    wrong: a cut-off download is shorter."""
    name = os.path.basename(path)
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            head = fh.read(8)
            length = int.from_bytes(head, "little") if len(head) == 8 else -1
            if length < 2 or 8 + length > size:
                return f"{name} is not a safetensors file or is cut off ({size:,} bytes)"
            header = json.loads(fh.read(length))
    except FileNotFoundError:
        return f"no {name}"
    except (OSError, ValueError) as err:
        return f"{name} cannot be read ({err})"
    ends = [t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"]
    want = 8 + length + max(ends, default=0)
    if size != want:
        return f"{name} holds {size:,} bytes, its header says {want:,} (a cut-off download?)"
    return None


TOKENIZER_FILES = (("tokenizer.json",), ("vocab.json", "merges.txt"), ("tokenizer.model",))


def model_folder_problems(folder: str) -> list[str]:
    """What a model folder lacks for ``from_pretrained``: its config, a tokenizer, and the
    weights (every shard ``model.safetensors.index.json`` names, or ``model.safetensors``)."""
    if not os.path.isdir(folder):
        return ["no such folder"]
    problems = []
    for name in ("config.json", "tokenizer_config.json"):
        if not os.path.isfile(os.path.join(folder, name)):
            problems.append(f"no {name}")
    if not any(all(os.path.isfile(os.path.join(folder, f)) for f in fs) for fs in TOKENIZER_FILES):
        problems.append("no tokenizer (tokenizer.json, vocab.json + merges.txt, tokenizer.model)")
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(index):
        try:
            with open(index) as fh:
                shards = sorted(set(json.load(fh)["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError) as err:
            return [*problems, f"model.safetensors.index.json cannot be read ({err})"]
    else:
        shards = ["model.safetensors"]
    problems += [p for s in shards if (p := safetensors_problem(os.path.join(folder, s)))]
    return problems


def check_models(root: str | None, paths: list[str]) -> dict:
    if root and not os.path.isdir(root):
        return result(False, f"no folder {root}", "set PDM_MODEL_ROOT to the shared model folder")
    if not paths:
        if root:
            return result(True, f"{root} present")
        return result(True, "no model folder to check: the models come from the Hub (see hub)")
    bad = [f"{path}: {', '.join(p)}" for path in paths if (p := model_folder_problems(path))]
    if bad:
        return result(
            False,
            "; ".join(bad),
            "download each model whole into its folder (every file of its Hub repository, e.g. "
            "`hf download Qwen/Qwen3-4B-Base --local-dir <root>/Qwen3-4B-Base`)",
        )
    return result(True, f"{len(paths)} model folder(s) complete")


def check_hub(models: list[str], endpoint: str | None) -> dict:
    """With no model root, every model's Hub page answers from this node (as the jobs' processes
    would download it: ``HF_ENDPOINT``, ``HF_TOKEN`` and ``HF_HUB_OFFLINE`` of this node)."""
    if not models:
        return result(True, "no model comes from the Hub")
    fix = (
        "let the nodes reach the Hub (a gated model: HF_TOKEN in their environment), or "
        "download the models to shared storage and set PDM_MODEL_ROOT (docs/cluster.md, "
        "section 3)"
    )
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return result(False, "HF_HUB_OFFLINE is set on this node", fix)
    base = (endpoint or os.environ.get("HF_ENDPOINT") or HUB).rstrip("/")
    token = os.environ.get("HF_TOKEN")
    failed = []
    for model in models:
        request = urllib.request.Request(f"{base}/api/models/{quote(model)}")
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
                json.load(response)
        except urllib.error.HTTPError as err:
            failed.append(f"{model} (HTTP {err.code})")
        except ValueError as err:
            failed.append(f"{model} (not the Hub's JSON: {err})")
        except OSError as err:  # the Hub not reached at all: the other models would not be
            failed.append(f"{model} ({getattr(err, 'reason', None) or err})")
            break
    if failed:
        return result(False, f"{base} does not serve " + ", ".join(failed) + " to this node", fix)
    return result(True, f"{base} serves {len(models)} model(s)")
