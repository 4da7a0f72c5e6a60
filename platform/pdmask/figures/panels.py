"""From cell curves to what is drawn (panels of lines) and to the plotted-data CSV rows."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from pdmask.figures.cells import CellCurves
from pdmask.figures.render import Line, Panel, StopMark
from pdmask.figures.runs import Selection
from pdmask.figures.series import aggregate_seeds
from pdmask.figures.spec import PRECISION_FIELD, BandSpec, FigureSpec, PanelSpec
from pdmask.figures.styles import MethodStyle
from pdmask.registry.backends import BACKENDS
from pdmask.registry.catalog import PRECISIONS

# Characters per line of a precision label in a panel title: a label wraps at word boundaries to
# stay within the panel's width at the layouts' font sizes (1.55 in at 8 pt holds about 26).
TITLE_LABEL_WIDTH = 24


def _line(method: str, cell: CellCurves, band: BandSpec) -> Line | None:
    if not any(len(c) for c in cell.smoothed):
        return None
    stops = [
        StopMark(int(c.steps[-1]), float(c.values[-1]), r.run_id, r.seed, r.status)
        for r, c in zip(cell.runs, cell.smoothed, strict=True)
        if r.stopped and len(c)
    ]
    return Line(method, aggregate_seeds(cell.smoothed, band), stops)


def precision_label(precision: str, backends: set[str], labels: set[str] = frozenset()) -> str:
    """What a panel's precision setting is on the backend that trained its runs: the label the
    runs carry (``pdm.precision_label``, which a job sets for the engine that trained it) when
    they agree, else the catalog's ``label_on`` for their one backend; with no runs, or runs of
    several backends, the label that claims nothing."""
    if len(labels) == 1 and len(backends) == 1:
        return next(iter(labels))
    spec = PRECISIONS.get(precision)
    if spec is None:  # a spec may select a tag value the catalog does not know
        return precision
    return spec.label_on(next(iter(backends)) if len(backends) == 1 else None)


def honest_title(panel: PanelSpec, backends: set[str], labels: set[str] = frozenset()) -> str:
    """The panel's title as its runs make it true: ``{precision}`` becomes what the setting is
    on the backend that trained them (fp8-e2e trains in BF16 on VeRL's FSDP engine; ``labels``:
    the runs' own precision labels), and "Qwen3-4B-Base stand-in" when every run trained a
    backend's small stand-in of the named model."""
    shown = precision_label(panel.precision, backends, labels)
    label = "\n".join(textwrap.wrap(shown, TITLE_LABEL_WIDTH))
    title = panel.title.replace(PRECISION_FIELD, label)
    known = [BACKENDS.get(b) for b in backends]
    if not known or not all(spec and spec.trains_stand_ins for spec in known):
        return title
    model, _, rest = title.partition("\n")
    return f"{model} stand-in" + (f"\n{rest}" if rest else "")


def _tag_values(selection: Selection, setting: str, tag: str) -> set[str]:
    """The values of ``pdm.<tag>`` among a setting's runs (empty ones left out)."""
    return {
        r.tag(tag)
        for (key, _), runs in selection.cells.items()
        if key == setting
        for r in runs
        if r.tag(tag)
    }


def _title(panel: PanelSpec, selection: Selection) -> str:
    return honest_title(
        panel,
        _tag_values(selection, panel.key, "backend"),
        _tag_values(selection, panel.key, "precision_label"),
    )


def panel_titles(spec: FigureSpec, selection: Selection) -> dict[str, str]:
    """Each setting's title as its panel shows it (:func:`honest_title`), by setting key."""
    return {p.key: _title(p, selection) for p in spec.panels}


def make_panels(
    spec: FigureSpec,
    selection: Selection,
    cells: Mapping[tuple[str, str], CellCurves],
    band: BandSpec,
    styles: Mapping[str, MethodStyle],
    series: Sequence[str] | None = None,
) -> list[Panel]:
    """One panel per setting, with a note for every missing cell, running or mixed run.

    ``series``: the lines drawn, in order (default: the figure's methods; the diagnostics figure
    adds its controls)."""
    panels = []
    for p in spec.panels:
        backends = _tag_values(selection, p.key, "backend")
        panel = Panel(_title(p, selection))
        missing, running = [], 0
        for method in series or spec.methods:
            cell = cells.get((p.key, method))
            line = _line(method, cell, band) if cell else None
            if line is None:
                missing.append(styles[method].display_name)
                continue
            panel.lines.append(line)
            running += sum(r.status == "RUNNING" for r in cell.runs)
        if not panel.lines:
            panel.notes.append(f"no runs for this setting\n({p.model}, {p.precision})")
        elif missing:
            panel.notes.append("no data: " + ", ".join(missing))
        if running:
            panel.notes.append(f"{running} run(s) still running")
        if len(backends) > 1:
            panel.notes.append("mixes backends: " + ", ".join(sorted(backends)))
        panels.append(panel)
    return panels


COLUMNS = ["figure", "setting", "metric", "method", "series", "step", "value", "band_lower",
           "band_upper", "n_seeds", "sd", "run_id", "seed", "status"]  # fmt: skip


def plotted_frame(figure: str, metric: str, keys: list[str], panels: list[Panel]) -> pd.DataFrame:
    """The exact plotted data: the seed means with their band, then the stop markers."""
    frames = []
    for key, panel in zip(keys, panels, strict=True):
        for line in panel.lines:
            agg = line.aggregate
            base = {"figure": figure, "setting": key, "metric": metric, "method": line.method}
            frames.append(
                pd.DataFrame(
                    {
                        **base,
                        "series": "mean",
                        "step": agg.steps,
                        "value": agg.mean,
                        "band_lower": agg.lower,
                        "band_upper": agg.upper,
                        "n_seeds": agg.n_seeds,
                        "sd": agg.sd,
                        "run_id": "",
                        "seed": "",
                        "status": "",
                    }
                )  # fmt: skip
            )
            if line.stops:
                frames.append(
                    pd.DataFrame(
                        {
                            **base,
                            "series": "stop",
                            "step": [s.step for s in line.stops],
                            "value": [s.value for s in line.stops],
                            "band_lower": np.nan,
                            "band_upper": np.nan,
                            "n_seeds": 1,
                            "sd": np.nan,
                            "run_id": [s.run_id for s in line.stops],
                            "seed": [s.seed for s in line.stops],
                            "status": [s.status for s in line.stops],
                        }
                    )  # fmt: skip
                )
    if not frames:
        return pd.DataFrame(columns=COLUMNS)
    return pd.concat(frames, ignore_index=True)[COLUMNS]


def seed_count_text(panels: list[Panel]) -> str:
    """'3 seeds', or '2–3 seeds' when lines rest on different numbers of seeds."""
    counts = sorted({int(line.aggregate.n_seeds.max()) for p in panels for line in p.lines})
    if not counts:
        return "no seeds"
    if len(counts) == 1:
        return f"{counts[0]} seed{'s' if counts[0] != 1 else ''}"
    return f"{counts[0]}–{counts[-1]} seeds"
