"""A project whose sweeps train on a fixture backend (``tests/fixtures/backends``), for the
library tests that plug a backend in as one module plus one spec."""

from __future__ import annotations

import importlib
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

import pytest

from pdmask.registry import register_backend
from pdmask.registry.backends import unregister_backend

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "backends"


@contextmanager
def fixture_backend_project(tmp_path: Path, module: str, sweeps: dict[str, str]):
    """``tmp_path`` as a project with the shipped recipes, sweeps and dashboards plus ``sweeps``
    (file stem -> YAML), the spec of fixture module ``module`` registered in this process, the
    module importable here and in every process this one starts (Ray workers, Ray jobs), and
    no state folder, store or Ray address inherited from the caller's environment."""
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(FIXTURES))
        mp.setenv("PYTHONPATH", os.pathsep.join([str(FIXTURES), os.environ.get("PYTHONPATH", "")]))
        spec = importlib.import_module(module).SPEC
        register_backend(spec)
        for name in ("recipes", "sweeps", "dashboards"):
            shutil.copytree(ROOT / name, tmp_path / name)
        for stem, text in sweeps.items():
            (tmp_path / "sweeps" / f"{stem}.yaml").write_text(text)
        mp.chdir(tmp_path)
        for var in ("PDM_PROJECT", "PDM_HOME", "MLFLOW_TRACKING_URI", "RAY_ADDRESS"):
            mp.delenv(var, raising=False)
        mp.setenv("RAY_AUTH_MODE", "disabled")
        mp.setenv("RAY_USAGE_STATS_ENABLED", "0")
        try:
            yield tmp_path
        finally:
            unregister_backend(spec.name)
