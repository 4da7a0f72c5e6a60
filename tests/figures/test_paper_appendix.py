"""The paper's appendix panels (dashboards/paper-appendix.yaml) from a real sqlite MLflow store of
VeRL-tagged runs: AIME24 and AIME25 apart, reward, response length, PPO-KL, clip fraction."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from pdmask.figures import build_figure, load_spec
from pdmask.figures.synthetic import EVAL, SyntheticRun, trial_tags
from pdmask.registry.backends import SIM, VERL

from .conftest import T0

SETTINGS = ("4b-bf16", "8b-bf16", "30b-fp8-e2e", "30b-fp8-rollout")
EVAL_STEPS = (0, 10, 20)
TRAIN = {  # name -> value at (method index m, setting index s, seed, step)
    "critic/score/mean": lambda m, s, seed, step: 0.1 * m + 0.01 * s + 0.001 * step + 0.0001 * seed,
    "response_length/mean": lambda m, s, seed, step: 500 + 100 * m + 10 * s + step + seed,
    "actor/ppo_kl": lambda m, s, seed, step: 1e-4 * (1 + m + s) + 1e-6 * step + 1e-7 * seed,
    "actor/pg_clipfrac": lambda m, s, seed, step: 1e-3 * (1 + m) + 1e-4 * s + 1e-6 * (step + seed),
}


def aime(dataset: str, m: int, s: int, seed: int, step: int) -> float:
    return (0.2 if dataset == "aime24" else 0.1) + 0.05 * m + 0.02 * s + 0.003 * step + 0.01 * seed


def runs(spec, backend: str) -> list[SyntheticRun]:
    out = []
    for m, method in enumerate(spec.methods):
        for s, setting in enumerate(SETTINGS):
            for seed in range(2):
                run = SyntheticRun(
                    trial_tags(method, setting, seed, sweep="", delta=0.15, backend=backend)
                )
                for ds in ("aime24", "aime25"):
                    run.metrics[EVAL.format(ds)] = [
                        (t, aime(ds, m, s, seed, t), T0 + t) for t in EVAL_STEPS
                    ]
                for name, value in TRAIN.items():
                    run.metrics[name] = [(t, value(m, s, seed, t), T0 + t) for t in range(1, 21)]
                out.append(run)
    return out


@pytest.fixture(scope="module")
def appendix(tmp_path_factory):
    """The figure built once from VeRL runs, beside embedded-backend runs it must leave out."""
    from mlflow import MlflowClient

    from pdmask.figures.synthetic import write_runs

    folder = tmp_path_factory.mktemp("appendix")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    spec = load_spec("paper-appendix")
    sim = runs(spec, SIM.name)
    for run in sim:  # an embedded run that would shift every value if it were drawn
        for name in TRAIN:
            run.metrics[name] = [(t, 1e3, T0 + t) for t in range(1, 21)]
    write_runs(MlflowClient(uri), "main-figure", runs(spec, VERL.name) + sim, str(folder / "a"))
    result = build_figure(
        "paper-appendix", tracking_uri=uri, out_dir=folder / "out", use_cache=False
    )
    return spec, result


def test_the_appendix_panels_are_drawn_from_verl_runs(appendix):
    spec, result = appendix
    diag = pd.read_csv(result.paths["diagnostics_csv"])
    means = diag[diag.series == "mean"]
    assert set(means.metric) == {m.name for m in spec.diagnostics.metrics}
    assert set(means.setting) == set(SETTINGS) and set(means.method) == set(spec.methods)
    manifest = json.loads(result.paths["manifest"].read_text())
    assert {r["backend"] for r in manifest["runs"]} == {VERL.name}
    assert len(manifest["runs"]) == len(spec.methods) * len(SETTINGS) * 2
    assert manifest["ignored_runs"] == {"other backend": len(manifest["runs"])}
    for path in ("diagnostics_png", "diagnostics_pdf", "png"):
        assert result.paths[path].stat().st_size > 10_000


@pytest.mark.parametrize("dataset", ["aime24", "aime25"])
def test_aime24_and_aime25_apart(appendix, dataset):
    """Each dataset's row is that dataset's curve alone (the main figure averages the two)."""
    spec, result = appendix
    diag = pd.read_csv(result.paths["diagnostics_csv"])
    row = diag[(diag.metric == f"val-core/{dataset}/acc/mean@16") & (diag.series == "mean")]
    alpha = 1 - spec.diagnostics.smoothing.weight
    for m, method in enumerate(spec.methods):
        for s, setting in enumerate(SETTINGS):
            cell = row[(row.method == method) & (row.setting == setting)]
            per_seed = [
                pd.Series([aime(dataset, m, s, seed, t) for t in EVAL_STEPS])
                .ewm(alpha=alpha)
                .mean()
                for seed in range(2)
            ]
            np.testing.assert_allclose(cell.value, np.mean(per_seed, axis=0), rtol=1e-9)
    # the main figure is their mean, which neither row is
    main = pd.read_csv(result.paths["data_csv"])
    first = main[(main.series == "mean") & (main.method == spec.methods[0])]
    first = first[first.setting == SETTINGS[0]].value.to_numpy()
    own = row[(row.method == spec.methods[0]) & (row.setting == SETTINGS[0])].value.to_numpy()
    at_zero = [aime(ds, 0, 0, seed, 0) for ds in ("aime24", "aime25") for seed in range(2)]
    np.testing.assert_allclose(first[0], np.mean(at_zero), rtol=1e-9)
    assert abs(first[0] - own[0]) > 0.04


def test_the_training_rows_are_the_runs_values(appendix):
    spec, result = appendix
    diag = pd.read_csv(result.paths["diagnostics_csv"])
    alpha = 1 - spec.diagnostics.smoothing.weight
    for name, value in TRAIN.items():
        row = diag[(diag.metric == name) & (diag.series == "mean")]
        cell = row[(row.method == "pdm-agg") & (row.setting == "30b-fp8-e2e")]
        m, s = spec.methods.index("pdm-agg"), SETTINGS.index("30b-fp8-e2e")
        per_seed = [
            pd.Series([value(m, s, seed, t) for t in range(1, 21)]).ewm(alpha=alpha).mean()
            for seed in range(2)
        ]
        np.testing.assert_allclose(cell.value, np.mean(per_seed, axis=0), rtol=1e-9)
