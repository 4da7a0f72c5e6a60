from __future__ import annotations

import shutil
import subprocess
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
    """`pdm ARGS` in-process through typer's test runner (these tests check flags, plans and
    error reports, not processes), as a CompletedProcess: returncode, stdout, stderr."""
    from typer.testing import CliRunner

    from pdmask.cli import app

    env = {"PDM_PROJECT": str(project or ROOT), "PDM_HOME": str((project or ROOT) / ".pdm")}
    result = CliRunner().invoke(app, list(args), env=env)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    done = subprocess.CompletedProcess(
        ["pdm", *args], result.exit_code, result.stdout, result.stderr
    )
    if check:
        done.check_returncode()
    return done
