"""A real sqlite MLflow store holding synthetic sweep runs with exactly known values.

The store is created once per session (MLflow's schema migration takes a couple of seconds);
each test writes its runs into its own experiment (= sweep name) and passes ``sweep=`` to the
builder, and gets its own state folder (so its own history cache).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest

from pdmask.figures.synthetic import EVAL, SyntheticRun, trial_tags, write_runs

_counter = itertools.count()

METHODS = ("grpo-clip-higher", "dppo-topk-kl", "pdm-agg", "pdm-uni")
BASE = {"grpo-clip-higher": 0.10, "dppo-topk-kl": 0.20, "pdm-agg": 0.30, "pdm-uni": 0.29}
T0 = 1_700_000_000_000  # metric timestamps (ms)


def eval_value(method: str, setting: str, seed: int, dataset: str, step: int) -> float:
    """The value every test run logs: simple enough to recompute by hand."""
    offset = {"4b-bf16": 0.0, "8b-bf16": 0.05, "30b-fp8-e2e": 0.1, "30b-fp8-rollout": 0.15}
    tilt = 0.004 if dataset == "aime25" else -0.004
    return BASE[method] + offset[setting] + 0.01 * step + 0.03 * seed + tilt


@dataclass
class Store:
    """The session's MLflow store."""

    uri: str
    client: object
    artifacts: str

    def new_sweep(self, runs: list[SyntheticRun]) -> tuple[str, list[str]]:
        """Write ``runs`` into a fresh experiment; returns (sweep name, run ids)."""
        sweep = f"test-sweep-{next(_counter)}"
        for run in runs:
            run.tags["pdm.sweep"] = sweep
        return sweep, write_runs(self.client, sweep, runs, self.artifacts)


@pytest.fixture(scope="session")
def store(tmp_path_factory) -> Store:
    from mlflow import MlflowClient

    folder = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    return Store(uri, MlflowClient(tracking_uri=uri), str(folder / "artifacts"))


@pytest.fixture(autouse=True)
def state_home(tmp_path, monkeypatch):
    """Each test writes its cache and default outputs into its own state folder."""
    home = tmp_path / "state"
    monkeypatch.setenv("PDM_HOME", str(home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return home


def make_run(
    method: str,
    setting: str,
    seed: int,
    steps,
    *,
    delta: float | None = 0.15,
    status: str = "FINISHED",
    datasets=("aime24", "aime25"),
    diagnostics: bool = False,
) -> SyntheticRun:
    """A run whose evaluation values follow ``eval_value`` at ``steps``."""
    run = SyntheticRun(trial_tags(method, setting, seed, sweep="", delta=delta), status=status)
    for ds in datasets:
        run.metrics[EVAL.format(ds)] = [
            (s, eval_value(method, setting, seed, ds, s), T0 + s) for s in steps
        ]
    if diagnostics:
        run.metrics["actor/pdm/masked_frac"] = [
            (s, 0.001 * (seed + 1) + 0.0001 * s, T0 + s) for s in steps
        ]
    return run
