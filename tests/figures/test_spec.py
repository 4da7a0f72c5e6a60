"""Figure specs: the shipped dashboards validate; bad files report every problem with its place."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdmask.errors import ConfigError, ValidationFailed
from pdmask.figures.spec import available_specs, figures_for_sweep, load_spec

DASHBOARDS = Path(__file__).resolve().parents[2] / "dashboards"


def test_paper_figures_read_their_sweeps_at_their_delta():
    one, two = load_spec("figure-1"), load_spec("figure-2")
    assert (one.sweep, one.delta, two.sweep, two.delta) == (
        "main-figure", 0.15, "delta-ablation", 0.05
    )  # fmt: skip
    for spec in (one, two):
        # the paper's four; pdm-gram (embedded backend only) in a figure of its own
        assert spec.methods == ["grpo-clip-higher", "dppo-topk-kl", "pdm-agg", "pdm-uni"]
        assert spec.beyond_paper == ["pdm-gram"]
        assert [(p.model, p.precision) for p in spec.panels] == [
            ("qwen3-4b-base", "bf16"),
            ("qwen3-8b-base", "bf16"),
            ("qwen3-30b-a3b-base", "fp8-e2e"),
            ("qwen3-30b-a3b-base", "fp8-rollout"),
        ]
        assert "val-core/*/acc/mean_at_16" in spec.metric.description
        assert spec.paired.baseline == "dppo-topk-kl"
        assert spec.paired.methods == ["pdm-agg", "pdm-uni", "pdm-gram"]
        assert {m.name for m in spec.diagnostics.metrics} >= {
            "actor/pdm/masked_frac", "actor/pdm/kl_topk_mean", "actor/pdm/disagree_agg"
        }  # fmt: skip
    assert {"figure-1", "figure-2"} <= set(available_specs())
    assert figures_for_sweep("main-figure") == ["figure-1", "paper-appendix"]  # VeRL runs only
    assert figures_for_sweep("delta-ablation") == ["figure-2"]


def test_every_problem_is_reported_with_file_field_and_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text(
        "\n".join([
            "sweep: main-figure",
            "methods: [pdm-agg, dppo-topk-kl]",
            "colour: red",                                  # line 3: unknown key
            "band: {kind: ci95}",                           # line 4: not a band kind
            "smoothing: {kind: ema, weight: 1.5}",          # line 5: weight out of range
            "paired: {baseline: grpo-clip-higher, methods: [pdm-agg]}",
            "panels:",
            "  - {key: a, title: A, model: m, precision: bf16}",
            "  - {key: b, title: B, model: m}",             # line 9: precision missing
        ]) + "\n"
    )  # fmt: skip
    with pytest.raises(ValidationFailed) as info:
        load_spec(path)
    found = {(p.field, p.line) for p in info.value.problems}
    assert {
        ("colour", 3),
        ("band.kind", 4),
        ("smoothing.weight", 5),
        ("panels.1.precision", 9),
    } <= found
    assert all(p.file.endswith("broken.yaml") for p in info.value.problems)
    assert "broken.yaml:3: colour" in str(info.value)


def test_cross_field_problems_are_collected_together(tmp_path):
    path = tmp_path / "mixed.yaml"
    path.write_text(
        "name: other\n"
        "sweep: s\n"
        "methods: [pdm-agg, dppo-topk-kl]\n"
        "beyond_paper: [pdm-gram, pdm-agg, pdm-gram]\n"
        "linestyles: {pdm-uni: dashed, pdm-gram: dotted}\n"
        "metric: {pattern: 'val-core/acc'}\n"
        "paired: {baseline: grpo-clip-higher, methods: [pdm-agg, pdm-gram]}\n"
        "panels:\n"
        "  - {key: a, title: A, model: m, precision: bf16}\n"
        "  - {key: a, title: B, model: n, precision: bf16}\n"
    )
    with pytest.raises(ValidationFailed) as info:
        load_spec(path)
    fields = {p.field for p in info.value.problems}
    assert fields == {
        "name",
        "panels.1.key",
        "beyond_paper.1",  # in `methods` too
        "beyond_paper.2",  # twice; pdm-gram's line style and pairing are its own
        "linestyles.pdm-uni",
        "metric.pattern",
        "paired.baseline",
    }


def test_yaml_is_loaded_safely(tmp_path):
    marker = tmp_path / "executed"
    path = tmp_path / "evil.yaml"
    path.write_text(f"sweep: !!python/object/apply:os.system ['touch {marker}']\n")
    with pytest.raises(ValidationFailed) as info:
        load_spec(path)
    assert info.value.problems[0].field == "(syntax)"  # the sweep files' word for it
    assert not marker.exists()


def test_a_repeated_key_is_refused_with_its_line(tmp_path):
    good = (DASHBOARDS / "figure-1.yaml").read_text()
    path = tmp_path / "figure-1.yaml"
    path.write_text(good + "delta: 0.05\n")  # YAML would silently keep the last delta
    with pytest.raises(ValidationFailed) as info:
        load_spec(path)
    (problem,) = [p for p in info.value.problems if "duplicate key" in p.message]
    assert problem.field == "delta" and problem.line == len(good.splitlines()) + 1


def test_unknown_figure_names_the_available_ones():
    with pytest.raises(ConfigError, match="figure-1"):
        load_spec("figure-99")


def test_control_series_are_checked_with_the_rest(tmp_path):
    path = tmp_path / "controls.yaml"
    path.write_text(
        "sweep: s\n"
        "methods: [pdm-agg, dppo-topk-kl]\n"
        "panels:\n"
        "  - {key: a, title: A, model: m, precision: bf16}\n"
        "controls:\n"
        "  - {key: pdm-agg, label: x, method: dppo-topk-kl, tags: {pdm.sim.lr: '0.0'}}\n"
        "  - {key: c, label: y, method: dppo-topk-kl, tags: {}, linestyle: wavy}\n"
    )
    with pytest.raises(ValidationFailed) as info:
        load_spec(path)
    fields = {p.field for p in info.value.problems}
    assert fields == {"controls.1.tags"}  # pydantic first: an empty tag filter is refused
    path.write_text(path.read_text().replace("tags: {}, ", "tags: {pdm.sim.lr: '0.0'}, "))
    with pytest.raises(ValidationFailed) as info:
        load_spec(path)
    assert {p.field for p in info.value.problems} == {"controls.0.key", "controls.1.linestyle"}


def test_a_figure_name_never_reads_outside_dashboards(tmp_path):
    (tmp_path / "dashboards").mkdir()
    (tmp_path / "sweeps").mkdir()
    (tmp_path / "sweeps" / "smoke.yaml").write_text("name: smoke\n")
    for name in ("../sweeps/smoke", "sub/figure-1", "..", "."):
        with pytest.raises(ConfigError, match="no folders in a name"):
            load_spec(name, tmp_path / "dashboards")
    with pytest.raises(ConfigError, match="no figure spec named 'figure-9'"):
        load_spec("figure-9", tmp_path / "dashboards")
    assert load_spec(DASHBOARDS / "figure-1.yaml").name == "figure-1"  # a path still works
