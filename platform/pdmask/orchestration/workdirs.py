"""A trial's work folder (``<state>/trials/<trial hash>/``) and the MLflow run it belongs to.

The backend checkpoints into the folder and resumes from whatever checkpoint it finds there. That
is only right while the run the checkpoint was written for still holds the steps before it: if
the run is lost (deleted, a fresh or replaced store, another ``--tracking-uri``) a resumed
trial would log nothing before its checkpoint, or nothing at all after a final checkpoint, and
its new run would be FINISHED with no data. So the folder records its owner (``owner.json``:
the run id, the trial hash and where the run is tracked) and a folder owned by any other run is
emptied before the trial starts: it trains from scratch into the run it reports to.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from pdmask.paths import state_dir

OWNER_FILE = "owner.json"


def trial_workdir(trial_hash: str) -> Path:
    return state_dir() / "trials" / trial_hash


def _owner(workdir: Path) -> dict | None:
    try:
        return json.loads((workdir / OWNER_FILE).read_text())
    except (OSError, ValueError):
        return None


def bind_workdir(trial_hash: str, run_id: str, where: str) -> tuple[Path, bool]:
    """The trial's folder, owned by ``run_id``; True when a checkpoint of another run (or of no
    known run) was discarded. ``where``: the tracking store, for the record (credentials
    hidden). The caller holds the trial's claim, so nobody else is in the folder."""
    workdir = trial_workdir(trial_hash)
    owner = {"run_id": run_id, "trial_hash": trial_hash, "tracking": where}
    current = _owner(workdir)
    if current is not None and (current["run_id"], current["trial_hash"]) == (run_id, trial_hash):
        return workdir, False
    discarded = workdir.exists() and any(p.name != "pid" for p in workdir.iterdir())
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    fd, tmp = tempfile.mkstemp(dir=workdir, prefix=f".{OWNER_FILE}.")
    with os.fdopen(fd, "w") as handle:
        json.dump(owner, handle)
    os.replace(tmp, workdir / OWNER_FILE)
    return workdir, discarded
