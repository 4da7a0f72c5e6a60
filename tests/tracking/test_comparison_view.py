"""The comparison view's settings, filters and shared state, against a real sqlite MLflow store:
each setting's filter finds exactly its runs (a method without a delta in every delta's panel),
and the view is published once. ``cli/test_ui.py`` opens it in a real browser."""

from __future__ import annotations

import json

from pdmask.tracking.comparison_view import (
    GROUP_TAG,
    SHARED_STATE_TAG,
    comparison_links,
    settings_of,
    view_state,
)

HEADLINE = "val-core/synth/acc/mean_at_16"
CONTROL = "dppo-topk-kl (lr = 0 mismatch control)"


def _run(client, experiment, setting, delta, label):
    tags = {"pdm.setting": setting, "pdm.delta": delta, GROUP_TAG: label}
    run = client.create_run(experiment, run_name=f"{label}-{setting}-{delta}", tags=tags)
    client.log_metric(run.info.run_id, HEADLINE, 0.5, step=0)
    return run.info.run_name


def test_each_settings_filter_finds_its_runs_and_its_view_is_published_once(tmp_path):
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    sweep = client.create_experiment("grid")
    runs = {
        ("4b-bf16", "0.05"): [_run(client, sweep, "4b-bf16", "0.05", "pdm-agg")],
        ("4b-bf16", "0.15"): [
            _run(client, sweep, "4b-bf16", "0.15", "pdm-agg"),
            _run(client, sweep, "4b-bf16", "0.15", CONTROL),
        ],
        ("8b-bf16", "0.15"): [_run(client, sweep, "8b-bf16", "0.15", "pdm-agg")],
    }
    grpo = {s: _run(client, sweep, s, "", "grpo-clip-higher") for s in ("4b-bf16", "8b-bf16")}
    found = client.search_runs([sweep])

    settings = settings_of(found)
    assert [s.name for s in settings] == [
        "4b-bf16 delta 0.05",
        "4b-bf16 delta 0.15",
        "8b-bf16 delta 0.15",
    ]
    for setting in settings:
        shown = client.search_runs([sweep], filter_string=setting.search_filter())
        expected = [*runs[setting.setting, setting.delta], grpo[setting.setting]]
        assert sorted(r.info.run_name for r in shown) == sorted(expected), setting

    state = view_state(settings[1], found, [HEADLINE])
    assert state["selectedColumns"][0] == f"metrics.`{HEADLINE}`"  # the headline first
    assert state["groupBy"]["groupByKeys"] == [{"mode": "tag", "groupByData": GROUP_TAG}]
    assert state["compareRunCharts"][0]["metricKey"] == HEADLINE
    # the label's column holds the control's whole label (about 8 px a character)
    assert state["columnWidths"][f"tags.`{GROUP_TAG}`"] >= 8 * len(CONTROL)

    links = comparison_links(client, "http://ui", sweep)
    assert [name for name, _ in links] == [s.name for s in settings]
    assert comparison_links(client, "http://ui", sweep) == links  # the same keys again
    tags = client.get_experiment(sweep).tags
    shared = {k: json.loads(v) for k, v in tags.items() if k.startswith(SHARED_STATE_TAG)}
    assert len(shared) == len(settings)  # one tag a setting, however often `pdm ui` starts
    for _, link in links:
        key = link.split("viewStateShareKey=")[1].split("&")[0]
        assert shared[SHARED_STATE_TAG + key]["searchFilter"] in {
            s.search_filter() for s in settings
        }
