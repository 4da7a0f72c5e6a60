"""What a sweep's VeRL jobs need from a cluster's nodes: the paths they read and write outside
their own processes, as the nodes see them, and what a node must run (``node_requirements.py``).

What must be shared between a cluster's nodes is exactly what the job builder (``jobs.py``) puts
into a trial's overrides: the checkpoint root, the data files, the model folders (or the Hub
names the nodes download). Read from there, so the checks and the jobs cannot disagree:
``unshared_settings`` refuses the settings no other node could share (before a cluster pdm did not
start is sent a job), ``shared_inputs`` is what ``pdm cluster check`` proves from every node.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

from pdmask.backends.verl.jobs import _data_files, _model_path, on_cpu
from pdmask.backends.verl.jobs_setup import JobSettings
from pdmask.backends.verl.node_requirements import node_versions, training_nodes
from pdmask.errors import Problem
from pdmask.registry import CLUSTERS, Trial
from pdmask.registry import MODELS as CATALOG

CHECKPOINTS = "PDM_VERL_CHECKPOINT_DIR"
DATA = "PDM_DATA_DIR"
MODELS = "PDM_MODEL_ROOT"


def shared_inputs(
    settings: JobSettings, cluster: str, trials: list[Trial] | tuple[Trial, ...] | None = None
) -> dict[str, Any]:
    """What ``pdm cluster check`` proves from every node (``CheckSpec.of``):

    ``checkpoint_root`` (None when unset), ``data_files``, ``model_root``, ``model_paths`` (the
    folders of the trials' models that are paths), ``hub_models`` (the Hub names the nodes
    download: no model root), ``data_built_here`` (the CPU profile's tiny task, built by pdm before
    submission), ``versions`` (what every node must run), ``training`` (what a node running the
    jobs' workers must have); ``checkpoint_need_bytes`` and ``checkpoint_written`` are the job
    batch's (``VerlJobBatch.node_inputs``: a sweep's need).
    ``trials``: None for every catalog model that runs on ``cluster`` (those pdm builds aside)."""
    files = _data_files(settings, cluster)
    if trials is None:  # every model the profile runs that comes from outside (a trial's
        kind = CLUSTERS[cluster].gpu_kind  # model is all ``_model_path`` reads of it)
        trials = [
            Trial.model_construct(model=m)
            for m, spec in CATALOG.items()
            if kind in spec.gpu_needs and not spec.built_here
        ]
    places = {_model_path(t, settings) for t in trials}
    models = {p for p in places if Path(p).is_absolute()}
    if on_cpu(cluster) and not trials:  # no sweep: the tiny model pdm builds for CPU profiles
        from pdmask.backends.verl.tiny_model import built_files

        models.add(str(built_files()["model"]))
    return {
        # unset: the submitter's state folder, which only the submitter sees (refused remotely)
        "checkpoint_root": str(settings.checkpoint_dir) if settings.checkpoint_dir else None,
        "data_files": [str(files["train"]), str(files["val"])],
        "model_root": settings.model_root,
        "model_paths": sorted(models),
        "hub_models": sorted(places - models),
        "data_built_here": on_cpu(cluster),
        "versions": node_versions(),
        "training": training_nodes(cluster),
        "checkpoint_need_bytes": None,  # no sweep: the space is not checked
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
