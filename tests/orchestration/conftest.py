"""Helpers for sweep tests: a scratch project, `pdm` in a subprocess, the runs of a sweep."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    for name in ("recipes", "sweeps", "dashboards"):
        shutil.copytree(ROOT / name, tmp_path / name)
    (tmp_path / ".pdm").mkdir()
    return tmp_path


def env_for(project: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "PDM_PROJECT": str(project),
            "PDM_HOME": str(project / ".pdm"),
            "RAY_AUTH_MODE": "disabled",
            "RAY_USAGE_STATS_ENABLED": "0",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("RAY_ADDRESS", None)
    return env


def pdm(
    project: Path, *args: str, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``env``: variables set on top of the project's (e.g. ``PDM_STALL_SECONDS``)."""
    return subprocess.run(
        [sys.executable, "-m", "pdmask", *args],
        capture_output=True,
        text=True,
        env={**env_for(project), **(env or {})},
        cwd=project,
        timeout=timeout,
    )


def pdm_background(
    project: Path, *args: str, env: dict[str, str] | None = None, **popen
) -> subprocess.Popen:
    """``env``: variables set on top of the project's, as for ``pdm``; ``popen``: more Popen
    arguments, e.g. ``start_new_session=True`` (a process group of its own, to which a test sends
    a Ctrl-C as a terminal does)."""
    return subprocess.Popen(
        [sys.executable, "-m", "pdmask", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**env_for(project), **(env or {})},
        cwd=project,
        **popen,
    )


def sweep_runs(project: Path, sweep: str) -> list:
    client = store_client(project)
    exp = client.get_experiment_by_name(sweep)
    return [] if exp is None else client.search_runs([exp.experiment_id], max_results=1000)


def write_sweep(project: Path, name: str, body: str) -> None:
    (project / "sweeps" / f"{name}.yaml").write_text(
        f"name: {name}\ndescription: test sweep\n{body}"
    )


FOUR_TRIALS = """backend: sim
profile: smoke
seeds: 2
max_concurrent: 1
retries: 2
grid:
  method: [dppo-topk-kl, pdm-agg]
  model: [qwen3-4b-base]
  precision: [bf16]
  delta: [0.15]
"""

ONE_TRIAL = """backend: sim
profile: smoke
seeds: 1
max_concurrent: 1
retries: 2
grid:
  method: [pdm-agg]
  model: [qwen3-4b-base]
  precision: [fp8-rollout]
  delta: [0.15]
"""

TWO_TRIALS = FOUR_TRIALS.replace("seeds: 2", "seeds: 1")


def store_client(project: Path, db: str = "mlflow.db"):
    """A client opened the way pdm opens a store (under its migration lock: see sqlite_client)."""
    from pdmask.tracking.store import sqlite_client

    return sqlite_client(f"sqlite:///{project / '.pdm' / db}")


# A recipe slow enough (about 16 training minibatches x 3 s) that a test can act while its trial
# trains, whatever Ray's start-up takes: two sweeps started together overlap, a fault lands mid-trial.
SLOW = '''"""Trains slowly: each training minibatch takes 3 s more."""

import time

import torch

from pdmask.registry import Recipe


def slow(batch):
    if batch.response_mask.shape[0] > 8:  # a training minibatch, not the validation batch
        time.sleep(3)
    return torch.zeros_like(batch.response_mask)


RECIPE = Recipe(
    name="slow",
    display_name="Slow",
    color="#999999",
    summary=__doc__.splitlines()[0],
    mask=slow,
)
'''
