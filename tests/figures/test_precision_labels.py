"""Every shipped dashboard, drawn from a real store, names each precision setting as what the
backend that trained its runs ran: no panel calls BF16 training "FP8 end-to-end" (on VeRL,
``fp8-e2e`` is an FP8 rollout and KV cache with BF16 training)."""

from __future__ import annotations

import re

import pytest

from pdmask.figures import build_figure, load_spec
from pdmask.figures.panels import honest_title, panel_titles
from pdmask.figures.runs import list_runs, select_runs
from pdmask.figures.spec import available_specs, spec_path
from pdmask.figures.synthetic import SyntheticRun, trial_tags
from pdmask.registry.backends import SIM, VERL
from pdmask.tracking.metric_names import sanitize_metric

FP8_END_TO_END = re.compile(r"FP8[\s-]*end[\s-]*to[\s-]*end", re.IGNORECASE)
SHIPPED = available_specs()


def runs_for_every_panel(spec, backend: str) -> list[SyntheticRun]:
    """One finished run per panel, tagged as a trial of ``backend`` in that panel's setting."""
    metric = sanitize_metric(spec.metric.pattern.replace("*", "aime24"))
    runs = []
    for seed, panel in enumerate(spec.panels):
        tags = trial_tags(spec.methods[0], "4b-bf16", seed, sweep="", delta=spec.delta)
        tags.update(
            {
                "pdm.model": panel.model,
                "pdm.precision": panel.precision,
                "pdm.setting": panel.key,
                "pdm.backend": backend,
                **panel.tags,
            }
        )
        runs.append(SyntheticRun(tags, metrics={metric: [(s, 0.1 * s, s) for s in range(3)]}))
    return runs


def test_the_shipped_dashboards_include_the_paper_figures():
    assert {"figure-1", "figure-2", "paper-appendix"} <= set(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_no_dashboard_names_a_precision_setting_itself(name):
    """Titles take the setting's label from the catalog, which knows the backend."""
    assert not FP8_END_TO_END.search(spec_path(name).read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", SHIPPED)
def test_a_verl_figure_says_what_verl_trained(name, store, tmp_path):
    spec = load_spec(name)
    sweep, _ = store.new_sweep(runs_for_every_panel(spec, VERL.name))
    result = build_figure(
        name, sweep=sweep, tracking_uri=store.uri, out_dir=tmp_path, diagnostics=False
    )
    titles = panel_titles(spec, select_runs(spec, list_runs(store.client, sweep)))
    drawn = " ".join([*titles.values(), result.summary_markdown, *result.notes])
    assert not FP8_END_TO_END.search(drawn), drawn
    for panel in spec.panels:
        title = " ".join(titles[panel.key].split())
        assert "{precision}" not in title and "stand-in" not in title
        if panel.precision == "fp8-e2e":
            assert "FP8 rollout + KV cache, BF16 training" in title, title
        if "{precision}" in panel.title and panel.precision == "bf16":
            assert title.endswith("BF16"), title


def test_each_backend_names_fp8_e2e_as_what_it_ran(store):
    spec = load_spec("figure-1")
    panel = next(p for p in spec.panels if p.precision == "fp8-e2e")
    # VeRL: FP8 weights and KV cache in vLLM, BF16 FSDP training (wrapped to the panel's width)
    assert honest_title(panel, {VERL.name}) == (
        "Qwen3-30B-A3B-Base\nFP8 rollout + KV cache,\nBF16 training"
    )
    # the embedded backend emulates FP8 in its trainer's forward too, on a small stand-in
    assert honest_title(panel, {SIM.name}) == (
        "Qwen3-30B-A3B-Base stand-in\nFP8 end-to-end\n(emulated)"
    )
    # no runs, or two backends' runs mixed: the setting's name, which claims neither
    assert honest_title(panel, set()) == "Qwen3-30B-A3B-Base\nfp8-e2e"
    assert honest_title(panel, {SIM.name, VERL.name}) == "Qwen3-30B-A3B-Base\nfp8-e2e"
