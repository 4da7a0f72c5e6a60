"""Per-seed curves of every (setting, method) cell, from the loaded metric histories."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pdmask.figures.runs import RunRecord, Selection
from pdmask.figures.series import Curve, mean_over_datasets, smooth
from pdmask.figures.spec import FigureSpec, SmoothingSpec
from pdmask.tracking.metric_names import match_datasets, sanitize_metric

Histories = Mapping[str, Mapping[str, Curve]]  # run id -> metric name -> curve


@dataclass
class CellCurves:
    """One cell's seeds: raw curves (for the summary) and smoothed ones (for the plot)."""

    runs: list[RunRecord]
    raw: list[Curve]
    smoothed: list[Curve]
    datasets: dict[str, tuple[str, ...]] = field(default_factory=dict)  # run id -> datasets


def _logged_name(run: RunRecord, name: str) -> str:
    """The name under which ``run`` logged ``name`` (as written, or MLflow-sanitised)."""
    return name if name in run.metric_keys else sanitize_metric(name)


def wanted_metrics(spec: FigureSpec, selection: Selection) -> Iterable[tuple[RunRecord, list]]:
    """(run, metric names to load) for every selected run: evaluation + diagnostics."""
    diagnostics = [m.name for m in spec.diagnostics.metrics] if spec.diagnostics else []
    for run in selection.runs():
        evals = match_datasets(spec.metric.pattern, run.metric_keys).values()
        yield run, [*evals, *(_logged_name(run, n) for n in diagnostics)]


def eval_curves(
    spec: FigureSpec, selection: Selection, histories: Histories
) -> dict[tuple[str, str], CellCurves]:
    """The plotted metric: per run, the mean over matching datasets present at each step."""
    cells = {}
    for cell_key, runs in selection.cells.items():
        raw, datasets = [], {}
        for run in runs:
            per_dataset = {
                ds: histories[run.run_id][name]
                for ds, name in match_datasets(spec.metric.pattern, run.metric_keys).items()
                if name in histories[run.run_id]
            }
            datasets[run.run_id] = tuple(ds for ds, c in per_dataset.items() if len(c))
            raw.append(mean_over_datasets(per_dataset))
        cells[cell_key] = CellCurves(runs, raw, [smooth(c, spec.smoothing) for c in raw], datasets)
    return cells


def metric_curves(
    selection: Selection, histories: Histories, name: str, smoothing: SmoothingSpec
) -> dict[tuple[str, str], CellCurves]:
    """One plain metric (a training diagnostic) per run."""
    cells = {}
    for cell_key, runs in selection.cells.items():
        raw = [histories[r.run_id].get(_logged_name(r, name), Curve.empty()) for r in runs]
        cells[cell_key] = CellCurves(runs, raw, [smooth(c, smoothing) for c in raw])
    return cells
