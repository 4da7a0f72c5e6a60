"""A sweep's runs as a table: what ``pdmask.runs(sweep)`` and ``pdm runs`` show.

One row per MLflow run: its identity tags (the ``pdm.*`` tags of ``Trial.tags()``), status,
attempts, wall time, the headline metric (final and best) and its params as plain values. The
headline metric is, at each evaluated step, the mean over the datasets of the evaluation accuracy
the figures plot (``metric_names.HEADLINE_PATTERN``): final is its value at
the last step that evaluated, best its highest value. Reading writes nothing: a store that does not exist
yet is not created.
"""

from __future__ import annotations

import ast
import json
import math
import time
from typing import Any

from pdmask.errors import ConfigError, known_names
from pdmask.tracking.metric_names import is_headline
from pdmask.tracking.runs import with_retry
from pdmask.tracking.store import open_client, resolve_tracking_uri, sqlite_path

# Identity columns and the run tag each is read from (Trial.tags()).
IDENTITY_TAGS = {
    "sweep": "pdm.sweep",
    "method": "pdm.method",
    "method_label": "pdm.method_label",  # the method as tables show it (controls say so)
    "model": "pdm.model",
    "precision": "pdm.precision",
    "setting": "pdm.setting",
    "delta": "pdm.delta",
    "seed": "pdm.seed",
    "backend": "pdm.backend",
    "profile": "pdm.profile",
    "trial_hash": "pdm.trial_hash",
}
IDENTITY_COLUMNS = ["run_id", "run_name", *IDENTITY_TAGS]  # what names a run (`identity`)
COLUMNS = [
    *IDENTITY_COLUMNS,
    "status",
    "attempts",
    "failures",
    "failure_reason",
    "start_time",
    "end_time",
    "wall_s",
    "headline_final",
    "headline_best",
    "headline_step",
]


def plain(text: str | None) -> Any:
    """A stored string (param or tag) as the value it was: ``0.15`` a float, ``{'a': 1}`` a dict
    (older runs logged a nested param as its Python repr), anything else the text itself."""
    if text is None or text == "":
        return None
    for parse in (json.loads, ast.literal_eval):
        try:
            return parse(text)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
    return text


def headline(client, run) -> tuple[float | None, float | None, int | None]:
    """(final, best, final step) of the run's headline metric; Nones when it never evaluated."""
    by_step: dict[int, list[float]] = {}
    for name in filter(is_headline, run.data.metrics):
        history = with_retry(lambda n=name: client.get_metric_history(run.info.run_id, n))
        for point in history:
            if math.isfinite(point.value):
                by_step.setdefault(point.step, []).append(point.value)
    if not by_step:
        return None, None, None
    means = {step: sum(values) / len(values) for step, values in by_step.items()}
    last = max(means)
    return means[last], max(means.values()), last


def identity(run) -> dict[str, Any]:
    """A run's identity columns, the first of ``COLUMNS``: its id and name, then its
    ``IDENTITY_TAGS`` (delta and seed as numbers)."""
    tags, info = run.data.tags, run.info
    return {
        "run_id": info.run_id,
        "run_name": info.run_name or tags.get("mlflow.runName"),
        # Names stay strings (a model or hash that looks like a number is still a name).
        **{column: tags.get(tag) for column, tag in IDENTITY_TAGS.items()},
        "delta": plain(tags.get("pdm.delta")),
        "seed": plain(tags.get("pdm.seed")),
    }


def _row(client, run) -> dict[str, Any]:
    tags, info = run.data.tags, run.info
    start, end = info.start_time, info.end_time
    running = info.status == "RUNNING"
    if not start:
        wall = None
    elif running:
        wall = time.time() - start / 1000  # so far
    else:
        wall = (end - start) / 1000 if end else None
    final, best, step = headline(client, run)
    row: dict[str, Any] = {
        **identity(run),
        "status": info.status,
        "attempts": int(tags.get("pdm.attempts", "1")),
        "failures": len(json.loads(tags.get("pdm.failures", "[]"))),
        "failure_reason": tags.get("pdm.failure_reason"),
        "start_time": _iso(start),
        "end_time": None if running else _iso(end),
        "wall_s": wall,
        "headline_final": final,
        "headline_best": best,
        "headline_step": step,
    }
    row.update({f"params.{k}": plain(v) for k, v in sorted(run.data.params.items())})
    return row


def _iso(ms: int | None) -> str | None:
    return None if not ms else time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(ms / 1000))


def run_rows(sweep: str | None = None, tracking_uri: str | None = None) -> list[dict[str, Any]]:
    """The rows of ``runs`` as dicts (for ``pdm runs --json``): one per run of ``sweep``, or of
    every sweep in the store when ``sweep`` is None, ordered by sweep and run name."""
    client, found = sweep_runs(sweep, tracking_uri)
    rows = [_row(client, run) for run in found]
    return sorted(rows, key=lambda r: (r["sweep"] or "", r["run_name"] or ""))


def sweep_runs(sweep: str | None, tracking_uri: str | None = None) -> tuple[Any, list]:
    """(client, MLflow runs) of ``sweep``, or of every sweep when None; no runs (and no client)
    where the store does not exist yet. An unknown sweep raises ConfigError naming the closest
    known ones; a sweep of the project that never ran has no runs."""
    uri = resolve_tracking_uri(tracking_uri)
    if uri.startswith("sqlite:") and not sqlite_path(uri).exists():
        client = None
    else:
        client = open_client(uri)
    experiments = []
    if client is not None:
        experiments = with_retry(lambda: client.search_experiments(max_results=1000))
    if sweep is not None:
        exp = next((e for e in experiments if e.name == sweep), None)
        if exp is None:
            # the store's sweeps and the project's (a sweep that never ran is known)
            known = ({e.name for e in experiments} - {"Default"}) | _registry_sweeps()
            if sweep not in known:
                raise ConfigError(f"unknown sweep {sweep!r}: {known_names(sweep, known)}")
            return client, []  # a sweep of the project that has not run yet
        experiments = [exp]
    found = []
    for exp in experiments:
        if exp.name == "Default" and sweep is None:
            continue
        found += _all_runs(client, exp.experiment_id)
    return client, found


def _registry_sweeps() -> set[str]:
    try:
        from pdmask.registry import load_registry

        return set(load_registry().sweeps)
    except Exception:  # no project here (or a broken one): the store's names are all there is
        return set()


def _all_runs(client, experiment_id: str) -> list:
    out, token = [], None
    while True:
        page = with_retry(
            lambda t=token: client.search_runs([experiment_id], max_results=1000, page_token=t)
        )
        out += list(page)
        token = page.token
        if not token:
            return out


def runs(sweep: str | None = None, tracking_uri: str | None = None):
    """A pandas DataFrame of a sweep's runs (every sweep's when ``sweep`` is None): one row per
    MLflow run; columns ``COLUMNS`` then ``params.<name>`` for each param. An unknown sweep
    raises ConfigError naming the closest known ones."""
    import pandas as pd

    rows = run_rows(sweep, tracking_uri)
    frame = pd.DataFrame(rows)
    if frame.empty:
        return pd.DataFrame(columns=COLUMNS)
    return frame
