"""A scratch project (its own registry folders and state folder) and `pdm` run in-process."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pdmask.cli import app

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def project(tmp_path: Path, monkeypatch) -> Path:
    """A copy of recipes/, sweeps/ and dashboards/, used as the project root, state in .pdm/."""
    for name in ("recipes", "sweeps", "dashboards"):
        shutil.copytree(ROOT / name, tmp_path / name)
    monkeypatch.setenv("PDM_PROJECT", str(tmp_path))
    monkeypatch.setenv("PDM_HOME", str(tmp_path / ".pdm"))
    for var in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path


def pdm(*args: str, env: dict[str, str] | None = None):
    """`pdm ARGS` through typer's test runner: the result has exit_code, stdout and stderr."""
    return CliRunner().invoke(app, list(args), env=env)


def pdm_process(*args: str, env: dict[str, str], **popen) -> subprocess.Popen:
    """`pdm ARGS` as a user runs it: its own process (`python -m pdmask`)."""
    return subprocess.Popen(
        [sys.executable, "-m", "pdmask", *args], env={**os.environ, **env}, text=True, **popen
    )
