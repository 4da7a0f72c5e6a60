"""A smoke sweep driven the way a notebook would: `pdmask.run_sweep`, no CLI, no subprocess.

Real parts: an embedded local Ray started in this process, a sqlite MLflow store, the sim backend
training at the smoke profile.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.processes]

ROOT = Path(__file__).resolve().parents[2]
EVAL = "val-core/synth/acc/mean_at_16"


@pytest.fixture
def notebook(tmp_path, monkeypatch):
    """A project folder the notebook runs in (its own registry files and state folder)."""
    for name in ("recipes", "sweeps", "dashboards"):
        shutil.copytree(ROOT / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)  # the project is found from the working folder, as in Jupyter
    for var in ("PDM_PROJECT", "PDM_HOME", "MLFLOW_TRACKING_URI", "RAY_ADDRESS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    return tmp_path


def test_a_notebook_runs_and_resumes_a_smoke_sweep(notebook, capsys):
    import pdmask

    options = pdmask.SweepOptions(profile="smoke", max_concurrent=2, figures=False)
    result = pdmask.run_sweep("smoke", options)

    assert result.ok, result
    assert result.tracking_uri == f"sqlite:///{notebook / '.pdm' / 'mlflow.db'}"
    hashes = {t.trial_hash for t in result.trials}
    assert len(hashes) == 2
    assert result.statuses() == dict.fromkeys(hashes, "done")

    from mlflow.tracking import MlflowClient

    from pdmask.registry import load_registry

    client = MlflowClient(result.tracking_uri)
    experiment = client.get_experiment_by_name("smoke")
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    assert experiment.tags["mlflow.note.content"] == load_registry().sweep("smoke").description
    runs = client.search_runs([experiment.experiment_id])
    assert {r.data.tags["pdm.trial_hash"] for r in runs} == hashes
    assert {r.info.status for r in runs} == {"FINISHED"}
    for run in runs:
        assert run.data.tags["pdm.backend"] == "sim"
        history = client.get_metric_history(run.info.run_id, EVAL)
        assert history and all(0.0 <= m.value <= 1.0 for m in history)
        assert client.get_metric_history(run.info.run_id, "critic/score/mean"), "no RL step"

    # The same call again resumes: every trial is found finished by its hash, nothing reruns.
    capsys.readouterr()
    again = pdmask.run_sweep("smoke", options)
    assert again.ok
    assert "2 already finished, 0 to run" in capsys.readouterr().out
    assert len(client.search_runs([experiment.experiment_id])) == 2


def test_the_library_never_imports_the_cli():
    modules = [
        "pdmask.api",
        "pdmask.orchestration.runner",
        "pdmask.orchestration.tune.progress",
        "pdmask.orchestration.jobs.job_loop",
        "pdmask.tracking.ui",
    ]
    code = f"import importlib, sys\nfor m in {modules!r}: importlib.import_module(m)\n"
    code += "print('CLI', sorted(m for m in sys.modules if m.startswith('pdmask.cli')))\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "CLI []" in done.stdout


def test_bad_options_fail_before_anything_runs(notebook):
    import pydantic

    import pdmask
    from pdmask.errors import ValidationFailed

    with pytest.raises(ValidationFailed, match="unknown profile 'tiny'"):
        pdmask.run_sweep("smoke", pdmask.SweepOptions(profile="tiny"))
    with pytest.raises(pydantic.ValidationError, match="max_concurrent"):
        pdmask.SweepOptions(max_concurrent=0)
    with pytest.raises(pydantic.ValidationError, match="no_figures"):
        pdmask.SweepOptions(no_figures=True)  # a misspelt option is an error, not ignored
    assert not (notebook / ".pdm" / "mlflow.db").exists()
