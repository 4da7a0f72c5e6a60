"""Reuse across sweeps: a trial that FINISHED, complete, in another sweep is linked, not retrained.

A trial's hash is what it trains (``registry/trial.py``), whichever sweep planned it, so a run of
another experiment with the same ``pdm.trial_hash`` is this trial's result. A *link run* puts it
into this sweep's experiment, so everything that reads the experiment (its view in the UI,
``pdm runs``, the figures, the summary) works unchanged: the source's params and tags, its whole
metric history with its steps and timestamps, status FINISHED, tags ``pdm.reused_from_run`` (the
source's run id) and ``pdm.reused_from_sweep`` (its experiment), and a description that names
the source. Artifacts stay with the source.

A link is never itself a source (its tag points at the original, which is found directly), a
half-copied link (its process killed mid-copy) is deleted before it could pass for a result, and a
trial whose experiment already holds a FINISHED run is never linked again: relinking is a no-op.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from pdmask.tracking.runs import with_retry
from pdmask.tracking.store import DESCRIPTION_TAG

REUSED_FROM_RUN = "pdm.reused_from_run"
REUSED_FROM_SWEEP = "pdm.reused_from_sweep"
# MLflow's limits per log_batch call (params 100, entities 1000).
PARAMS_PER_BATCH = 100
METRICS_PER_BATCH = 1000


@dataclass(frozen=True)
class Source:
    """The original FINISHED run of a trial, in another sweep's experiment."""

    run: Any  # mlflow.entities.Run
    sweep: str  # its experiment's name

    @property
    def label(self) -> str:
        """``<sweep>/<run name>``: what the plan says the trial reuses."""
        return f"{self.sweep}/{self.run.data.tags.get('mlflow.runName', self.run.info.run_id)}"


def is_link(run) -> bool:
    return REUSED_FROM_RUN in run.data.tags


def finished_elsewhere(
    client, experiment_id: str | None, hashes: Iterable[str], complete: Callable[[str, Any], bool]
) -> dict[str, Source]:
    """For each trial hash of ``hashes``, its newest FINISHED original run in an experiment other
    than ``experiment_id`` for which ``complete(hash, run)`` holds (a run that passed as
    finished before the completeness rule may lack steps: never reused)."""
    wanted = set(hashes)
    if not wanted:
        return {}
    names = {
        e.experiment_id: e.name
        for e in with_retry(lambda: client.search_experiments())
        if e.experiment_id != experiment_id
    }
    candidates: dict[str, list] = {}
    token = None
    while names:
        page = with_retry(
            lambda t=token: client.search_runs(
                list(names),
                filter_string="attributes.status = 'FINISHED'",
                max_results=1000,
                order_by=["attributes.start_time DESC"],
                page_token=t,
            )
        )
        for run in page:
            h = run.data.tags.get("pdm.trial_hash")
            if h in wanted and not is_link(run):
                candidates.setdefault(h, []).append(run)
        token = page.token
        if not token:
            break
    found: dict[str, Source] = {}
    for h, runs in candidates.items():
        run = next((r for r in runs if complete(h, r)), None)
        if run is not None:
            found[h] = Source(run, names[run.info.experiment_id])
    return found


def drop_broken_links(client, by_hash: dict[str, list]) -> None:
    """Delete the links a killed process left half-copied (not FINISHED), and forget them in
    ``by_hash``: such a run must neither pass for a result nor be resumed as a training."""
    for h, runs in by_hash.items():
        broken = [r for r in runs if is_link(r) and r.info.status != "FINISHED"]
        for r in broken:
            with_retry(lambda r=r: client.delete_run(r.info.run_id))
        by_hash[h] = [r for r in runs if r not in broken]


def link(client, source: Source, experiment_id: str, sweep: str, tags: dict[str, str]) -> str:
    """A FINISHED link run of ``source`` in ``experiment_id`` (sweep ``sweep``), ``tags`` added
    (this invocation's own, e.g. its overrides); its run id. Deleted again when the copy fails."""
    from mlflow.entities import Metric, Param

    src = source.run
    src_id = src.info.run_id
    original = src.data.tags.get(DESCRIPTION_TAG, "")
    all_tags = {
        **src.data.tags,
        **tags,
        "pdm.sweep": sweep,
        REUSED_FROM_RUN: src_id,
        REUSED_FROM_SWEEP: source.sweep,
        DESCRIPTION_TAG: f"Reused from run {src_id} of sweep {source.sweep} ({source.label}), "
        f"not trained again; its artifacts are there. {original}".strip(),
    }
    run = with_retry(
        lambda: client.create_run(experiment_id, start_time=src.info.start_time, tags=all_tags)
    )
    run_id = run.info.run_id
    try:
        params = [Param(k, v) for k, v in src.data.params.items()]
        for i in range(0, len(params), PARAMS_PER_BATCH):
            chunk = params[i : i + PARAMS_PER_BATCH]
            with_retry(lambda c=chunk: client.log_batch(run_id, params=c))
        history = [
            Metric(m.key, m.value, m.timestamp, m.step)
            for key in src.data.metrics
            for m in with_retry(lambda k=key: client.get_metric_history(src_id, k))
        ]
        for i in range(0, len(history), METRICS_PER_BATCH):
            chunk = history[i : i + METRICS_PER_BATCH]
            with_retry(lambda c=chunk: client.log_batch(run_id, metrics=c))
        with_retry(
            lambda: client.set_terminated(run_id, status="FINISHED", end_time=src.info.end_time)
        )
    except BaseException:
        with_retry(lambda: client.delete_run(run_id))  # never a half-copied result
        raise
    return run_id
