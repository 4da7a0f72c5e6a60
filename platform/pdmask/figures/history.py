"""Metric histories of runs, read with ``MlflowClient.get_metric_history`` through a local cache.

The cache holds one JSON file per run under ``<state>/cache/metric-history/<store id>/``. A file
is valid for a run only while the run's status and end time are the ones recorded in it, and only
for runs that ended (FINISHED, FAILED, KILLED): a finished run is never fetched again, a resumed
run (status back to RUNNING, then a new end time) is. Running runs are always fetched afresh.
Histories are stored already reduced to the last finite value per step.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pdmask.errors import TrackingError
from pdmask.figures.runs import RunRecord
from pdmask.figures.series import Curve, last_value_per_step

CACHE_FORMAT = 1


@dataclass
class FetchStats:
    """How a build got its histories (reported by the CLI and the benchmark)."""

    fetched: int = 0  # get_metric_history calls
    cached: int = 0  # histories served from the cache


class HistoryCache:
    """Per-run JSON files of reduced metric histories, keyed by run id + status + end time."""

    def __init__(self, root: Path, tracking_uri: str, enabled: bool = True):
        store_id = hashlib.sha256(tracking_uri.encode()).hexdigest()[:16]
        self.folder = root / store_id
        self.enabled = enabled

    @staticmethod
    def _key(run: RunRecord) -> dict:
        return {"format": CACHE_FORMAT, "status": run.status, "end_time": run.end_time}

    def load(self, run: RunRecord) -> dict[str, Curve]:
        """Cached histories of a run that ended; {} when absent, stale or unreadable."""
        if not (self.enabled and run.terminal):
            return {}
        try:
            data = json.loads((self.folder / f"{run.run_id}.json").read_text())
        except (OSError, ValueError):
            return {}
        if data.get("key") != self._key(run):
            return {}
        return {
            name: Curve(np.asarray(m["steps"], np.int64), np.asarray(m["values"], np.float64))
            for name, m in data.get("metrics", {}).items()
        }

    def save(self, run: RunRecord, curves: dict[str, Curve]) -> None:
        """Write atomically (a concurrent build never reads half a file)."""
        if not (self.enabled and run.terminal):
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        payload = {
            "key": self._key(run),
            "metrics": {
                name: {"steps": c.steps.tolist(), "values": c.values.tolist()}
                for name, c in curves.items()
            },
        }
        fd, tmp = tempfile.mkstemp(dir=self.folder, suffix=".tmp")
        with os.fdopen(fd, "w") as handle:
            json.dump(payload, handle, separators=(",", ":"))
        os.replace(tmp, self.folder / f"{run.run_id}.json")


def _fetch(client, run_id: str, key: str) -> Curve:
    from mlflow.exceptions import MlflowException

    try:
        history = client.get_metric_history(run_id, key)
    except MlflowException as err:
        raise TrackingError(f"cannot read metric {key!r} of run {run_id}: {err}") from err
    return last_value_per_step(
        [m.step for m in history], [m.value for m in history], [m.timestamp for m in history]
    )


def load_histories(
    client,
    wanted: Iterable[tuple[RunRecord, Iterable[str]]],
    cache: HistoryCache,
    stats: FetchStats,
    workers: int = 4,
) -> dict[str, dict[str, Curve]]:
    """Histories of the wanted (run, metric names), from the cache where valid, else MLflow.

    Missing histories are fetched on a small thread pool: against a remote tracking server the
    calls are network-bound, and with a local sqlite store it does no harm.
    """
    result: dict[str, dict[str, Curve]] = {}
    todo: list[tuple[RunRecord, str]] = []
    runs: dict[str, RunRecord] = {}
    for run, keys in wanted:
        keys = [k for k in keys if k in run.metric_keys]
        runs[run.run_id] = run
        cached = cache.load(run)
        result[run.run_id] = {k: cached[k] for k in keys if k in cached}
        stats.cached += len(result[run.run_id])
        todo.extend((run, k) for k in keys if k not in cached)
    if not todo:
        return result
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        curves = list(pool.map(lambda item: _fetch(client, item[0].run_id, item[1]), todo))
    stats.fetched += len(todo)
    touched: set[str] = set()
    for (run, key), curve in zip(todo, curves, strict=True):
        result[run.run_id][key] = curve
        touched.add(run.run_id)
    for run_id in touched:
        run = runs[run_id]
        merged = {**cache.load(run), **result[run_id]}  # keep metrics other figures cached
        cache.save(run, merged)
    return result
