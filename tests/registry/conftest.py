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
    """A scratch copy of the project's registry folders (recipes, sweeps, dashboards)."""
    for name in ("recipes", "sweeps", "dashboards"):
        shutil.copytree(ROOT / name, tmp_path / name)
    return tmp_path


def pdm(
    *args: str, project: Path | None = None, check: bool = False
) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if project is not None:
        env["PDM_PROJECT"] = str(project)
        env["PDM_HOME"] = str(project / ".pdm")
    return subprocess.run(
        [sys.executable, "-m", "pdmask", *args],
        capture_output=True,
        text=True,
        env=env,
        check=check,
        cwd=project or ROOT,
    )
