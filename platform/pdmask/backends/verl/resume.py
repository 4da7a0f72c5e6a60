"""Which checkpoint a retried VeRL job resumes from: the newest whose steps are all in MLflow.

verl saves a step's checkpoint inside the step, then syncs the new weights into vLLM, validates,
and only then logs the step's metrics. A job that dies in between (a vLLM engine that dies at the
weight sync is found exactly there) leaves a checkpoint of step N whose metrics never reached the
run; verl's ``resume_mode=auto`` resumes after it and step N is missing from every history for
good. So a retry resumes from the newest kept checkpoint at or before the run's last logged step
and trains the unlogged steps again (verl keeps ``max_actor_ckpt_to_keep`` of them; the job
builder keeps 2). If no kept checkpoint is that old, the latest is used as verl would, and the
steps that stay unlogged are named in the run's ``pdm.verl.unlogged_steps`` tag.

verl's tracker file is written in place (``open(..., "w")``): a job killed as it writes it leaves
it empty, and verl's own resume then fails on it in every attempt. pdmask moves an unreadable
tracker aside first (``set_aside_unreadable_tracker``): the trial trains from scratch (the steps
its run already holds are not logged twice). The step folders themselves are verl's to load
(``torch.load`` of its shards): a damaged shard still fails the attempt.
"""

from __future__ import annotations

import os
import re
import time

STEP_DIR = re.compile(r"^global_step_(\d+)$")
TRACKER = "latest_checkpointed_iteration.txt"  # verl's tracker file of the latest complete save


CORRUPT_SUFFIX = ".corrupt-"  # + the time it was found


def set_aside_unreadable_tracker(folder: str) -> str | None:
    """Move verl's tracker in ``folder`` aside (``<name>.corrupt-<time>``) when it holds no step
    number; the line saying so, or None for a readable or missing tracker."""
    if not folder:
        return None
    tracker = os.path.join(folder, TRACKER)
    try:
        with open(tracker, "rb") as fh:
            int(fh.read().decode())  # what verl's find_latest_ckpt_path does with it
        return None
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:  # UnicodeDecodeError is a ValueError
        why = " ".join(str(err).split())[:120] or type(err).__name__
    aside = f"{tracker}{CORRUPT_SUFFIX}{time.strftime('%Y%m%dT%H%M%S')}"
    os.replace(tracker, aside)
    return (
        f"verl's checkpoint tracker {TRACKER} unreadable ({why}), moved aside to "
        f"{os.path.basename(aside)}: training from scratch"
    )


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
