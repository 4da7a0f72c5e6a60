"""Figure 1 as the paper draws it, and every word of every figure on its canvas.

figure-1 is built from a real sqlite store holding a main-figure-like sweep: the paper's four
methods, pdm-gram (beyond the paper) and the lr = 0 control in all four settings. The built
matplotlib figures are taken where ``save`` would write them (encoding PNGs is not what this
measures) and measured with matplotlib's own renderer.
"""

from __future__ import annotations

import re

import pytest
from matplotlib.text import Text

from pdmask.figures import build, build_figure, load_spec
from pdmask.figures.spec import BEYOND_PAPER_MARK
from pdmask.figures.synthetic import SETTINGS
from pdmask.registry.backends import SIM, VERL

from .conftest import make_run

SEEDS = 2
STEPS = range(0, 6)


def _sweep_runs(backend: str) -> list:
    """2 seeds of every cell a main-figure sweep trains on ``backend``."""
    spec = load_spec("figure-1")
    runs = []
    for setting in SETTINGS:
        for seed in range(SEEDS):
            cells = [(m, m, {}) for m in spec.methods]
            if backend == SIM.name:  # pdm-gram and the control run on the embedded backend only
                cells += [
                    ("pdm-agg", "pdm-gram", {}),
                    ("dppo-topk-kl", "dppo-topk-kl", {"pdm.sim.lr": "0.0"}),
                ]
            for like, method, extra in cells:
                run = make_run(like, setting, seed, STEPS, diagnostics=True)
                run.tags.update({"pdm.method": method, "pdm.backend": backend, **extra})
                run.tags["pdm.trial_hash"] = f"{method}-{setting}-{seed}-{sorted(extra)}"
                runs.append(run)
    return runs


@pytest.fixture(scope="module", params=[SIM.name, VERL.name])
def drawn(request, store, tmp_path_factory):
    """figure-1 built once per backend: {file name: matplotlib Figure}, and the result."""
    figures = {}

    def keep(fig, png, pdf, layout, dpi=None):  # measured here; writing files is tested elsewhere
        figures[png.name] = fig

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PDM_HOME", str(tmp_path_factory.mktemp("state")))
        patch.setattr(build, "save", keep)
        sweep, _ = store.new_sweep(_sweep_runs(request.param))
        result = build_figure(
            "figure-1",
            sweep=sweep,
            tracking_uri=store.uri,
            out_dir=tmp_path_factory.mktemp("out"),
            diagnostics=request.param == SIM.name,  # one drawing of the large figure suffices
        )
    return request.param, figures, result


def _legend(fig) -> list[str]:
    return [t.get_text() for t in fig.legends[0].get_texts() if t.get_text().strip()]


def _footnote_runs(fig) -> int:
    note = next(t.get_text() for t in fig.texts if "runs drawn" in t.get_text())
    return int(re.search(r"(\d+)\s+runs\s+drawn", note).group(1))


def _drawn_lines(fig) -> int:
    """Curves drawn in the top row of panels (the diagnostics' first metric is the one these
    runs log for every method), not stop markers."""
    top = max(ax.get_position().y0 for ax in fig.axes)
    return sum(
        1
        for ax in fig.axes
        if ax.get_position().y0 == top
        for line in ax.get_lines()
        if len(line.get_xdata()) > 1 and line.get_linestyle() != "None"
    )


def test_figure_1_draws_the_papers_four_methods(drawn):
    backend, figures, result = drawn
    spec = load_spec("figure-1")
    assert spec.methods == ["grpo-clip-higher", "dppo-topk-kl", "pdm-agg", "pdm-uni"]
    legend = _legend(figures["figure-1.png"])
    assert not any(BEYOND_PAPER_MARK in text or "gram" in text.lower() for text in legend)
    assert len([t for t in legend if "sd over" not in t]) == 4, legend
    if backend == SIM.name:
        extended = _legend(figures["figure-1-extended.png"])
        marked = [t for t in extended if BEYOND_PAPER_MARK in t]
        assert len(marked) == len(spec.beyond_paper) == 1 and "gram" in marked[0].lower()
        assert result.paths["extended_png"].name == "figure-1-extended.png"
        assert BEYOND_PAPER_MARK in result.summary_markdown
    else:  # nothing beyond the paper ran on VeRL: no figure of it
        assert "figure-1-extended.png" not in figures and "extended_png" not in result.paths


def test_each_footnote_counts_the_runs_its_figure_draws(drawn):
    backend, figures, _ = drawn
    lines = {name: _drawn_lines(fig) for name, fig in figures.items()}
    assert lines["figure-1.png"] == 4 * len(SETTINGS)
    if backend == SIM.name:  # pdm-gram, then the control beside them in the diagnostics
        assert lines["figure-1-extended.png"] == 5 * len(SETTINGS)
        assert lines["figure-1-diagnostics.png"] == 6 * len(SETTINGS)
    for name, fig in figures.items():
        assert _footnote_runs(fig) == lines[name] * SEEDS, name


def _in_view(text: Text, ax) -> bool:
    """A tick label is drawn only where its tick lies inside the axis' view."""
    for axis, (lo, hi) in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
        if text in axis.get_ticklabels():
            x, y = text.get_position()
            value = x if axis is ax.xaxis else y
            return min(lo, hi) - 1e-9 <= value <= max(lo, hi) + 1e-9
    return True


def test_every_text_lies_inside_the_canvas(drawn):
    _, figures, _ = drawn
    for name, fig in figures.items():
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        canvas = fig.bbox
        texts = [(t, None) for t in fig.findobj(Text) if t.figure is fig]
        owner = {id(t): ax for ax in fig.axes for t in ax.findobj(Text)}
        checked = 0
        for text, _ in texts:
            if not text.get_visible() or not text.get_text().strip():
                continue
            ax = owner.get(id(text))
            if ax is not None and not _in_view(text, ax):
                continue
            box = text.get_window_extent(renderer)
            assert canvas.x0 - 0.5 <= box.x0 and box.x1 <= canvas.x1 + 0.5, (name, text, box)
            assert canvas.y0 - 0.5 <= box.y0 and box.y1 <= canvas.y1 + 0.5, (name, text, box)
            checked += 1
        assert checked > 20, name  # titles, labels, ticks, legend, footnote were all measured


def test_the_fourth_panel_title_is_wrapped_to_its_panel(drawn):
    backend, figures, _ = drawn
    fig = figures["figure-1.png"]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    last = max(fig.axes, key=lambda ax: ax.get_position().x1)
    title = last.title.get_window_extent(renderer)
    assert title.x1 <= fig.bbox.x1
    assert title.width <= last.get_window_extent(renderer).width
    if backend == VERL.name:  # fp8-e2e is BF16 training on VeRL: its title says so
        e2e = sorted(fig.axes, key=lambda ax: ax.get_position().x0)[2]
        assert "BF16 training" in e2e.get_title() and "end-to-end" not in e2e.get_title()
