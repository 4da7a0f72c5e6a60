"""Measured step times: what the runs of a model x precision x cluster took per RL step.

VeRL jobs log ``timing_s/step`` every step (verl 0.9.1 ``trainer/ppo/v1/trainer_base.py``: the
``step`` timer spans rollout, update and the step's checkpoint save; validation is
``timing_s/testing``, outside it). The embedded backend logs no step time (``perf/tokens_per_s``
only) and plans no GPUs, so only VeRL runs are read. A run's cluster is its
``pdm.verl.resources`` tag (``<nodes>x<gpus per node> <GPU kind>``, set at submission).

``StepTimes.read`` reads the FINISHED and RUNNING runs of every experiment once;
``StepTimes.seconds`` is the median over every step those runs of the cell logged (a save falls
on one step in ``save_freq``, so the median is a step without one). The dry run's cost uses it
(``pdm sweep --dry-run``); a live ETA can too.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from pdmask.tracking.store import open_client, resolve_tracking_uri, sqlite_path

STEP_METRIC = "timing_s/step"
RESOURCES_TAG = "pdm.verl.resources"
STATUSES = ("FINISHED", "RUNNING")


@dataclass(frozen=True)
class Measured:
    seconds: float  # median step
    runs: int
    steps: int


@dataclass
class StepTimes:
    """Logged step times per (model, precision, resources tag)."""

    by_cell: dict[tuple[str, str, str], dict[str, list[float]]] = field(default_factory=dict)

    @classmethod
    def read(cls, tracking_uri: str | None = None, client=None) -> StepTimes:
        """Every VeRL run's step times; an empty index where the store does not exist yet (a
        dry run creates nothing)."""
        if client is None:
            uri = resolve_tracking_uri(tracking_uri)
            if uri.startswith("sqlite:") and not sqlite_path(uri).exists():
                return cls()
            client = open_client(uri)
        index = cls()
        experiments = [e.experiment_id for e in client.search_experiments()]
        if not experiments:
            return index
        runs = client.search_runs(
            experiments, filter_string="tags.`pdm.backend` = 'verl'", max_results=5000
        )
        for run in runs:
            tags = run.data.tags
            if run.info.status not in STATUSES:  # a FAILED or KILLED run's steps measure no cell
                continue
            if STEP_METRIC not in run.data.metrics or RESOURCES_TAG not in tags:
                continue
            key = (tags.get("pdm.model", ""), tags.get("pdm.precision", ""), tags[RESOURCES_TAG])
            history = client.get_metric_history(run.info.run_id, STEP_METRIC)
            index.by_cell.setdefault(key, {})[run.info.run_id] = [m.value for m in history]
        return index

    def seconds(self, model: str, precision: str, resources: str) -> Measured | None:
        """The median logged step of the cell's runs; None before any run reported a step."""
        runs = self.by_cell.get((model, precision, resources), {})
        steps = [s for values in runs.values() for s in values]
        if not steps:
            return None
        return Measured(statistics.median(steps), len(runs), len(steps))


def resources_tag(nodes: int, gpus_per_node: int, gpu_kind: str) -> str:
    """The ``pdm.verl.resources`` tag of a job on these resources (the job loop writes it)."""
    return f"{nodes}x{gpus_per_node} {gpu_kind}"
