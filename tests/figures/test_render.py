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
