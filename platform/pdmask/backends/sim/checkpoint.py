"""Trial checkpoints: written atomically, read back to resume after a crash or a kill.

One file, ``<workdir>/checkpoint.pt``, holding the trainer, the behaviour copy (its FP8/bf16
weights exactly as served), the optimizer, every RNG state, the step and the trial's config. A
checkpoint written for a different config is refused rather than silently continued.
"""

from __future__ import annotations

import os
import random
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pdmask.errors import ConfigError

CHECKPOINT_NAME = "checkpoint.pt"


def atomic_torch_save(payload: object, path: Path) -> None:
    """Write to a temporary file in the same folder, fsync, rename: never a half-written file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save(payload, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def rng_states() -> dict[str, Any]:
    return {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
    }


def restore_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])


def save_checkpoint(workdir: Path, *, step: int, identity: dict, models: dict, **extra) -> Path:
    """``models``: name -> object with ``state_dict()`` (trainer, behaviour, optimizer)."""
    payload = {
        "step": step,
        "identity": identity,
        "state": {name: obj.state_dict() for name, obj in models.items()},
        "rng": rng_states(),
        **extra,
    }
    path = Path(workdir) / CHECKPOINT_NAME
    atomic_torch_save(payload, path)
    return path


def load_checkpoint(workdir: Path, identity: dict) -> dict | None:
    """The checkpoint in ``workdir`` (None if there is none); refuses another trial's checkpoint."""
    path = Path(workdir) / CHECKPOINT_NAME
    if not path.exists():
        return None
    payload = torch.load(path, weights_only=False)
    if payload["identity"] != identity:
        raise ConfigError(
            f"{path}: checkpoint belongs to another trial config; use a fresh workdir "
            f"(checkpoint: {payload['identity']}, this trial: {identity})"
        )
    return payload
