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
its run already holds are not logged twice).

A step folder whose files are cut short (a disk or shared file system that lost a file's tail
after verl's tracker named the step) would fail verl's ``torch.load`` in every attempt: the
resume checks each kept checkpoint's files first (``damage``, without reading the tensors) and
moves a damaged folder aside, resuming from the newest whole one, or from scratch if none is.
"""

from __future__ import annotations

import json
import os
import re
import struct
import time
import zipfile
from dataclasses import dataclass, field

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


def tracked_step(folder: str) -> int | None:
    """The step verl's tracker names (verl loads its folder), None without a readable tracker."""
    try:
        with open(os.path.join(folder, TRACKER)) as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return None


def kept_checkpoints(folder: str) -> dict[int, str]:
    """step -> path of the complete checkpoints in ``folder`` (none past verl's tracker)."""
    return _steps_up_to(folder, tracked_step(folder))


def _steps_up_to(folder: str, latest: int | None) -> dict[int, str]:
    try:
        names = os.listdir(folder) if latest is not None else []
    except OSError:
        return {}
    found = {}
    for name in names:
        match = STEP_DIR.match(name)
        if match and int(match.group(1)) <= latest:
            found[int(match.group(1))] = os.path.join(folder, name)
    return found


@dataclass(frozen=True)
class ResumePoint:
    """Where a retried job resumes."""

    folder: str | None
    """The checkpoint to resume from, or None for verl's own choice (the tracker's step, or
    nothing: from scratch)."""
    unlogged: list[int] = field(default_factory=list)
    """The steps whose metrics that choice still leaves unlogged."""
    set_aside: list[str] = field(default_factory=list)
    """A line per damaged checkpoint moved aside."""


def resume_point(folder: str, last_logged: int | None) -> ResumePoint:
    """The newest whole kept checkpoint at or before the run's last logged step (verl's own
    choice where that is the tracker's); damaged ones moved aside first. ``last_logged`` None
    (no run yet, or its store unreadable): the newest whole one."""
    tracked = tracked_step(folder)  # verl loads this step's folder, if it is there
    kept = _steps_up_to(folder, tracked)
    if not kept:
        return ResumePoint(None)
    set_aside = []
    for step in sorted(kept, reverse=True):
        if why := damage(kept[step]):
            set_aside.append(_set_aside(kept.pop(step), why))
    if not kept:  # verl finds no folder for its tracker: from scratch
        return ResumePoint(None, [], set_aside)
    latest = max(kept)
    verl_chooses_it = latest == tracked
    if last_logged is None or latest <= last_logged:  # every step up to it is logged
        return ResumePoint(None if verl_chooses_it else kept[latest], [], set_aside)
    usable = [step for step in kept if step <= last_logged]
    if usable:
        return ResumePoint(kept[max(usable)], [], set_aside)
    unlogged = list(range(last_logged + 1, latest + 1))
    return ResumePoint(None if verl_chooses_it else kept[latest], unlogged, set_aside)


def _set_aside(step_folder: str, why: str) -> str:
    aside = f"{step_folder}{CORRUPT_SUFFIX}{time.strftime('%Y%m%dT%H%M%S')}"
    os.replace(step_folder, aside)
    return f"checkpoint {os.path.basename(step_folder)} damaged ({why}), moved aside to {os.path.basename(aside)}"


_ZIP_MAGIC = b"PK"  # torch.save's archive format, verl's shards and data.pt
_SAFETENSORS = ".safetensors"


def damage(step_folder: str) -> str | None:
    """The first damaged file of a checkpoint folder, as ``<relative path>: <why>``; None if
    every file checked is whole.

    Checked without reading the tensors (verl reads them once, when it loads): a torch archive
    (``torch.save``'s zip) must hold its directory and every member's data within the file; a
    safetensors file its header and every tensor the header names; an empty file of either kind
    is damaged. What this catches: a file cut short or emptied. What it cannot: bytes changed in
    place (verl writes no digest); files of other formats (a torch file of the legacy pickle
    format, Megatron's distributed checkpoints) are not checked.
    """
    for root, _, names in sorted(os.walk(step_folder)):
        for name in sorted(names):
            path = os.path.join(root, name)
            if name.endswith(_SAFETENSORS):
                why = _safetensors_damage(path)
            elif name.endswith((".pt", ".pth", ".bin")):
                why = _torch_archive_damage(path)
            else:
                continue
            if why:
                return f"{os.path.relpath(path, step_folder)}: {why}"
    return None


def _torch_archive_damage(path: str) -> str | None:
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            magic = fh.read(len(_ZIP_MAGIC))
        if size == 0:
            return "empty"
        if magic != _ZIP_MAGIC:
            return None  # the legacy format: not checked
        with zipfile.ZipFile(path) as archive:
            for member in archive.infolist():
                if member.header_offset + member.compress_size > size:
                    return f"{member.filename} ends beyond the file's {size} bytes"
    except (OSError, zipfile.BadZipFile) as err:
        return " ".join(str(err).split())[:120] or type(err).__name__
    return None


def _safetensors_damage(path: str) -> str | None:
    try:
        size = os.path.getsize(path)
        if size < 8:
            return "empty" if size == 0 else f"{size} bytes, less than a header's length"
        with open(path, "rb") as fh:
            (length,) = struct.unpack("<Q", fh.read(8))
            if 8 + length > size:
                return f"a header of {length} bytes beyond the file's {size} bytes"
            header = json.loads(fh.read(length))
        ends = [t["data_offsets"][1] for name, t in header.items() if name != "__metadata__"]
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError) as err:
        return " ".join(str(err).split())[:120] or type(err).__name__
    if 8 + length + max(ends, default=0) > size:
        return f"tensor data ends beyond the file's {size} bytes"
    return None
