"""What `pdm clean` may remove from the state folder, and removing it.

Three kinds of leftovers pile up there, and each is removed only when nothing can still need it:

- **checkpoints**: a trial's work folder (``<state>/trials/<trial hash>/``, ``workdirs.py``) whose
  owner run (``owner.json``) is FINISHED in this tracking store. A finished trial is skipped by
  every later sweep, so its checkpoint is never read again. A folder of a run in any other state
  (RUNNING, KILLED, FAILED: resumable from it), of a run this store does not hold, or whose
  trial's claim a live process holds (``claims.py``) is kept; the claim is taken while the
  folder is removed, so no trial can start in it meanwhile.
- **Ray sessions**: ``session_*`` folders under the embedded Ray's temp folder
  (``paths.ray_temp_dir``), except one a live process names on its command line (Ray's GCS,
  raylet and workers are started with the session's name or folder: the session
  ``session_latest`` points to while its Ray runs) and one where anything changed in the last
  ``RECENT_S`` seconds.
- **Tune folders**: each invocation's experiment folder under ``<state>/ray_results/``
  (``runner.py`` names it ``<sweep>-<time>-<pid>``), unless that pid is alive or it changed
  recently.
- **cluster checkpoints**: VeRL trials' saves under the checkpoint root
  (``PDM_VERL_CHECKPOINT_DIR``, else ``<state>/checkpoints/verl``:
  ``<root>/<sweep>/<trial hash>/global_step_<n>/actor/``), by the same rule as the state
  folder's: only a trial all of whose runs in this store are FINISHED (nothing of a RUNNING,
  KILLED or FAILED run, nor of a trial this store has no run of). Such a trial keeps its last
  save's weights, the retention of ``registry/cost.py``: its HF weights where the save wrote
  them (``huggingface/*.safetensors``), else its model shards; its optimizer state and extra
  state, and every older save, go (verl resumes from them, and a finished trial never resumes).
  A save of verl's Megatron engine keeps ``model/`` (its HF weights) and loses its
  ``optimizer/`` and ``extra/`` folders.

Nothing outside the state folder and the checkpoint root is touched: a candidate that is a
symlink, or that resolves to a path outside them, is never a candidate. ``shutil.rmtree`` does
not follow links inside a folder.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from pdmask.orchestration.claims import Claim, claim_held
from pdmask.orchestration.workdirs import OWNER_FILE
from pdmask.paths import ray_temp_dir, state_dir, tune_results_dir

RECENT_S = 600  # a session or Tune folder changed this recently may belong to a starting sweep
CHECKPOINT, RAY_SESSION, TUNE = "checkpoint", "ray session", "tune folder"
CLUSTER_CHECKPOINT = "cluster checkpoint"
STEP_PREFIX = "global_step_"  # verl's save folders (checkpoint_manager.find_latest_ckpt_path)
# verl 0.9.1 FSDP shards (fsdp_checkpoint_manager.py): what only a resume reads
RESUME_ONLY = ("optim_world_size_", "extra_state_world_size_")
MODEL_SHARDS = "model_world_size_"
# verl 0.9.1's Megatron saves (megatron_checkpoint_manager.py, layout v2): the folders only a
# resume reads (the optimizer's and the RNG states' dist_checkpointing shards)
MEGATRON_RESUME_ONLY = ("optimizer", "extra")


@dataclass(frozen=True)
class Leftover:
    """A folder `pdm clean` looked at: removable, or kept with the reason (``kept``)."""

    kind: str
    path: Path
    size: int
    note: str  # what it belongs to
    kept: str | None = None  # why it stays; None: removable
    trial_hash: str | None = None
    # a trial's cluster checkpoint: what goes (the rest of ``path`` stays); None: all of it
    prune: tuple[Path, ...] | None = None


def human_size(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def _tree(path: Path) -> tuple[int, float]:
    """(bytes, newest mtime) of everything under ``path``, links not followed."""
    size, newest = 0, path.lstat().st_mtime
    for root, dirs, files in os.walk(path, followlinks=False):
        for name in dirs + files:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:  # removed while we looked
                continue
            size += st.st_size if name in files else 0
            newest = max(newest, st.st_mtime)
    return size, newest


def _prunable(trial: Path, root: Path) -> list[Path]:
    """What a finished trial's folder holds beyond its last save's weights."""
    steps = sorted(
        (p for p in _subfolders(trial, root) if p.name.startswith(STEP_PREFIX)),
        key=lambda p: int(p.name.removeprefix(STEP_PREFIX) or 0),
    )
    if not steps:
        return []
    out = steps[:-1]
    actor = steps[-1] / "actor"
    if _inside_state(actor, root):
        hf_weights = any((actor / "huggingface").glob("*.safetensors"))
        gone = RESUME_ONLY + ((MODEL_SHARDS,) if hf_weights else ())
        out += sorted(p for p in actor.iterdir() if p.is_file() and p.name.startswith(gone))
        out += [actor / name for name in MEGATRON_RESUME_ONLY if _inside_state(actor / name, root)]
    return out


def _size(path: Path) -> int:
    return _tree(path)[0] if path.is_dir() else path.lstat().st_size


def _cluster_checkpoints(root: Path, client) -> list[Leftover]:
    """Each trial folder under the checkpoint root: what its last save does not need."""
    from pdmask.tracking.runs import runs_by_hash

    out = []
    if root.is_symlink() or not root.is_dir():
        return out
    sweeps = sorted(p for p in root.iterdir() if _inside_state(p, root))
    for sweep in sweeps:
        experiment = client.get_experiment_by_name(sweep.name) if client else None
        runs = runs_by_hash(client, experiment.experiment_id) if experiment else {}
        for trial in _subfolders(sweep, root):
            statuses = sorted({r.info.status for r in runs.get(trial.name, [])})
            kept = None
            if not statuses:
                kept = "no run of this trial in this store"
            elif statuses != ["FINISHED"]:
                kept = (
                    f"run {', '.join(s for s in statuses if s != 'FINISHED')} (resumable from it)"
                )
            prune = tuple(_prunable(trial, root))
            if kept is None and not prune:
                continue  # nothing left to free
            size = sum(_size(p) for p in prune)
            note = f"{sweep.name}/{trial.name[:12]}: last save's weights stay"
            out.append(Leftover(CLUSTER_CHECKPOINT, trial, size, note, kept, None, prune))
    return out


def _inside_state(path: Path, state: Path) -> bool:
    if path.is_symlink() or not path.is_dir():
        return False
    real = path.resolve()
    return real != state and real.is_relative_to(state)


def _subfolders(folder: Path, state: Path) -> list[Path]:
    if not _inside_state(folder, state):
        return []
    return sorted(p for p in folder.iterdir() if _inside_state(p, state))


def _checkpoints(state: Path, client, where: str) -> list[Leftover]:
    out = []
    for folder in _subfolders(state / "trials", state):  # workdirs.trial_workdir
        size, _ = _tree(folder)
        trial_hash = folder.name
        try:
            owner = json.loads((folder / OWNER_FILE).read_text())
        except (OSError, ValueError):
            owner = None
        kept, note = None, trial_hash[:12]
        run = None
        if owner is None:
            kept = "no owner run recorded"
        elif owner.get("tracking") != where:
            kept = f"tracked in another store ({owner.get('tracking')})"
        else:
            run = _run(client, owner.get("run_id"))
            if run is None:
                kept = "its run is not in this store"
            else:
                note = run.info.run_name or note
                if run.data.tags.get("pdm.trial_hash") != trial_hash:
                    kept = "its run belongs to another trial"
                elif run.info.status != "FINISHED":
                    kept = f"run {run.info.status} (resumable from it)"
        if kept is None and claim_held(trial_hash):
            kept = "a live process holds the trial (training it now)"
        out.append(Leftover(CHECKPOINT, folder, size, note, kept, trial_hash))
    return out


def _run(client, run_id: str | None):
    if client is None or not run_id:
        return None
    try:
        return client.get_run(run_id)
    except Exception:  # deleted, or never in this store
        return None


def _live_command_lines() -> list[str] | None:
    """Every live process's command line; None where the system has no ``/proc``."""
    if not Path("/proc/self/cmdline").exists():
        return None
    lines = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                lines.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode())
            except (OSError, UnicodeDecodeError):
                continue
    return lines


