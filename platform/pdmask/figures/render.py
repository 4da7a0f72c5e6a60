"""Drawing: a grid of panels, one line per method (seed mean), a band, stop markers, one legend.

Uses matplotlib's object API (``matplotlib.figure.Figure``), never pyplot, so building a figure
touches no global backend state and works in any process (CLI, sweep runner, notebook). Fonts
are embedded as TrueType (``pdf.fonttype`` 42) so the PDF stays editable and searchable.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib as mpl
import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import (
    FuncFormatter,
    LogLocator,
    MaxNLocator,
    NullLocator,
    ScalarFormatter,
)

from pdmask.figures.series import SeedAggregate
from pdmask.figures.spec import LayoutSpec
from pdmask.figures.styles import MethodStyle

BAND_ALPHA = 0.18
NOTE_GREY = "#707070"


@dataclass(frozen=True)
class StopMark:
    """Where a failed/killed/collapsed run ended, on its own (smoothed) curve."""

    step: int
    value: float
    run_id: str
    seed: str
    status: str


@dataclass
class Line:
    method: str
    aggregate: SeedAggregate
    stops: list[StopMark] = field(default_factory=list)


@dataclass
class Panel:
    """Everything drawn in one axes."""

    title: str
    lines: list[Line] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class GridStyle:
    styles: Mapping[str, MethodStyle]
    linestyles: Mapping[str, str]
    methods: Sequence[str]  # legend order
    layout: LayoutSpec
    band_label: str  # legend entry of the shaded band, e.g. "±1 sd over 3 seeds"


def _rc(layout: LayoutSpec) -> dict:
    size = layout.font_size
    return {
        "font.family": "DejaVu Sans",
        "font.size": size,
        "axes.titlesize": size + 0.5,
        "axes.labelsize": size,
        "xtick.labelsize": size - 1,
        "ytick.labelsize": size - 1,
        "legend.fontsize": size,
        "axes.linewidth": 0.6,
        "xtick.major.width": 0.6,
        "ytick.major.width": 0.6,
        "xtick.major.size": 2.5,
        "ytick.major.size": 2.5,
        "pdf.fonttype": 42,
        "pdf.compression": 1,  # fastest zlib level: the files stay small (vector line art)
        "ps.fonttype": 42,
        "savefig.dpi": layout.dpi,
    }


def _wrap(notes: Sequence[str], width_in: float, size_pt: float) -> str:
    """Notes wrapped to a panel's width (DejaVu Sans averages ~0.55 em per character)."""
    per_line = max(12, int(width_in * 72 / (0.55 * size_pt)))
    lines = [textwrap.fill(part, per_line) for note in notes for part in note.split("\n")]
    return "\n".join(lines)


def _values(panel: Panel) -> np.ndarray:
    finite = [line.aggregate.mean[np.isfinite(line.aggregate.mean)] for line in panel.lines]
    return np.concatenate(finite) if finite else np.zeros(0)


def _linthresh(panel: Panel) -> float:
    """symlog's linear range: the decade of the smallest positive value (zeros stay visible)."""
    positive = _values(panel)[_values(panel) > 0]
    return 10.0 ** np.floor(np.log10(positive.min())) if positive.size else 1e-3


def _log_or_fallback(panel: Panel) -> str:
    """log when every value is positive; symlog when some are zero (no masked token is a real
    value, which log would hide); linear when nothing is positive."""
    values = _values(panel)
    if values.size and values.min() > 0:
        return "log"
    return "symlog" if (values > 0).any() else "linear"


