"""``build_figure``: MLflow runs of a sweep → figure (PNG, PDF), plotted data, manifest, summary.

The sweep runner calls it at the end of a sweep; ``pdm figure`` calls it from the command line.
It reads MLflow only through the tracking API (search_runs, get_metric_history) and writes only
into ``out_dir`` (default ``<state>/figures/<sweep>/<figure>``) and the history cache.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd

from pdmask import __version__
from pdmask.console import redact
from pdmask.figures.cells import CellCurves, eval_curves, metric_curves, wanted_metrics
from pdmask.figures.history import FetchStats, HistoryCache, load_histories
from pdmask.figures.panels import make_panels, panel_titles, plotted_frame, seed_count_text
from pdmask.figures.render import GridStyle, Panel, draw_grid, save
from pdmask.figures.runs import Selection, list_runs, open_client, select_runs
from pdmask.figures.spec import (
    BEYOND_PAPER_MARK,
    BandSpec,
    FigureSpec,
    SmoothingSpec,
    load_spec,
    spec_path,
)
from pdmask.figures.styles import MethodStyle, resolve_styles
from pdmask.figures.summary import summary_markdown, summary_rows
from pdmask.paths import state_dir
from pdmask.tracking.metric_names import stored_pattern
from pdmask.tracking.store import resolve_tracking_uri


@dataclass
class FigureResult:
    """What a build wrote, and how it went."""

    name: str
    sweep: str
    out_dir: Path
    paths: dict[str, Path]  # role (png, pdf, data_csv, manifest, ...) -> file written
    notes: list[str] = field(default_factory=list)  # missing cells, stopped runs, ...
    stats: dict[str, float] = field(default_factory=dict)  # runs, fetched, cached, seconds
    summary_markdown: str = ""

    @property
    def written(self) -> list[Path]:
        return list(self.paths.values())


@dataclass
class _Context:
    """Everything one build shares between its outputs."""

    spec: FigureSpec
    sweep: str
    out: Path
    styles: Mapping[str, MethodStyle]
    selection: Selection
    histories: dict
    paths: dict[str, Path] = field(default_factory=dict)

    @property
    def keys(self) -> list[str]:
        return [p.key for p in self.spec.panels]

    def path(self, role: str, filename: str) -> Path:
        self.paths[role] = self.out / filename
        return self.paths[role]


def _marked_styles(spec: FigureSpec, styles: Mapping[str, MethodStyle] | None) -> dict:
    """Every method's style; a method beyond the paper says so in its name."""
    resolved = resolve_styles(spec.all_methods, styles)
    for method in spec.beyond_paper:
        style = resolved[method]
        resolved[method] = MethodStyle(f"{style.display_name} {BEYOND_PAPER_MARK}", style.color)
    return resolved


def _y_label(spec: FigureSpec, datasets: set[str]) -> str:
    names = [spec.metric.dataset_labels.get(d, d) for d in sorted(datasets)]
    return f"{spec.metric.label} ({' + '.join(names)})" if names else spec.metric.label


def _drawn_runs(ctx: _Context, grid: list[list[Panel]]) -> int:
    """How many runs the lines of ``grid`` rest on (each run once, whatever the rows)."""
    return len(
        {
            run.run_id
            for panels in grid
            for key, panel in zip(ctx.keys, panels, strict=True)
            for line in panel.lines
            for run in ctx.selection.cells.get((key, line.method), ())
        }
    )


def _methods_that_ran(ctx: _Context) -> list[str]:
    """The paper's methods, then those beyond it that have runs here (on VeRL, pdm-gram has
    none: no panel says "no data" for a method the backend never trains)."""
    ran = {series for _, series in ctx.selection.cells}
    return [*ctx.spec.methods, *(m for m in ctx.spec.beyond_paper if m in ran)]


def _footnote(ctx: _Context, smoothing: SmoothingSpec, runs: int) -> str:
    parts = ["Lines: mean over the seeds present at each step"]
    if smoothing.describe():
        parts.append(smoothing.describe())
    delta = f", δ\u00a0=\u00a0{ctx.spec.delta:g}" if ctx.spec.delta is not None else ""  # no break
    parts.append(f"sweep {ctx.sweep}{delta}, {runs} run{'s' if runs != 1 else ''} drawn")
    return "; ".join(parts) + "."