def _sessions(state: Path, now: float) -> list[Leftover]:
    try:  # the same folder, reached through the resolved state folder (a linked .pdm)
        root = state / ray_temp_dir().relative_to(state_dir())
    except ValueError:  # Ray's temp folder is outside the state folder: not ours to clean
        return []
    folders = [p for p in _subfolders(root, state) if p.name.startswith("session_")]
    if not folders:
        return []
    commands = _live_command_lines()
    out = []
    for folder in folders:
        size, newest = _tree(folder)
        kept = None
        # Ray's processes name their session (--session-name, --session-dir, --log-dir)
        if commands is None:
            kept = "cannot tell whether a live Ray uses it (no /proc)"
        elif any(folder.name in line for line in commands):
            kept = "a live Ray uses it"
        elif now - newest < RECENT_S:
            kept = f"changed in the last {RECENT_S // 60} minutes"
        out.append(Leftover(RAY_SESSION, folder, size, "an ended Ray", kept))
    return out


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def _tune_folders(state: Path, now: float) -> list[Leftover]:
    out = []
    for folder in _subfolders(tune_results_dir(), state):
        size, newest = _tree(folder)
        tail = folder.name.rsplit("-", 1)[-1]
        kept = None
        if tail.isdigit() and _pid_alive(int(tail)):
            kept = f"its sweep (pid {tail}) is running"
        elif now - newest < RECENT_S:
            kept = f"changed in the last {RECENT_S // 60} minutes"
        sweep = folder.name.rsplit("-", 3)[0]  # runner.py: <sweep>-<date>-<time>-<pid>
        out.append(Leftover(TUNE, folder, size, f"a run of {sweep}", kept))
    return out