def _draw_panel(ax, panel: Panel, style: GridStyle, yscale: str, title: str) -> bool:
    """Draw one panel under ``title`` (its title as it fits); True when it shows a stop marker."""
    ax.spines[["top", "right"]].set_visible(False)
    ax.grid(True, linewidth=0.4, alpha=0.35)
    ax.set_title(title, pad=3)
    has_stop = False
    if not panel.lines:
        ax.set_xticks([])
        ax.set_yticks([])
        ax.text(
            0.5,
            0.5,
            _wrap(panel.notes or ["no runs"], style.layout.panel_width, style.layout.font_size),
            transform=ax.transAxes,
            ha="center",
            va="center",
            color=NOTE_GREY,
        )
        return False
    for line in panel.lines:
        agg = line.aggregate
        color = style.styles[line.method].color
        band = np.isfinite(agg.lower) & np.isfinite(agg.upper)
        if band.any():
            ax.fill_between(
                agg.steps,
                agg.lower,
                agg.upper,
                where=band,
                color=color,
                alpha=BAND_ALPHA,
                linewidth=0,
                interpolate=False,
            )
        ax.plot(
            agg.steps,
            agg.mean,
            color=color,
            linewidth=1.3,
            linestyle=style.linestyles.get(line.method, "-"),
            marker="o" if len(agg) == 1 else None,
            markersize=3,
        )
        for stop in line.stops:
            ax.plot(
                [stop.step],
                [stop.value],
                linestyle="none",
                marker="X",
                markersize=6,
                markerfacecolor=color,
                markeredgecolor="black",
                markeredgewidth=0.6,
                zorder=5,
            )
            has_stop = True
    ax.xaxis.set_major_locator(MaxNLocator(5, integer=True, steps=[1, 2, 2.5, 5, 10]))
    if yscale == "log":
        yscale = _log_or_fallback(panel)
    if yscale == "log":
        # 1-2-5 major ticks: diagnostics often span less than a decade, where plain decade
        # ticks would leave the axis unlabelled; minor ticks stay unlabelled (mathtext is slow).
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0), numticks=8))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        ax.yaxis.set_minor_locator(NullLocator())
    elif yscale == "symlog":
        ax.set_yscale("symlog", linthresh=_linthresh(panel))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    else:
        ax.yaxis.set_major_locator(MaxNLocator(5))
        formatter = ScalarFormatter(useMathText=False)  # mathtext parsing is slow
        formatter.set_powerlimits((-3, 4))  # only tiny values get a "×10⁻⁴" offset
        ax.yaxis.set_major_formatter(formatter)
    if panel.notes:
        ax.text(
            0.98,
            0.03,
            _wrap(panel.notes, style.layout.panel_width, style.layout.font_size - 1.5),
            transform=ax.transAxes,
            ha="right",
            va="bottom",
            color=NOTE_GREY,
            fontsize=style.layout.font_size - 1.5,
        )
    return has_stop


@dataclass(frozen=True)
class _Margins:
    """Fixed margins in inches: a deterministic layout, much cheaper than constrained layout."""

    left: float = 0.62  # y label + tick labels of the first column
    right: float = 0.12
    col_gap: float = 0.42  # tick labels of the next column
    row_gap: float = 0.30  # x tick labels of the row above
    title: float = 0.17  # one line of panel titles
    legend_row: float = 0.22
    top_pad: float = 0.06
    x_label: float = 0.42  # x tick labels + x label under the last row
    footnote: float = 0.115  # one line of the footnote


def _legend_handles(style: GridStyle, any_stop: bool) -> tuple[list, list]:
    methods = [
        Line2D(
            [],
            [],
            color=style.styles[m].color,
            linewidth=1.6,
            linestyle=style.linestyles.get(m, "-"),
            label=style.styles[m].display_name,
        )
        for m in style.methods
    ]
    extras = []
    if style.band_label:
        extras.append(
            Patch(facecolor="#888888", alpha=BAND_ALPHA * 2, linewidth=0, label=style.band_label)
        )
    if any_stop:
        extras.append(
            Line2D(
                [],
                [],
                linestyle="none",
                marker="X",
                markersize=6,
                markerfacecolor="white",
                markeredgecolor="black",
                markeredgewidth=0.8,
                label="run failed / collapsed",
            )
        )
    return methods, extras


