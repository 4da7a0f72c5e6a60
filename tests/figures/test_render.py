"""Drawing edge cases seen on real runs: all-zero diagnostics on a log axis, long notes."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from pdmask.figures.render import GridStyle, Line, Panel, draw_grid
from pdmask.figures.series import Curve, aggregate_seeds
from pdmask.figures.spec import BandSpec, LayoutSpec
from pdmask.figures.styles import MethodStyle

STYLE = GridStyle({"m": MethodStyle("M", "#d62728")}, {}, ["m"], LayoutSpec(), "")


def _panel(values) -> Panel:
    curve = Curve(np.arange(len(values)), np.asarray(values, dtype=float))
    return Panel("p", [Line("m", aggregate_seeds([curve], BandSpec()))])


@pytest.mark.parametrize(
    ("values", "scale"),
    [([1e-3, 2e-3, 4e-3], "log"), ([0.0, 1e-3, 2e-3], "symlog"), ([0.0, 0.0, 0.0], "linear")],
)
def test_log_axes_fall_back_when_values_are_not_all_positive(values, scale):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib warns when log-scaling non-positive data
        fig = draw_grid([[_panel(values)]], STYLE, row_labels=["y"], yscales=["log"], x_label="x")
    assert fig.axes[0].get_yscale() == scale


def test_long_notes_are_wrapped_to_the_panel():
    panel = Panel("empty", notes=["no runs for this setting (qwen3-30b-a3b-base, fp8-rollout)"])
    fig = draw_grid([[panel]], STYLE, row_labels=["y"], yscales=["linear"], x_label="x")
    note = next(t for t in fig.axes[0].texts if "no runs" in t.get_text())
    assert note.get_text().count("\n") >= 1
    assert max(len(s) for s in note.get_text().split("\n")) <= 30


def test_legend_and_title_of_a_narrow_figure_stay_inside_it():
    """Two panels, four methods and a long title: the legend takes more rows, the title wraps."""
    names = ["grpo-clip-higher", "dppo-topk-kl", "pdm-agg", "pdm-uni"]
    labels = ["GRPO clip-higher", "DPPO top-K KL", "PDM (agg. tail)", "PDM (uniform tail)"]
    colours = ["#7f7f7f", "#1f77b4", "#d62728", "#ff7f0e"]
    styles = {n: MethodStyle(label, c) for n, label, c in zip(names, labels, colours, strict=True)}
    style = GridStyle(styles, {}, names, LayoutSpec(columns=2), "±1 sd over 4 seeds")
    curve = Curve(np.arange(5), np.linspace(0.1, 0.5, 5))
    panel = Panel("p", [Line(n, aggregate_seeds([curve], BandSpec())) for n in names])
    title = "Trust-region masks at δ = 0.15, stress profile (embedded backend)"
    fig = draw_grid(
        [[panel, panel]], style, row_labels=["y"], yscales=["linear"], x_label="x", title=title
    )
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    inside = fig.bbox
    legend = fig.legends[0].get_window_extent(renderer)
    heading = next(t for t in fig.texts if t.get_text().startswith("Trust-region"))
    assert "\n" in heading.get_text()  # wrapped
    for box in (legend, heading.get_window_extent(renderer)):
        assert inside.x0 <= box.x0 and box.x1 <= inside.x1, (box, inside)
    assert fig.legends[0]._ncols < len(names) + 1  # more than one row