def find_leftovers(
    tracking_uri: str | None = None, checkpoint_root: Path | None = None
) -> list[Leftover]:
    """Every folder `pdm clean` considers, removable or kept (with why). Writes nothing.
    ``checkpoint_root``: the cluster checkpoint root (the VeRL backend's; None: not looked at)."""
    from pdmask.tracking.store import open_client, redact, resolve_tracking_uri, sqlite_path

    state = state_dir().resolve()
    uri = resolve_tracking_uri(tracking_uri)
    client = None
    if not uri.startswith("sqlite:") or sqlite_path(uri).exists():  # never create a store
        client = open_client(uri)
    now = time.time()
    return [
        *_checkpoints(state, client, redact(uri)),
        *_sessions(state, now),
        *_tune_folders(state, now),
        *(_cluster_checkpoints(checkpoint_root.resolve(), client) if checkpoint_root else []),
    ]


def remove(leftovers: list[Leftover]) -> int:
    """Delete the removable ones; the bytes freed. A checkpoint is removed under its trial's
    claim (skipped if a trial took it since it was found)."""
    state = state_dir().resolve()
    freed = 0
    for item in leftovers:
        if item.kept is None and item.prune is not None:
            for path in item.prune:  # each inside its trial's folder, found without links
                if path.is_symlink() or not path.resolve().is_relative_to(item.path.resolve()):
                    continue
                size = _size(path)
                shutil.rmtree(path) if path.is_dir() else path.unlink()
                freed += size
            continue
        if item.kept is not None or not _inside_state(item.path, state):
            continue
        if item.trial_hash is not None:
            with Claim(item.trial_hash, wait=0) as ours:
                if not ours:
                    continue
                shutil.rmtree(item.path, ignore_errors=True)
        else:
            shutil.rmtree(item.path, ignore_errors=True)
        if not item.path.exists():
            freed += item.size
    return freed
