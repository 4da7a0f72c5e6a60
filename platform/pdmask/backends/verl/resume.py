"""Which checkpoint a retried VeRL job resumes from: the newest whose steps are all in MLflow.

verl saves a step's checkpoint inside the step, then syncs the new weights into vLLM, validates,
and only then logs the step's metrics. A job that dies in between (a vLLM engine that dies at the
weight sync is found exactly there) leaves a checkpoint of step N whose metrics never reached the
run; verl's ``resume_mode=auto`` resumes after it and step N is missing from every history for
good. So a retry resumes from the newest kept checkpoint at or before the run's last logged step
and trains the unlogged steps again (verl keeps ``max_actor_ckpt_to_keep`` of them; the job
builder keeps 2). If no kept checkpoint is that old, the latest is used as verl would, and the
steps that stay unlogged are named in the run's ``pdm.verl.unlogged_steps`` tag.
"""

from __future__ import annotations

import os
import re

STEP_DIR = re.compile(r"^global_step_(\d+)$")
TRACKER = "latest_checkpointed_iteration.txt"  # verl's tracker file of the latest complete save


def kept_checkpoints(folder: str) -> dict[int, str]:
    """step -> path of the complete checkpoints in ``folder`` (none past verl's tracker)."""
    try:
        with open(os.path.join(folder, TRACKER)) as fh:
            latest = int(fh.read().strip())
        names = os.listdir(folder)
    except (OSError, ValueError):
        return {}
    found = {}
    for name in names:
        match = STEP_DIR.match(name)
        if match and int(match.group(1)) <= latest:
            found[int(match.group(1))] = os.path.join(folder, name)
    return found


def resume_point(folder: str, last_logged: int) -> tuple[str | None, list[int]]:
    """(the checkpoint to resume from, or None for verl's own choice; the steps whose metrics
    that choice still leaves unlogged)."""
    kept = kept_checkpoints(folder)
    if not kept:
        return None, []
    latest = max(kept)
    if latest <= last_logged:
        return None, []  # verl's latest: every step up to it is logged
    usable = [step for step in kept if step <= last_logged]
    if usable:
        return kept[max(usable)], []
    return None, list(range(last_logged + 1, latest + 1))
