"""What the plan says each trial costs, for the dry run's table and the live ETA alike.

A job-submitting backend states each job's workload (``registry.cost.Workload``); the cost model
prices it, with the median measured step of the runs of the same model x precision x resources
in MLflow once they reported (``tracking/step_times.py``) in place of its step estimate. A
backend that states no workload (the embedded one) has no plan price: its ETA is what its
trials measure as they run (``eta.py``).
"""

from __future__ import annotations

from typing import Any

from pdmask.orchestration.eta import Planned, cell_of
from pdmask.registry import Trial
from pdmask.registry.cost import Workload, trial_cost


def costs_of(
    specs: list[dict[str, Any]] | None, trials: list[Trial], tracking_uri: str | None
) -> tuple[dict[str, Workload], dict[str, float]]:
    """Each job's workload and, once runs of its cell reported, its measured step, by trial
    hash (a store that cannot be read leaves every step estimated)."""
    workloads = {
        spec["trial_hash"]: Workload(**spec["workload"])
        for spec in specs or []
        if "workload" in spec
    }
    if not workloads:
        return workloads, {}
    from pdmask.tracking.step_times import StepTimes, resources_tag

    try:
        times = StepTimes.read(tracking_uri)
    except Exception:  # an unreachable server: the plan is still a plan, estimated
        times = StepTimes()
    measured = {}
    by_hash = {t.trial_hash: t for t in trials}
    for spec in specs or []:
        res, trial = spec["resources"], by_hash[spec["trial_hash"]]
        tag = resources_tag(res["nodes"], res["gpus_per_node"], res["gpu_kind"])
        found = times.seconds(trial.model, trial.precision, tag)
        if found is not None:
            measured[trial.trial_hash] = found.seconds
    return workloads, measured


def planned(
    trials: list[Trial],
    steps_of,
    *,
    cluster: str,
    specs: list[dict[str, Any]] | None = None,
    tracking_uri: str | None = None,
) -> dict[str, Planned]:
    """How the ETA prices each trial before it runs, by hash: its steps (``steps_of``: the
    backend's ``planned_steps``), its cell, and, from its job's spec (``specs``: each
    ``JobSpec.to_json()``), its GPUs and the cost model's start-up and seconds per step, its
    validations and saves spread over its steps."""
    workloads, measured = costs_of(specs, trials, tracking_uri)
    gpus = {s["trial_hash"]: float(s["resources"]["gpus"]) for s in specs or []}
    out = {}
    for t in trials:
        step_s = startup_s = None
        load = workloads.get(t.trial_hash)
        cost = trial_cost(t.model, cluster, load, measured.get(t.trial_hash)) if load else None
        if cost is not None and load is not None:
            extra = cost.validation_seconds + cost.save_seconds
            step_s, startup_s = cost.step_seconds + extra / load.steps, cost.startup_seconds
        out[t.trial_hash] = Planned(
            cell=cell_of(t.model, t.precision),
            steps=steps_of(t),
            width=gpus.get(t.trial_hash, 1.0),
            step_s=step_s,
            startup_s=startup_s,
        )
    return out