def _grid_style(
    ctx: _Context,
    band: BandSpec,
    seeds: str,
    methods: list[str],
    *,
    with_controls: bool = False,
) -> GridStyle:
    # A band needs two seeds: with one seed per line there is none, and no legend entry for it.
    label = (
        band.describe(seeds) if band.kind != "none" and seeds not in {"1 seed", "no seeds"} else ""
    )
    spec = ctx.spec
    styles, linestyles, series = dict(ctx.styles), dict(spec.linestyles), list(methods)
    if with_controls:
        for control in spec.controls:
            styles[control.key] = MethodStyle(control.label, control.color)
            linestyles[control.key] = control.linestyle
            series.append(control.key)
    return GridStyle(styles, linestyles, series, spec.layout, label)


def _write_main(
    ctx: _Context,
    cells: dict[tuple[str, str], CellCurves],
    y_label: str,
    methods: list[str],
    extended: bool = False,
) -> list[Panel]:
    """The figure of ``methods`` (the paper's), or with ``extended`` its ``-extended`` twin
    (files and roles named so) that draws the methods beyond the paper too."""
    spec = ctx.spec
    name, role = (f"{spec.name}-extended", "extended_") if extended else (spec.name, "")
    panels = make_panels(spec, ctx.selection, cells, spec.band, ctx.styles, methods)
    cols = spec.layout.columns
    rows = [panels[i : i + cols] for i in range(0, len(panels), cols)]
    fig = draw_grid(
        rows,
        _grid_style(ctx, spec.band, seed_count_text(panels), methods),
        row_labels=[y_label] * len(rows),
        yscales=["linear"] * len(rows),
        x_label=spec.x_label,
        title=spec.title,
        footnote=_footnote(ctx, spec.smoothing, _drawn_runs(ctx, [panels])),
    )
    save(
        fig,
        ctx.path(f"{role}png", f"{name}.png"),
        ctx.path(f"{role}pdf", f"{name}.pdf"),
        spec.layout,
    )
    frame = plotted_frame(name, stored_pattern(spec.metric.pattern), ctx.keys, panels)
    frame.to_csv(ctx.path(f"{role}data_csv", f"{name}.data.csv"), index=False)
    return panels


def _write_diagnostics(ctx: _Context, seeds: str) -> None:
    spec, dspec = ctx.spec, ctx.spec.diagnostics
    band = dspec.band or spec.band
    style = _grid_style(ctx, band, seeds, _methods_that_ran(ctx), with_controls=True)
    grid: list[list[Panel]] = []
    frames: list[pd.DataFrame] = []
    for metric in dspec.metrics:
        cells = metric_curves(ctx.selection, ctx.histories, metric.name, dspec.smoothing)
        panels = make_panels(spec, ctx.selection, cells, band, style.styles, style.methods)
        if grid:  # settings are named once, above the first row
            for panel in panels:
                panel.title = ""
        grid.append(panels)
        frames.append(plotted_frame(f"{spec.name}-diagnostics", metric.name, ctx.keys, panels))
    fig = draw_grid(
        grid,
        style,
        row_labels=[m.label for m in dspec.metrics],
        yscales=[m.yscale for m in dspec.metrics],
        x_label=spec.x_label,
        title=f"{spec.title} — training diagnostics" if spec.title else "Training diagnostics",
        footnote=_footnote(ctx, dspec.smoothing, _drawn_runs(ctx, grid)),
    )
    stem = f"{spec.name}-diagnostics"
    save(
        fig,
        ctx.path("diagnostics_png", f"{stem}.png"),
        ctx.path("diagnostics_pdf", f"{stem}.pdf"),
        spec.layout,
        dpi=dspec.dpi,
    )
    pd.concat(frames, ignore_index=True).to_csv(
        ctx.path("diagnostics_csv", f"{stem}.data.csv"), index=False
    )


def _write_summary(ctx: _Context, cells: dict[tuple[str, str], CellCurves], y_label: str) -> str:
    spec = ctx.spec
    by_cell = {k: list(zip(c.runs, c.raw, strict=True)) for k, c in cells.items()}
    rows = summary_rows(spec, by_cell)
    markdown = summary_markdown(spec, rows, y_label, panel_titles(spec, ctx.selection))
    pd.DataFrame(rows).to_csv(ctx.path("summary_csv", f"{spec.name}.summary.csv"), index=False)
    ctx.path("summary_md", f"{spec.name}.summary.md").write_text(markdown, encoding="utf-8")
    return markdown


