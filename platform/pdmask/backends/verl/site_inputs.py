"""The paths a sweep's VeRL jobs read and write outside their own processes, as the nodes see them.

What must be shared between a cluster's nodes (``orchestration/shared_storage.py`` refuses what
cannot be, ``pdm cluster check`` proves the rest from every node) is exactly what the job builder
(``jobs.py``) puts into a trial's overrides: the checkpoint root, the data files, the model folders.
Read from there, so the check and the jobs cannot disagree.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pdmask.backends.verl.jobs import _data_files, _model_path, on_cpu
from pdmask.backends.verl.jobs_setup import JobSettings
from pdmask.registry import Trial


def shared_inputs(
    settings: JobSettings, cluster: str, trials: list[Trial] | tuple[Trial, ...] = ()
) -> dict[str, Any]:
    """``checkpoint_root`` (None when unset), ``data_files``, ``model_root``, ``model_paths`` (the folders of the
    trials' models that are paths, not Hub names) and ``data_built_here`` (the CPU profile's
    tiny task, built by pdm before submission)."""
    files = _data_files(settings, cluster)
    models = {p for t in trials if Path(p := _model_path(t, settings)).is_absolute()}
    if on_cpu(cluster):  # every CPU trial trains the tiny model pdm builds with its task
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
