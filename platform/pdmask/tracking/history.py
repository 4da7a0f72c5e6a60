"""A sweep's metric histories as one long table: what ``pdmask.history(sweep, metric=...)``
returns.

One row per point a run logged of a matching metric: the run's identity (the columns
``pdmask.runs`` starts with: run id and name, method, its label, model, precision, setting,
delta, seed, backend, profile, trial hash), the metric as stored, its step, value and timestamp.
Raw: no smoothing, no mean over datasets, and a step a resumed run logged twice is there twice
(the later timestamp is what the figures plot). Reading writes nothing.
"""

from __future__ import annotations

from pdmask.errors import ConfigError, known_names
from pdmask.tracking.metric_names import HEADLINE_PATTERN, match_datasets, sanitize_metric
from pdmask.tracking.results import IDENTITY_COLUMNS, identity, sweep_runs
from pdmask.tracking.runs import with_retry

POINT_COLUMNS = ["metric", "step", "value", "timestamp"]


def matching(metric: str, names) -> list[str]:
    """The stored names among ``names`` that ``metric`` means: the name itself, written with
    ``@`` or as stored, or with one ``*`` (a dataset) every name it matches."""
    if metric.count("*") > 1:
        raise ConfigError(f"metric {metric!r}: at most one `*` (one path segment, the dataset)")
    if "*" in metric:
        return sorted(match_datasets(metric, names).values())
    return [n for n in names if sanitize_metric(n) == sanitize_metric(metric)]


def history(sweep: str, metric: str = HEADLINE_PATTERN, tracking_uri: str | None = None):
    """The long-format frame of the module docstring, ordered by run name, metric, step and
    time; ``timestamp`` in UTC. A sweep that never ran gives an empty frame.

    Raises:
        ConfigError: an unknown sweep (with the closest names), a metric no run of the sweep
            logged (with the closest logged names), a pattern with more than one `*`.
        TrackingError: the store cannot be read or trusted.
    """
    import pandas as pd

    client, runs = sweep_runs(sweep, tracking_uri)
    rows, logged = [], set()
    for run in runs:
        logged |= set(run.data.metrics)
        for name in matching(metric, run.data.metrics):
            run_id = run.info.run_id
            points = with_retry(lambda r=run_id, n=name: client.get_metric_history(r, n))
            base = {**identity(run), "metric": name}
            rows += [
                {**base, "step": p.step, "value": p.value, "timestamp": p.timestamp} for p in points
            ]
    if runs and not rows:
        raise ConfigError(
            f"no run of sweep {sweep!r} logged a metric {metric!r}; {known_names(metric, logged)}"
        )
    frame = pd.DataFrame(rows, columns=[*IDENTITY_COLUMNS, *POINT_COLUMNS])
    frame["timestamp"] = pd.to_datetime(frame["timestamp"], unit="ms", utc=True)
    order = ["run_name", "metric", "step", "timestamp"]
    return frame.sort_values(order, kind="stable").reset_index(drop=True)
