"""figure-1 end to end: synthetic runs with known values in a real sqlite MLflow store → files.

The expected numbers are recomputed here independently of the package (pandas' EWM for the
smoothing, numpy for the seed statistics) from the formula every run logs.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_rgb
from matplotlib.image import imread

from pdmask.figures import MethodStyle, build_figure, load_spec
from pdmask.figures.synthetic import EVAL

from .conftest import T0, eval_value, make_run

STYLES = {
    "grpo-clip-higher": MethodStyle("GRPO clip-higher", "#7f7f7f"),
    "dppo-topk-kl": MethodStyle("DPPO top-K KL", "#1f77b4"),
    "pdm-agg": MethodStyle("PDM agg", "#d62728"),
    "pdm-uni": MethodStyle("PDM uni", "#2ca02c"),
}
FULL = range(0, 11)
QUICK = {"diagnostics": False}  # tests about data, not the companion figure: skip drawing it


def _grid():
    """The runs of one figure-1 sweep, and what each (setting, method) cell should contain.

    cells[(setting, method)] = list of (seed, steps, {step: datasets present}) per kept run.
    """
    runs, cells = [], {}

    def add(method, setting, seed, steps, *, datasets=("aime24", "aime25"), **kw):
        runs.append(make_run(method, setting, seed, steps, datasets=datasets, **kw))
        cells.setdefault((setting, method), []).append((seed, list(steps)))
        return runs[-1]

    for method in ("grpo-clip-higher", "dppo-topk-kl", "pdm-agg", "pdm-uni"):
        for seed in range(3):
            short = method == "pdm-agg" and seed == 2  # a shorter run: unequal lengths
            run = add(method, "4b-bf16", seed, range(0, 7) if short else FULL, diagnostics=True)
            if method == "dppo-topk-kl" and seed == 1:
                # Resumed from a checkpoint at step 3: the first attempt logged stale values at
                # steps 3-5, the resumed attempt logged them again later; the later ones count.
                for ds in ("aime24", "aime25"):
                    run.metrics[EVAL.format(ds)] += [(s, 0.9, T0 - 1000 + s) for s in (3, 4, 5)]
            if method == "grpo-clip-higher" and seed == 0:
                # aime25 not evaluated at the last step: that step averages aime24 only.
                key = EVAL.format("aime25")
                run.metrics[key] = [p for p in run.metrics[key] if p[0] != 10]
    for method in ("grpo-clip-higher", "dppo-topk-kl", "pdm-agg"):  # pdm-uni missing
        for seed in range(2):
            add(method, "8b-bf16", seed, FULL)
    for method in ("grpo-clip-higher", "dppo-topk-kl", "pdm-agg", "pdm-uni"):
        for seed in range(2):
            collapsed = method == "grpo-clip-higher"
            steps = range(0, 6 + 2 * seed) if collapsed else FULL
            add(method, "30b-fp8-e2e", seed, steps, status="FAILED" if collapsed else "FINISHED")
    # Left out of the figure: an earlier failed attempt of a trial that then finished, a run at
    # another delta and a method the figure does not show. 30b-fp8-rollout has no runs at all.
    superseded = make_run("dppo-topk-kl", "30b-fp8-e2e", 0, range(0, 3), status="FAILED")
    other_delta = make_run("pdm-agg", "4b-bf16", 0, FULL, delta=0.05)
    other_method = make_run("grpo-clip-higher", "4b-bf16", 0, FULL)
    other_method.tags["pdm.method"] = "dppo-binary-kl"
    return [superseded, *runs, other_delta, other_method], cells


def _expected_curve(method, setting, seed, steps, alpha):
    """One seed's plotted curve: mean over datasets present, then pandas' debiased EWM."""
    raw = []
    for s in steps:
        present = (
            ["aime24"]
            if (method, setting, seed, s) == ("grpo-clip-higher", "4b-bf16", 0, 10)
            else ["aime24", "aime25"]
        )
        raw.append(np.mean([eval_value(method, setting, seed, ds, s) for ds in present]))
    smoothed = pd.Series(raw).ewm(alpha=alpha, adjust=True).mean().to_numpy()
    return pd.Series(smoothed, index=list(steps))


@pytest.fixture(scope="module")
def built(store, tmp_path_factory):
    """figure-1 built once from the grid (module scope: the build is the slow part)."""
    import os

    home = tmp_path_factory.mktemp("state")
    old = os.environ.get("PDM_HOME")
    os.environ["PDM_HOME"] = str(home)
    try:
        runs, cells = _grid()
        sweep, run_ids = store.new_sweep(runs)
        out = tmp_path_factory.mktemp("out")
        result = build_figure(
            "figure-1", sweep=sweep, tracking_uri=store.uri, out_dir=out, styles=STYLES
        )
        again = build_figure(
            "figure-1", sweep=sweep, tracking_uri=store.uri, out_dir=out, styles=STYLES
        )
    finally:
        if old is None:
            os.environ.pop("PDM_HOME", None)
        else:
            os.environ["PDM_HOME"] = old
    return result, again, cells, run_ids


def test_plotted_means_and_bands_equal_the_seed_statistics(built):
    result, _, cells, _ = built
    spec = load_spec("figure-1")
    alpha = 1.0 - spec.smoothing.weight
    assert spec.smoothing.kind == "ema" and spec.band.kind == "sd"
    data = pd.read_csv(result.paths["data_csv"])
    means = data[data.series == "mean"]
    assert set(zip(means.setting, means.method, strict=True)) == set(cells)
    for (setting, method), seeds in cells.items():
        curves = pd.concat(
            [_expected_curve(method, setting, seed, steps, alpha) for seed, steps in seeds], axis=1
        ).sort_index()
        got = means[(means.setting == setting) & (means.method == method)].sort_values("step")
        np.testing.assert_array_equal(got.step.to_numpy(), curves.index.to_numpy())
        np.testing.assert_array_equal(got.n_seeds.to_numpy(), curves.notna().sum(axis=1))
        np.testing.assert_allclose(got.value.to_numpy(), curves.mean(axis=1), rtol=1e-12)
        sd = curves.std(axis=1, ddof=1).where(curves.notna().sum(axis=1) >= 2)
        np.testing.assert_allclose(got.sd.to_numpy(), sd.to_numpy(), rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(got.band_lower.to_numpy(), (curves.mean(axis=1) - sd).to_numpy(),
                                   rtol=1e-9, atol=1e-12)  # fmt: skip
        np.testing.assert_allclose(got.band_upper.to_numpy(), (curves.mean(axis=1) + sd).to_numpy(),
                                   rtol=1e-9, atol=1e-12)  # fmt: skip


def test_resumed_run_keeps_the_last_value_per_step(built):
    result, _, _, _ = built
    data = pd.read_csv(result.paths["data_csv"])
    cell = data[(data.setting == "4b-bf16") & (data.method == "dppo-topk-kl")]
    assert cell.value.max() < 0.9  # the stale 0.9 values of the first attempt are gone
    assert cell.step.is_unique


def test_failed_runs_are_drawn_to_their_end_and_marked(built):
    result, _, _, _ = built
    data = pd.read_csv(result.paths["data_csv"], dtype={"seed": str})
    stops = data[data.series == "stop"].sort_values("step")
    assert list(zip(stops.setting, stops.method, stops.seed, stops.step, stops.status, strict=True)) == [
        ("30b-fp8-e2e", "grpo-clip-higher", "0", 5, "FAILED"),
        ("30b-fp8-e2e", "grpo-clip-higher", "1", 7, "FAILED"),
    ]  # fmt: skip
    curve = _expected_curve("grpo-clip-higher", "30b-fp8-e2e", 1, range(0, 8), 0.4)
    assert stops.value.iloc[1] == pytest.approx(curve.iloc[-1], rel=1e-12)
    grpo = data[(data.series == "mean") & (data.method == "grpo-clip-higher")]
    assert grpo[grpo.setting == "30b-fp8-e2e"].step.max() == 7  # drawn up to where it stopped
    assert any("stopped" in n and "grpo-clip-higher" in n for n in result.notes)


def test_missing_cells_are_noted(built):
    result, _, _, _ = built
    notes = "\n".join(result.notes)
    assert "no runs for this setting" in notes and "FP8 rollout" in notes
    assert "no data: PDM uni" in notes  # 8B has no pdm-uni runs


def test_images_exist_and_show_the_method_colours(built):
    result, _, _, _ = built
    for role in ("png", "diagnostics_png"):
        image = imread(result.paths[role])[..., :3]
        assert image.shape[0] > 500 and image.shape[1] > 1500
        ink = np.any(image < 0.9, axis=-1).mean()
        assert 0.02 < ink < 0.6, f"{role}: {ink:.3f} of the pixels are not white"
        for style in STYLES.values():  # every method's line colour is on the figure
            close = np.all(np.abs(image - np.array(to_rgb(style.color))) < 0.03, axis=-1)
            assert close.sum() > 200, f"{role}: colour of {style.display_name} not found"
    for role in ("pdf", "diagnostics_pdf"):
        raw = result.paths[role].read_bytes()
        assert raw.startswith(b"%PDF") and len(raw) > 10_000
        assert b"FontFile2" in raw  # TrueType embedded (pdf.fonttype 42): editable text


def test_manifest_records_runs_hashes_shas_and_the_spec(built):
    result, _, cells, run_ids = built
    manifest = json.loads(result.paths["manifest"].read_text())
    kept = run_ids[1:-2]
    assert sorted(r["run_id"] for r in manifest["runs"]) == sorted(kept)
    assert len(manifest["runs"]) == sum(len(v) for v in cells.values())
    assert all(len(r["trial_hash"]) == 16 and r["git_sha"] for r in manifest["runs"])
    assert manifest["git_shas"] == ["0123456789abcdef0123456789abcdef01234567"]
    retried = next(r["run_id"] for r in manifest["runs"] if (r["method"], r["setting"], r["seed"])
                   == ("dppo-topk-kl", "30b-fp8-e2e", "0"))  # fmt: skip
    assert manifest["superseded"] == [{"run_id": run_ids[0], "status": "FAILED", "kept": retried}]
    assert manifest["ignored_runs"] == {"other delta": 1, "method not in figure": 1}
    assert manifest["spec"]["name"] == "figure-1" and manifest["spec"]["delta"] == 0.15
    assert manifest["datasets"] == ["aime24", "aime25"]
    assert set(manifest["outputs"]) >= {"png", "pdf", "data_csv", "summary_csv", "manifest"}


def test_summary_reports_final_best_and_paired_differences(built):
    from scipy import stats

    result, _, _, _ = built
    table = pd.read_csv(result.paths["summary_csv"], dtype={"seeds": str})
    row = table[
        (table.kind == "method") & (table.setting == "4b-bf16") & (table.method == "dppo-topk-kl")
    ].iloc[0]
    finals = [0.20 + 0.10 + 0.03 * s for s in range(3)]
    assert row.n == 3 and row.final_mean == pytest.approx(np.mean(finals))
    assert row.final_ci == pytest.approx(
        np.std(finals, ddof=1) / np.sqrt(3) * stats.t.ppf(0.975, 2)
    )
    assert row.best_mean == pytest.approx(np.mean(finals))
    paired = table[(table.kind == "paired") & (table.setting == "4b-bf16")].set_index("method")
    # pdm-agg seed 2 stopped at step 6: its final value is the one at step 6.
    diffs = [0.10, 0.10, (0.30 + 0.06 + 0.06) - (0.20 + 0.10 + 0.06)]
    assert paired.loc["pdm-agg", "final_mean"] == pytest.approx(np.mean(diffs))
    assert paired.loc["pdm-agg", "final_ci"] == pytest.approx(
        np.std(diffs, ddof=1) / np.sqrt(3) * stats.t.ppf(0.975, 2)
    )
    assert paired.loc["pdm-agg", "wins_final"] == "3/3"
    assert paired.loc["pdm-uni", "final_mean"] == pytest.approx(0.09)
    assert paired.loc["pdm-uni", "baseline"] == "dppo-topk-kl"
    # one line per row; the runs trained the embedded backend's stand-ins, and the title says so
    assert "| Qwen3-4B-Base stand-in BF16 | pdm-agg |" in result.summary_markdown
    assert "Paired difference" in result.summary_markdown


def test_diagnostics_data_follow_the_logged_values(built):
    result, _, _, _ = built
    spec = load_spec("figure-1")
    diag = pd.read_csv(result.paths["diagnostics_csv"])
    cell = diag[(diag.metric == "actor/pdm/masked_frac") & (diag.setting == "4b-bf16")
                & (diag.method == "pdm-uni") & (diag.series == "mean")]  # fmt: skip
    alpha = 1.0 - spec.diagnostics.smoothing.weight
    seeds = [
        pd.Series([0.001 * (seed + 1) + 0.0001 * s for s in FULL]).ewm(alpha=alpha).mean()
        for seed in range(3)
    ]
    np.testing.assert_allclose(cell.value.to_numpy(), pd.concat(seeds, axis=1).mean(axis=1))
    assert set(diag.metric) == {"actor/pdm/masked_frac"}  # the only diagnostic these runs log


def test_rebuild_reads_finished_runs_from_the_cache(built):
    result, again, _, _ = built
    assert result.stats["fetched"] > 0 and result.stats["cached"] == 0
    assert again.stats["fetched"] == 0 and again.stats["cached"] == result.stats["fetched"]
    first = pd.read_csv(result.paths["data_csv"])
    second = pd.read_csv(again.paths["data_csv"])
    pd.testing.assert_frame_equal(first, second)


def test_running_runs_are_refetched_until_they_finish(store, tmp_path):
    from mlflow.entities import Metric

    running = make_run("pdm-agg", "4b-bf16", 0, range(0, 4), status="RUNNING")
    done = make_run("dppo-topk-kl", "4b-bf16", 0, range(0, 4))
    sweep, (run_id, _) = store.new_sweep([running, done])
    first = build_figure("figure-1", sweep=sweep, tracking_uri=store.uri, out_dir=tmp_path, **QUICK)
    assert first.stats["fetched"] == 4  # 2 runs × 2 datasets
    assert any("still running" in n for n in first.notes)
    store.client.log_batch(run_id, metrics=[
        Metric(EVAL.format(ds), eval_value("pdm-agg", "4b-bf16", 0, ds, 4), T0 + 4, 4)
        for ds in ("aime24", "aime25")
    ])  # fmt: skip
    second = build_figure(
        "figure-1", sweep=sweep, tracking_uri=store.uri, out_dir=tmp_path, **QUICK
    )
    assert (second.stats["fetched"], second.stats["cached"]) == (2, 2)  # only the running one
    store.client.set_terminated(run_id)
    third = build_figure("figure-1", sweep=sweep, tracking_uri=store.uri, out_dir=tmp_path, **QUICK)
    fourth = build_figure(
        "figure-1", sweep=sweep, tracking_uri=store.uri, out_dir=tmp_path, **QUICK
    )
    assert (third.stats["fetched"], fourth.stats["fetched"]) == (2, 0)
    data = pd.read_csv(fourth.paths["data_csv"])
    assert data[data.method == "pdm-agg"].step.max() == 4


def test_sanitised_and_raw_metric_names_both_match(store, tmp_path):
    """The spec says `mean@16`; MLflow stores `mean_at_16`; a run may also carry a raw name."""
    from pdmask.figures.spec import load_spec

    assert "@" in load_spec("figure-1").metric.pattern
    run = make_run("pdm-agg", "4b-bf16", 0, range(0, 3), datasets=("aime24",))
    sweep, _ = store.new_sweep([run])
    result = build_figure(
        "figure-1", sweep=sweep, tracking_uri=store.uri, out_dir=tmp_path, **QUICK
    )
    data = pd.read_csv(result.paths["data_csv"])
    assert list(data.step) == [0, 1, 2]
    assert "avg@16 (AIME24)" in result.summary_markdown


def test_a_custom_spec_with_bootstrap_band_and_wrapped_panels(store, tmp_path):
    """Any spec file works: here 2 columns, a rolling mean and a bootstrap CI, no diagnostics."""
    spec = tmp_path / "my-figure.yaml"
    spec.write_text(
        "sweep: unused\n"
        "delta: 0.05\n"
        "methods: [dppo-topk-kl, pdm-agg]\n"
        "panels:\n"
        "  - {key: 4b, title: 4B, model: qwen3-4b-base, precision: bf16}\n"
        "  - {key: 8b, title: 8B, model: qwen3-8b-base, precision: bf16}\n"
        "  - {key: 30b, title: 30B, model: qwen3-30b-a3b-base, precision: fp8-e2e}\n"
        "smoothing: {kind: rolling, window: 3}\n"
        "band: {kind: bootstrap, resamples: 400, seed: 7}\n"
        "layout: {columns: 2}\n"
    )
    runs = [make_run(m, s, seed, FULL, delta=0.05) for m in ("dppo-topk-kl", "pdm-agg")
            for s in ("4b-bf16", "8b-bf16") for seed in range(4)]  # fmt: skip
    sweep, _ = store.new_sweep(runs)
    one = build_figure(str(spec), sweep=sweep, tracking_uri=store.uri, out_dir=tmp_path / "a")
    two = build_figure(str(spec), sweep=sweep, tracking_uri=store.uri, out_dir=tmp_path / "b")
    assert "diagnostics_png" not in one.paths
    data = pd.read_csv(one.paths["data_csv"])
    assert set(data.setting) == {"4b", "8b"}
    assert (data.band_lower < data.value).all() and (data.value < data.band_upper).all()
    pd.testing.assert_frame_equal(data, pd.read_csv(two.paths["data_csv"]))  # reproducible
    cell = data[(data.setting == "4b") & (data.method == "pdm-agg")]
    seeds = [
        pd.Series([np.mean([eval_value("pdm-agg", "4b-bf16", sd, ds, s) for ds in ("aime24", "aime25")])
                   for s in FULL]).rolling(3, min_periods=1).mean()
        for sd in range(4)
    ]  # fmt: skip
    np.testing.assert_allclose(cell.value, pd.concat(seeds, axis=1).mean(axis=1), rtol=1e-12)
    assert any("no runs for this setting" in n and "30B" in n for n in one.notes)
    image = imread(one.paths["png"])
    assert image.shape[0] > image.shape[1] * 0.6  # two rows of panels: a taller figure


def test_control_runs_draw_their_own_diagnostics_line_and_never_mix_with_a_method(store, tmp_path):
    """figure-1's lr = 0 control: dppo-topk-kl runs tagged pdm.sim.lr = 0.0 are a dotted line of
    the diagnostics figure only; a run with a knob the figure does not ask for is left out."""
    regular = [make_run("dppo-topk-kl", "4b-bf16", seed, FULL, diagnostics=True) for seed in (0, 1)]
    control = [make_run("dppo-topk-kl", "4b-bf16", seed, FULL) for seed in (0, 1)]
    for seed, run in enumerate(control):
        run.tags["pdm.sim.lr"] = "0.0"
        run.tags["pdm.trial_hash"] += "c"
        run.metrics["actor/pdm/masked_frac"] = [(s, 0.5 + seed, T0 + s) for s in FULL]
    other_task = make_run("dppo-topk-kl", "4b-bf16", 0, FULL, diagnostics=True)
    other_task.tags["pdm.sim.task"] = "llm-like"
    other_task.tags["pdm.trial_hash"] += "t"
    other_task.metrics["actor/pdm/masked_frac"] = [(s, 9.0, T0 + s) for s in FULL]
    sweep, _ = store.new_sweep([*regular, *control, other_task])
    result = build_figure("figure-1", sweep=sweep, tracking_uri=store.uri, out_dir=tmp_path)

    main = pd.read_csv(result.paths["data_csv"])
    assert set(main.method) == {"dppo-topk-kl"}  # the control never enters the main figure
    expected = np.mean([eval_value("dppo-topk-kl", "4b-bf16", sd, "aime24", 10) / 2
                        + eval_value("dppo-topk-kl", "4b-bf16", sd, "aime25", 10) / 2
                        for sd in (0, 1)])  # fmt: skip
    last = main[(main.series == "mean") & (main.step == 10)].value.item()
    assert abs(last - expected) < 0.05  # the regular seeds only (smoothed), not 0.5 + seed
    diag = pd.read_csv(result.paths["diagnostics_csv"])
    frac = diag[(diag.metric == "actor/pdm/masked_frac") & (diag.series == "mean")]
    assert set(frac.method) == {"dppo-topk-kl", "lr0-control"}
    np.testing.assert_allclose(frac[frac.method == "lr0-control"].value, 1.0)  # mean of 0.5, 1.5
    assert frac[frac.method == "dppo-topk-kl"].value.max() < 0.01  # no llm-like run (9.0) mixed in
    manifest = json.loads(result.paths["manifest"].read_text())
    assert manifest["ignored_runs"] == {"embedded-backend knobs not in figure": 1}


def test_a_panel_says_stand_in_only_when_every_run_trained_one():
    from pdmask.figures.panels import honest_title
    from pdmask.figures.spec import PanelSpec

    panel = PanelSpec(key="4b", title="Qwen3-4B-Base\n{precision}", model="m", precision="bf16")
    assert honest_title(panel, {"sim"}) == "Qwen3-4B-Base stand-in\nBF16"
    assert honest_title(panel, {"verl"}) == "Qwen3-4B-Base\nBF16"
    assert honest_title(panel, {"sim", "verl"}) == "Qwen3-4B-Base\nBF16"
    assert honest_title(panel, set()) == "Qwen3-4B-Base\nBF16"  # no runs
