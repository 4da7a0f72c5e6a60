"""The paths a sweep's VeRL jobs read and write outside their own processes, as the nodes see them.

What must be shared between a cluster's nodes is exactly what the job builder (``jobs.py``) puts
into a trial's overrides: the checkpoint root, the data files, the model folders. Read from there,
so the checks and the jobs cannot disagree: ``unshared_settings`` refuses the settings no other
node could share (before a cluster pdm did not start is sent a job), ``shared_inputs`` is what
``pdm cluster check`` proves from every node.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

from pdmask.backends.verl.jobs import _data_files, _model_path, on_cpu
from pdmask.backends.verl.jobs_setup import JobSettings
from pdmask.errors import Problem
from pdmask.registry import Trial

CHECKPOINTS = "PDM_VERL_CHECKPOINT_DIR"
DATA = "PDM_DATA_DIR"
MODELS = "PDM_MODEL_ROOT"


def shared_inputs(
    settings: JobSettings, cluster: str, trials: list[Trial] | tuple[Trial, ...] = ()
) -> dict[str, Any]:
    """``checkpoint_root`` (None when unset), ``data_files``, ``model_root``, ``model_paths`` (the folders of the
    trials' models that are paths, not Hub names) and ``data_built_here`` (the CPU profile's
    tiny task, built by pdm before submission)."""
    files = _data_files(settings, cluster)
    models = {p for t in trials if Path(p := _model_path(t, settings)).is_absolute()}
    if on_cpu(cluster) and not trials:  # no sweep: the tiny model pdm builds for CPU profiles
        from pdmask.backends.verl.tiny_model import built_files

        models.add(str(built_files()["model"]))
    return {
        # unset: the submitter's state folder, which only the submitter sees (refused remotely)
        "checkpoint_root": str(settings.checkpoint_dir) if settings.checkpoint_dir else None,
        "data_files": [str(files["train"]), str(files["val"])],
        "model_root": settings.model_root,
        "model_paths": sorted(models),
        "data_built_here": on_cpu(cluster),
    }


def unshared_settings(
    *,
    checkpoint_dir: str | None,
    data_dir: str | None,
    model_root: str | None,
    data_built_here: bool = False,
) -> list[Problem]:
    """Every path setting a cluster's nodes cannot share, as problems naming it and the fix.

    ``data_built_here``: the jobs read inputs pdm builds on this machine (the CPU profile's tiny
    task), at paths the per-node check proves; ``PDM_DATA_DIR`` is then not needed."""
    problems = []
    if not checkpoint_dir:
        problems.append(
            Problem(
                CHECKPOINTS,
                "(unset)",
                "checkpoints would go to this machine's state folder, where no other node sees "
                "them (a retried job would start again from step 0): set it to a folder on "
                "storage every node can write, e.g. /shared/pdm-checkpoints",
            )
        )
    elif why := _path_problem(checkpoint_dir):
        problems.append(Problem(CHECKPOINTS, checkpoint_dir, why))
    if not data_dir and not data_built_here:
        problems.append(
            Problem(
                DATA,
                "(unset)",
                "the jobs would read the data from this machine's state folder: set it to the "
                "folder of `pdm data prepare`'s files on storage every node reads",
            )
        )
    elif data_dir and (why := _path_problem(data_dir)):
        problems.append(Problem(DATA, data_dir, why))
    if model_root and (why := _path_problem(model_root)):
        problems.append(Problem(MODELS, model_root, why))
    return problems


def _path_problem(value: str) -> str | None:
    if not PurePosixPath(value).is_absolute():
        return "a relative path: each node would resolve it against its own working folder; give an absolute path on shared storage"
    return None