def _manifest(ctx, uri, name, cells, datasets, notes, stats) -> dict:
    spec, runs = ctx.spec, ctx.selection.runs()
    return {
        "figure": spec.name,
        "sweep": ctx.sweep,
        "tracking_uri": redact(uri),  # no password in a file (console.redact)
        "built_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "pdmask_version": __version__,
        "spec_file": spec_path(name).name,
        "spec": spec.model_dump(mode="json"),
        "y": spec.metric.description,
        "datasets": sorted(datasets),
        "band": spec.band.describe(),
        "smoothing": spec.smoothing.model_dump(mode="json"),
        "styles": {m: vars(s) for m, s in ctx.styles.items()},
        "git_shas": sorted({r.tag("git_sha") for r in runs if r.tag("git_sha")}),
        "runs": [
            {
                "run_id": r.run_id,
                "trial_hash": r.tag("trial_hash"),
                "git_sha": r.tag("git_sha"),
                "method": r.method,
                "setting": key,
                "seed": r.seed,
                "backend": r.tag("backend"),
                "status": r.status,
                "stopped": r.stopped,
                "datasets": sorted(cell.datasets.get(r.run_id, ())),
                "eval_points": len(raw),
                "last_step": int(raw.steps[-1]) if len(raw) else None,
            }
            for (key, _), cell in cells.items()
            for r, raw in zip(cell.runs, cell.raw, strict=True)
        ],
        "superseded": [
            {"run_id": r.run_id, "status": r.status, "kept": kept}
            for r, kept in ctx.selection.superseded
        ],
        "ignored_runs": ctx.selection.ignored,
        "notes": notes,
        "outputs": {role: p.name for role, p in ctx.paths.items()},
        "stats": stats,
    }


def build_figure(
    name: str,
    *,
    sweep: str | None = None,
    tracking_uri: str | None = None,
    out_dir: str | Path | None = None,
    styles: Mapping[str, MethodStyle] | None = None,
    use_cache: bool = True,
    diagnostics: bool = True,
    trial_hashes: set[str] | None = None,
) -> FigureResult:
    """Build figure ``name`` (a spec in ``dashboards/``, or a path) from the runs of ``sweep``.

    ``sweep`` defaults to the spec's sweep, ``tracking_uri`` to $MLFLOW_TRACKING_URI or the
    project's sqlite store, ``styles`` to the recipe registry's (else a fixed palette);
    ``use_cache=False`` re-reads every history from MLflow; ``diagnostics=False`` skips the
    companion diagnostics figure even when the spec declares one. ``trial_hashes`` restricts
    the figure to those trials (the sweep runner passes its resolved trials).

    Raises:
        ConfigError: no such spec, or a spec that does not parse or validate
            (``ValidationFailed``, every problem at once).
        TrackingError: the tracking store cannot be read or trusted.
    """
    started = time.perf_counter()
    spec = load_spec(name)
    sweep = sweep or spec.sweep
    uri = resolve_tracking_uri(tracking_uri)
    out = Path(out_dir) if out_dir else state_dir() / "figures" / sweep / spec.name
    out.mkdir(parents=True, exist_ok=True)

    client = open_client(uri)
    selection = select_runs(spec, list_runs(client, sweep), trial_hashes)
    cache = HistoryCache(state_dir() / "cache" / "metric-history", uri, enabled=use_cache)
    fetch = FetchStats()
    histories = load_histories(client, wanted_metrics(spec, selection), cache, fetch)
    read_s = time.perf_counter() - started
    ctx = _Context(spec, sweep, out, _marked_styles(spec, styles), selection, histories)

    cells = eval_curves(spec, selection, histories)
    datasets = {d for c in cells.values() for ds in c.datasets.values() for d in ds}
    y_label = _y_label(spec, datasets)
    panels = _write_main(ctx, cells, y_label, spec.methods)
    if _methods_that_ran(ctx) != spec.methods:
        _write_main(ctx, cells, y_label, _methods_that_ran(ctx), extended=True)
    if spec.diagnostics and diagnostics:
        _write_diagnostics(ctx, seed_count_text(panels))
    markdown = _write_summary(ctx, cells, y_label)

    notes = [
        " ".join(f"{panel.title}: {n}".split())  # titles and notes may hold line breaks
        for panel in panels
        for n in panel.notes
    ]
    notes += [
        f"stopped: run {s.run_id} ({line.method}, {key}, seed {s.seed}, {s.status}) at step {s.step}"
        for key, panel in zip(ctx.keys, panels, strict=True)
        for line in panel.lines
        for s in line.stops
    ]
    stats = {
        "runs": len(selection.runs()),
        "fetched": fetch.fetched,
        "cached": fetch.cached,
        "read_seconds": round(read_s, 3),  # listing runs + metric histories (MLflow or cache)
    }
    ctx.paths["manifest"] = out / f"{spec.name}.manifest.json"
    stats["seconds"] = round(time.perf_counter() - started, 3)
    manifest = _manifest(ctx, uri, name, cells, datasets, notes, stats)
    ctx.paths["manifest"].write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return FigureResult(spec.name, sweep, out, dict(ctx.paths), notes, stats, markdown)
