"""A scratch project per test and `pdm` in a subprocess (the store checks need no training)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    for name in ("recipes", "sweeps", "dashboards"):
        shutil.copytree(ROOT / name, tmp_path / name)
    (tmp_path / ".pdm").mkdir()
    return tmp_path


def pdm(
    project: Path, *args: str, timeout: float = 300
) -> tuple[subprocess.CompletedProcess, float]:
    """Run `pdm` in ``project``; returns the result and its wall-clock seconds."""
    env = dict(os.environ, PDM_PROJECT=str(project), PDM_HOME=str(project / ".pdm"))
    env.pop("MLFLOW_TRACKING_URI", None)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pdmask", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=project,
        timeout=timeout,
    )
    return done, time.monotonic() - started


def nothing_launched(project: Path) -> bool:
    state = project / ".pdm"
    return not (state / "ray_results").exists() and not (state / "trials").exists()
