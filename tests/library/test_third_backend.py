"""A third backend plugs in as one module plus one spec, and a sweep trains on it for real.

``tests/fixtures/backends/pdm_bandit_backend.py`` is the module; the spec is registered here.
Nothing else of pdmask knows the name: the registry's checks, the plan, the runner's launch, the
Tune worker and the tracking all go through ``registry.backends`` and ``backends.interface``.
Real parts: an embedded local Ray started in this process, a sqlite MLflow store.
"""

from __future__ import annotations

import pytest

from pdmask.errors import BackendUnavailable, ValidationFailed
from pdmask.registry import load_registry, plan_rows, register_backend
from pdmask.registry.backends import BACKENDS, BackendSpec
from tests.library.conftest import fixture_backend_project

pytestmark = [pytest.mark.slow, pytest.mark.processes]

SWEEP = """\
name: bandit-smoke
description: "Two recipes on the bandit backend."
backend: bandit
profile: smoke
seeds: 2
grid:
  method: [dppo-topk-kl, pdm-agg]
  model: [qwen3-4b-base]
  precision: [bf16]
  delta: [0.05]
"""


@pytest.fixture
def bandit(tmp_path):
    """A project with a bandit sweep, the backend registered in this process, and its module
    importable here and in the Ray workers this process starts."""
    with fixture_backend_project(tmp_path, "pdm_bandit_backend", {"bandit-smoke": SWEEP}):
        yield tmp_path


def test_the_registry_checks_and_plans_a_registered_backend(bandit):
    reg = load_registry()
    trials = reg.expand("bandit-smoke")
    assert {t.backend for t in trials} == {"bandit"} and len(trials) == 4
    assert {r.resources for r in plan_rows(trials)} == {"1 CPU"}
    # A recipe input the spec does not supply is refused.
    source = (bandit / "recipes" / "dppo_topk_kl.py").read_text()
    (bandit / "recipes" / "full_kl.py").write_text(
        source.replace('"dppo-topk-kl"', '"full-kl"').replace(
            '("behaviour_topk",)', '("behaviour_full",)'
        )
    )
    (bandit / "sweeps" / "bandit-full.yaml").write_text(
        SWEEP.replace("bandit-smoke", "bandit-full").replace("dppo-topk-kl", "full-kl")
    )
    with pytest.raises(ValidationFailed, match="backend 'bandit' cannot supply"):
        load_registry().expand("bandit-full")


def test_the_backends_own_check_runs_before_anything_launches(bandit):
    from pdmask import SweepOptions
    from pdmask.api import plan

    (bandit / "sweeps" / "bandit-smoke.yaml").write_text(
        SWEEP.replace("profile: smoke", "profile: full")
    )
    with pytest.raises(ValidationFailed, match="the bandit has no profile 'full'"):
        plan(load_registry(), "bandit-smoke", SweepOptions())


def test_a_spec_without_its_runtime_is_a_clear_error():
    from pdmask.backends.interface import load_backend

    spec = BackendSpec(
        name="ghost",
        summary="no module",
        runtime="pdm_no_such_backend:BACKEND",
        supplies=frozenset(),
        mu_sources=("rollout",),
        launch=BACKENDS["sim"].launch,
        occupies=BACKENDS["sim"].occupies,
    )
    with pytest.raises(BackendUnavailable, match="ghost.*pdm_no_such_backend"):
        load_backend(spec)
    with pytest.raises(ValueError, match="already registered"):
        register_backend(BackendSpec(**{**BACKENDS["sim"].__dict__, "summary": "another"}))


def test_a_sweep_trains_on_the_third_backend_through_the_library(bandit):
    import pdmask

    result = pdmask.run_sweep("bandit-smoke", pdmask.SweepOptions(figures=False))
    assert result.ok, result
    from mlflow.tracking import MlflowClient

    client = MlflowClient(result.tracking_uri)
    experiment = client.get_experiment_by_name("bandit-smoke")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 4 and {r.info.status for r in runs} == {"FINISHED"}
    masked = []
    for run in runs:
        assert run.data.tags["pdm.backend"] == "bandit"
        acc = [
            m.value
            for m in client.get_metric_history(run.info.run_id, "val-core/bandit/acc/mean_at_16")
        ]
        assert len(acc) == 7 and acc[-1] > acc[0], acc  # it learned: steps 0..6
        history = client.get_metric_history(run.info.run_id, "actor/pdm/masked_frac")
        masked.append(max(m.value for m in history))
    assert max(masked) > 0, masked  # the recipes' masks acted on the later passes


def test_a_tune_setting_that_fails_deterministically_stops_after_its_canary(tmp_path, monkeypatch):
    """The same gate on Ray Tune: pdm-agg's canary fails once with an ImportError (not
    retried), its other seed never starts, dppo-topk-kl trains both, exit code 1."""
    from mlflow.tracking import MlflowClient
    from pdm_bandit_backend import IMPORT_ERROR_ENV

    import pdmask

    sweep = SWEEP.replace("name: bandit-smoke", "name: bandit-canary").replace(
        "seeds: 2", "seeds: 2\nretries: 2\nmax_concurrent: 1"
    )
    monkeypatch.setenv(IMPORT_ERROR_ENV, "pdm-agg")
    with fixture_backend_project(tmp_path, "pdm_bandit_backend", {"bandit-canary": sweep}):
        trials = load_registry().expand("bandit-canary")
        result = pdmask.run_sweep("bandit-canary", pdmask.SweepOptions(figures=False))
    assert result.exit_code == 1, result.outcome
    client = MlflowClient(result.tracking_uri)
    experiment = client.get_experiment_by_name("bandit-canary")
    runs = {
        r.data.tags["pdm.trial_hash"]: r for r in client.search_runs([experiment.experiment_id])
    }
    agg = [t for t in trials if t.method == "pdm-agg"]
    (canary,) = [runs[t.trial_hash] for t in agg if t.trial_hash in runs]
    assert canary.data.tags["pdm.attempts"] == "1" and canary.info.status == "FAILED"
    assert canary.data.tags["pdm.failure_kind"] == "import"
    assert len(runs) == 3 and all(
        runs[t.trial_hash].info.status == "FINISHED" for t in trials if t.method != "pdm-agg"
    )
    (stopped,) = result.outcome.stopped
    assert stopped["not_started"] == 1 and "ImportError" in stopped["error"]
    assert result.outcome.not_started == 1 and result.outcome.interrupted == 0
