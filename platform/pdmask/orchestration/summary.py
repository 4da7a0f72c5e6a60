"""The end of a sweep in numbers: each setting's final headline metric over its seeds, and why
each failed trial failed. Pure: read from the runs ``SweepSession.settle`` already holds.

A run's final value is the mean of the backend's evaluation metrics (``eval_metrics``: one per
dataset) at its last logged step, as the figures plot it. Runs are grouped by their method as
tables show it (``Trial.method_label``: the parameters it varies and what the embedded knobs make
of it, so the lr = 0 controls are rows of their own, never seeds of the trained method) and by
every other axis of the trial (model, precision, delta) that differs between them; the seeds of a
group are its samples: mean ± sample standard deviation (none for a single seed).
"""

from __future__ import annotations

from statistics import mean, stdev
from typing import TypedDict

from pdmask.registry.sim_knobs import knobs_label

# The trial axes a result row is told apart by, as the run tags name them (Trial.tags()); the
# first is the method's label.
AXES = ("pdm.method_label", "pdm.model", "pdm.precision", "pdm.delta")
SIM_TAG_PREFIX = "pdm.sim."
FAILURE_REASON_TAG = "pdm.failure_reason"


class SettingResult(TypedDict):
    """One setting's final headline metric over its seeds."""

    setting: str  # its method as tables show it, then the other axes that vary
    method: str  # its method as tables show it
    cell: str  # the other axes that vary between the sweep's settings ("" when none does)
    n: int  # seeds with a value
    mean: float
    sd: float | None  # None for one seed


class TrialFailure(TypedDict):
    """A FAILED trial's run name and the first line of its reason."""

    name: str
    reason: str


def final_value(run, metrics: list[str]) -> float | None:
    values = [run.data.metrics[m] for m in metrics if m in run.data.metrics]
    return mean(values) if values else None


def mean_sd(values: list[float]) -> tuple[float, float | None]:
    return mean(values), (stdev(values) if len(values) > 1 else None)


def format_mean_sd(mean_: float, sd: float | None) -> str:
    return f"{mean_:.3f}" if sd is None else f"{mean_:.3f} ± {sd:.3f}"


def results_by_setting(runs: list, metrics: list[str]) -> list[SettingResult]:
    """One row per setting of the FINISHED ``runs``: ``setting`` (its method, then the other
    axes that vary), ``n`` (seeds with a value), ``mean``, ``sd`` (None for one seed)."""
    groups: dict[tuple, list[float]] = {}
    for run in runs:
        value = final_value(run, metrics) if run.info.status == "FINISHED" else None
        if value is not None:
            key = (_label(run.data.tags), *(run.data.tags.get(axis, "") for axis in AXES[1:]))
            groups.setdefault(key, []).append(value)
    # an axis varies when two settings' values differ (a method without a delta, GRPO, leaves
    # the delta as it is); the delta goes with the method, the rest make up the cell
    varying = [i for i in range(1, len(AXES)) if len({k[i] for k in groups} - {""}) > 1]
    delta = AXES.index("pdm.delta")
    rows = []
    for key, values in groups.items():
        m, sd = mean_sd(values)
        method = " ".join(
            t for i in [0, delta] if (i == 0 or i in varying) and (t := _text(i, key))
        )
        cell = " ".join(t for i in varying if i != delta and (t := _text(i, key)))
        setting = f"{method} {cell}" if cell else method
        rows.append(
            SettingResult(setting=setting, method=method, cell=cell, n=len(values), mean=m, sd=sd)
        )
    return sorted(rows, key=lambda r: r["setting"])


def _label(tags: dict[str, str]) -> str:
    """The run's method label; for a run logged before runs carried one, its method and its
    embedded knobs (the ``pdm.sim.*`` tags), which is what told controls apart."""
    if tags.get("pdm.method_label"):
        return tags["pdm.method_label"]
    knobs = {}
    for key, value in tags.items():
        if key.startswith(SIM_TAG_PREFIX):
            try:
                knobs[key.removeprefix(SIM_TAG_PREFIX)] = float(value)
            except ValueError:
                knobs[key.removeprefix(SIM_TAG_PREFIX)] = value
    method = tags.get("pdm.method", "")
    return f"{method} ({knobs_label(knobs)})" if knobs else method


def _text(i: int, key: tuple) -> str:
    return key[0] if i == 0 else _axis_text(AXES[i], key[i])


def _axis_text(axis: str, value: str) -> str:
    """The axis value as a result row shows it ("" for a method without a delta: GRPO's)."""
    if axis != "pdm.delta" or not value:
        return value
    try:  # a search samples deltas: 0.0884066, not 0.08840661465267692
        return f"δ={float(value):g}"
    except ValueError:
        return f"δ={value}"


def failures(runs: list) -> list[TrialFailure]:
    """``name`` and ``reason`` (its first line) of each FAILED run."""
    from pdmask.tracking.runs import attempt_failure

    out = []
    for run in runs:
        if run.info.status != "FAILED":
            continue
        reason = (run.data.tags.get(FAILURE_REASON_TAG) or "").strip().splitlines()[:1]
        out.append(
            TrialFailure(
                name=run.data.tags.get("mlflow.runName") or run.info.run_id,
                reason=reason[0] if reason else attempt_failure(run) or "no reason recorded",
            )
        )
    return out
