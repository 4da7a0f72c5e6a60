"""Trial checkpoints: written atomically, verified when read, never a block to their trial.

``<workdir>/checkpoint.pt`` holds the trainer, the behaviour copy (its FP8/bf16 weights exactly as
served), the optimizer, every RNG state, the step and the trial's config; the checkpoint it
replaced stays beside it as ``checkpoint.prev.pt``. Each file is ``torch.save`` of
``{"format", "sha256", "payload"}``: the payload is the bytes of the state's own ``torch.save``
and the digest is checked before they are unpickled, so a truncated, overwritten or bit-flipped
file is found instead of training on (torch's own reader checks no digest). Both levels load
with ``weights_only=True``: the state holds tensors and plain Python values only (numpy's RNG
state is kept as a tensor).

A file that cannot be read is moved aside (``checkpoint.pt.corrupt-<time>``, kept for a look)
and the trial resumes from the previous checkpoint, or from scratch when there is none, with one
line to ``note`` saying which. A checkpoint written for a different config is refused rather
than silently continued.
"""

from __future__ import annotations

import hashlib
import io
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pdmask.errors import ConfigError

CHECKPOINT_NAME = "checkpoint.pt"
PREVIOUS_NAME = "checkpoint.prev.pt"  # the one checkpoint.pt replaced: the fallback
CORRUPT_SUFFIX = ".corrupt-"  # + the time it was found: an unreadable file, moved aside
FORMAT = 2  # 1: the state's torch.save alone (read unverified, numpy's RNG state as arrays)
# What format 1 needs beyond weights_only's defaults: numpy's RNG state as arrays.
_FORMAT_1_GLOBALS = [np.ndarray, np.dtype, np.dtypes.UInt32DType, np._core.multiarray._reconstruct]


def atomic_torch_save(payload: object, path: Path) -> None:
    """Write to a temporary file in the same folder, fsync, rename, fsync the folder: never a
    half-written file, and the rename survives a power cut."""
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    _atomic_write(buffer.getbuffer(), path)


def _atomic_write(data: bytes | memoryview, path: Path, replaced: Path | None = None) -> None:
    """``data`` into ``path`` atomically; ``replaced``: where the file it replaces goes first."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if replaced is not None and path.exists():
            os.replace(path, replaced)  # a kill between the renames leaves this one to resume
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def rng_states() -> dict[str, Any]:
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": (name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss),
    }


def restore_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    random.setstate(states["python"])
    name, keys, pos, has_gauss, gauss = states["numpy"]
    keys = keys.numpy() if isinstance(keys, torch.Tensor) else keys
    np.random.set_state((name, keys.astype(np.uint32), pos, has_gauss, gauss))


def save_checkpoint(workdir: Path, *, step: int, identity: dict, models: dict, **extra) -> Path:
    """``models``: name -> object with ``state_dict()`` (trainer, behaviour, optimizer)."""
    state = {
        "step": step,
        "identity": identity,
        "state": {name: obj.state_dict() for name, obj in models.items()},
        "rng": rng_states(),
        **extra,
    }
    body = io.BytesIO()
    torch.save(state, body)
    payload = body.getvalue()
    framed = io.BytesIO()
    digest = hashlib.sha256(payload).hexdigest()
    torch.save({"format": FORMAT, "sha256": digest, "payload": payload}, framed)
    path = Path(workdir) / CHECKPOINT_NAME
    _atomic_write(framed.getbuffer(), path, replaced=path.with_name(PREVIOUS_NAME))
    return path


def read_checkpoint(path: Path) -> dict:
    """The state saved in ``path``, its digest verified.

    Raises:
        Exception: whatever makes the file unreadable (torch's reader on a truncated or random
            file, ``ValueError`` for a digest that does not match).
    """
    with torch.serialization.safe_globals(_FORMAT_1_GLOBALS):
        outer = torch.load(path, weights_only=True)
        if outer.get("format") != FORMAT:
            if "step" in outer and "state" in outer:
                return outer  # format 1, written before digests: read as it is
            raise ValueError(f"not a checkpoint of format {FORMAT}")
        payload = outer["payload"]
        if hashlib.sha256(payload).hexdigest() != outer["sha256"]:
            raise ValueError("its content does not match its sha256 digest")
        return torch.load(io.BytesIO(payload), weights_only=True)


def load_checkpoint(
    workdir: Path, identity: dict, note: Callable[[str], None] | None = None
) -> dict | None:
    """The newest readable checkpoint in ``workdir`` (None: train from scratch); refuses another
    trial's checkpoint. Each unreadable one is moved aside, and ``note`` (default: stderr) gets
    one line saying so and where the trial resumes from."""
    note = note or _print_note
    moved: list[str] = []
    for path in (Path(workdir) / CHECKPOINT_NAME, Path(workdir) / PREVIOUS_NAME):
        if not path.exists():
            continue
        try:
            payload = read_checkpoint(path)
        except Exception as err:  # truncated, overwritten, bits flipped: the trial goes on
            moved.append(_move_aside(path, err))
            continue
        if payload["identity"] != identity:
            raise ConfigError(
                f"{path}: checkpoint belongs to another trial config; use a fresh workdir "
                f"(checkpoint: {payload['identity']}, this trial: {identity})"
            )
        if moved:  # what happened first: a run's note keeps 300 characters
            note(f"resuming from {path.name} (step {payload['step']}): {'; '.join(moved)}")
        return payload
    if moved:
        note(f"training from scratch, no readable checkpoint left: {'; '.join(moved)}")
    return None


def _print_note(line: str) -> None:
    print(f"pdmask: {line}", file=sys.stderr, flush=True)


def _move_aside(path: Path, err: BaseException) -> str:
    """Rename an unreadable checkpoint out of the way; what happened, in words."""
    stamp = f"{path.name}{CORRUPT_SUFFIX}{time.strftime('%Y%m%dT%H%M%S')}"
    aside, n = path.with_name(stamp), 1
    while aside.exists():  # one found earlier in the same second is kept too
        n += 1
        aside = path.with_name(f"{stamp}-{n}")
    os.replace(path, aside)
    lines = str(err).strip().splitlines()
    why = f"{type(err).__name__}: {lines[0][:60]}" if lines else type(err).__name__
    return f"{path.name} unreadable ({why}), moved aside to {aside.name}"
