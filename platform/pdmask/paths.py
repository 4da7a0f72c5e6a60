"""Where pdmask finds the project's files and where it writes.

- The **project root** holds ``recipes/``, ``sweeps/`` and ``dashboards/``. It is ``$PDM_PROJECT``
  if set, else the nearest folder at or above the current directory that has ``recipes/`` and
  ``sweeps/``, else the source checkout this package was installed from (editable installs).
- The **state folder** is ``$PDM_HOME`` if set, else ``<project root>/.pdm``. Everything pdmask
  writes by default goes there: the sqlite MLflow store, its artifacts, checkpoints, caches,
  figures.
- The **model cache** holds the models pdmask builds itself (the embedded backend's base models,
  the tiny Qwen3 of the VeRL-on-CPU path): ``$PDM_MODEL_CACHE`` if set, else the state folder's
  ``cache/``. Each is named by the hash of everything that shapes it and built under a lock or
  renamed into place when complete, so several state folders (the test suite's projects, two
  checkouts) can share one cache and build each model once.
"""

from __future__ import annotations

import os
from pathlib import Path


def _looks_like_project(path: Path) -> bool:
    return (path / "recipes").is_dir() and (path / "sweeps").is_dir()


def project_root() -> Path:
    """The project root (see the module docstring).

    Raises:
        ConfigError: ``$PDM_PROJECT`` names a folder that does not exist.
    """
    env = os.environ.get("PDM_PROJECT")
    if env:
        path = Path(env).expanduser().resolve()
        if not path.is_dir():
            from pdmask.errors import ConfigError

            what = "is not a folder" if path.exists() else "does not exist"
            raise ConfigError(
                f"PDM_PROJECT={env}: {path} {what}; point it at the folder holding recipes/ "
                "and sweeps/, or unset it to use the current folder's project"
            )
        return path
    here = Path.cwd().resolve()
    for candidate in (here, *here.parents):
        if _looks_like_project(candidate):
            return candidate
    checkout = Path(__file__).resolve().parents[2]
    if _looks_like_project(checkout):
        return checkout
    return here


def state_dir() -> Path:
    env = os.environ.get("PDM_HOME")
    path = Path(env).resolve() if env else project_root() / ".pdm"
    path.mkdir(parents=True, exist_ok=True)
    return path


def model_cache_dir() -> Path:
    env = os.environ.get("PDM_MODEL_CACHE")
    path = Path(env).resolve() if env else state_dir() / "cache"
    path.mkdir(parents=True, exist_ok=True)
    return path


def default_tracking_uri() -> str:
    """A sqlite MLflow store inside the state folder (MLflow 3.17 refuses the plain file store)."""
    return f"sqlite:///{state_dir() / 'mlflow.db'}"


def logs_dir() -> Path:
    """Every trial's log, ``<logs>/<sweep>/<run name>.<hash>.log`` (see orchestration/trial_logs.py)."""
    return state_dir() / "logs"


def ray_temp_dir() -> Path:
    """The embedded Ray's temp and session folders: inside the state folder, with the rest."""
    return state_dir() / "ray"


def tune_results_dir() -> Path:
    """Ray Tune's experiment folders (one per `pdm sweep` invocation), not ``~/ray_results``."""
    return state_dir() / "ray_results"


def default_artifact_root() -> Path:
    path = state_dir() / "mlartifacts"
    path.mkdir(parents=True, exist_ok=True)
    return path