def _wrap_to_width(fig: Figure, renderer, text: str, fontsize: float, max_px: float) -> str:
    """``text`` broken at spaces into lines no wider than ``max_px`` (measured, not estimated)."""
    lines: list[str] = []
    for word in text.split():
        candidate = f"{lines[-1]} {word}" if lines else word
        probe = fig.text(0, 0, candidate, fontsize=fontsize)
        too_wide = probe.get_window_extent(renderer).width > max_px
        probe.remove()
        if lines and not too_wide:
            lines[-1] = candidate
        else:
            lines.append(word)
    return "\n".join(lines)


def _read_by_rows(handles: list, ncol: int) -> list:
    """``handles`` reordered so that matplotlib's column-by-column fill reads row by row."""
    blank = Line2D([], [], alpha=0.0, label=" ")
    rows = [handles[i : i + ncol] for i in range(0, len(handles), ncol)]
    rows[-1] = rows[-1] + [blank] * (ncol - len(rows[-1]))
    return [rows[r][c] for c in range(ncol) for r in range(len(rows))]


def _legend_layout(methods: list, extras: list, fits) -> tuple[list, int, int]:
    """Handles in fill order, the column count and the row count of the widest legend that
    ``fits(handles, ncol)`` the figure: one row; else methods over extras; else as many columns
    as fit, read row by row."""
    every = methods + extras
    if fits(every, len(every)):
        return every, len(every), 1
    if extras:
        cols = max(len(methods), len(extras))
        blank = Line2D([], [], alpha=0.0, label=" ")
        rows = [methods + [blank] * (cols - len(methods)), extras + [blank] * (cols - len(extras))]
        # matplotlib fills legends column by column: interleave so that it reads row by row.
        handles = [rows[r][c] for c in range(cols) for r in range(2)]
        if fits(handles, cols):
            return handles, cols, 2
    for ncol in range(len(every) - 1, 0, -1):
        handles = _read_by_rows(every, ncol)
        if ncol == 1 or fits(handles, ncol):
            return handles, ncol, -(-len(every) // ncol)
    raise AssertionError("unreachable")


def draw_grid(
    grid: Sequence[Sequence[Panel | None]],
    style: GridStyle,
    *,
    row_labels: Sequence[str],
    yscales: Sequence[str],
    x_label: str,
    title: str = "",
    footnote: str = "",
) -> Figure:
    """A figure of ``len(grid)`` rows of panels (``None`` = an unused slot) and one legend."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    n_rows, n_cols = len(grid), max(len(row) for row in grid)
    layout, m = style.layout, _Margins()
    scale = layout.font_size / 8.0  # margins hold text, so they grow with the font
    width = (
        (m.left + m.right) * scale + n_cols * layout.panel_width + (n_cols - 1) * m.col_gap * scale
    )
    with mpl.rc_context(_rc(layout)):
        fig = Figure()
        FigureCanvasAgg(fig)  # a renderer to measure the legend, without pyplot
        # Each line of a panel title wrapped to the panel's width, measured (the last column's
        # title has only the right margin beyond it), less 5 % for glyphs hinted at the PNG's dpi.
        titles = [
            [
                "\n".join(
                    _wrap_to_width(
                        fig,
                        fig.canvas.get_renderer(),
                        part,
                        mpl.rcParams["axes.titlesize"],
                        0.95 * layout.panel_width * fig.dpi,
                    )
                    for part in p.title.split("\n")
                )
                if p is not None
                else ""
                for p in row
            ]
            for row in grid
        ]
        title_lines = [max((t.count("\n") + 1 for t in row if t), default=0) for row in titles]
        any_stop = False
        axes = []
        for r, row in enumerate(grid):
            axes.append([])
            for c in range(n_cols):
                panel = row[c] if c < len(row) else None
                ax = fig.add_axes((0, 0, 1, 1)) if panel is not None else None
                axes[r].append(ax)
                if ax is None:
                    continue
                any_stop |= _draw_panel(ax, panel, style, yscales[r], titles[r][c])
                if c == 0:
                    ax.set_ylabel(row_labels[r])
        methods, extras = _legend_handles(style, any_stop)
        fig.set_size_inches(width, 4.0)
        renderer = fig.canvas.get_renderer()
        # Legend and title are centred over the panels, which sit right of the figure's centre
        # (the y label's margin): what fits is the width symmetric about the panels' centre,
        # less 5 % because glyphs hinted at the PNG's resolution run wider than measured here.
        room_px = 0.95 * (width - (m.left - m.right) * scale) * fig.dpi

        def fits(handles: list, ncol: int) -> bool:
            legend = fig.legend(
                handles=handles, ncol=ncol, frameon=False, handlelength=1.8, columnspacing=1.2
            )
            width_px = legend.get_window_extent(renderer).width
            legend.remove()
            return width_px <= room_px

        handles, ncol, legend_rows = _legend_layout(methods, extras, fits)
        title_size = layout.font_size + 1.5
        title = _wrap_to_width(fig, renderer, title, title_size, room_px) if title else ""
        title_height = m.title + 0.10 + 1.2 * m.title * title.count("\n") if title else 0.0

        top = m.top_pad + legend_rows * m.legend_row + title_height
        # Wrap the footnote to the figure's width (DejaVu Sans averages ~0.55 em per character).
        note_size = layout.font_size - 1.5
        per_line = max(20, int((width - 0.1) * 72 / (0.55 * note_size)))
        footnote = textwrap.fill(footnote, per_line) if footnote else ""
        note_lines = footnote.count("\n") + 1 if footnote else 0
        note_height = 0.05 + m.footnote * note_lines if footnote else 0.0  # inches at 8 pt
        bottom = m.x_label + note_height
        gaps = [m.row_gap + m.title * title_lines[r] for r in range(1, n_rows)]
        head = m.title * title_lines[0]
        height = (top + head + bottom + sum(gaps)) * scale + n_rows * layout.panel_height
        fig.set_size_inches(width, height)
        y = height - (top + head) * scale
        for r in range(n_rows):
            if r:
                y -= gaps[r - 1] * scale
            y -= layout.panel_height
            for c, ax in enumerate(axes[r]):
                if ax is None:
                    continue
                x = m.left * scale + c * (layout.panel_width + m.col_gap * scale)
                ax.set_position(
                    (
                        x / width,
                        y / height,
                        layout.panel_width / width,
                        layout.panel_height / height,
                    )
                )
        center = (m.left * scale + (width - m.right * scale)) / 2 / width
        legend_top = 1 - (m.top_pad + title_height) * scale / height
        fig.legend(
            handles=handles,
            ncol=ncol,
            loc="upper center",
            frameon=False,
            bbox_to_anchor=(center, legend_top),
            handlelength=1.8,
            columnspacing=1.2,
            borderaxespad=0.0,
            borderpad=0.0,
        )
        if title:
            fig.text(
                center,
                1 - m.top_pad * scale / height,
                title,
                ha="center",
                va="top",
                fontsize=title_size,
            )
        label_y = (note_height + 0.04) * scale / height
        fig.text(center, label_y, x_label, ha="center", va="bottom")
        if footnote:
            fig.text(
                0.01,
                0.03 * scale / height,
                footnote,
                ha="left",
                va="bottom",
                color=NOTE_GREY,
                fontsize=layout.font_size - 1.5,
            )
    return fig


def save(fig: Figure, png: Path, pdf: Path, layout: LayoutSpec, dpi: int | None = None) -> None:
    """Write the PNG (at ``dpi``, default the layout's) and the PDF."""
    with mpl.rc_context(_rc(layout)):
        # Fast zlib level: the PNG is ~20% larger and encodes several times faster.
        fig.savefig(png, dpi=dpi or layout.dpi, pil_kwargs={"compress_level": 1})
        fig.savefig(pdf, metadata={"Creator": "pdmask", "CreationDate": None})
