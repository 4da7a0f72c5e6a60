"""The plan of a sweep: one row per trial with resources, cost, checkpoint disk and status.

A trial's cost comes from ``cost.py``: the FLOP model's step estimate for a backend that states
its workload (the VeRL job builder does, with the engine that trains it, whose checkpoint format
sizes its saves), the median measured step of finished and running runs
of the same model x precision x resources once they reported (``measured``), or, for a model
without shapes or a backend without a workload, the catalog's hand-set step time. Each row says
which (``cost_basis``).
"""

from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel, Field

from pdmask.registry.backends import BACKENDS, Occupies
from pdmask.registry.catalog import CLUSTERS, MODELS
from pdmask.registry.cost import Workload, trial_cost
from pdmask.registry.trial import Trial

DEFAULT_VERL_STEPS = 300  # planning default when a sweep sets no `steps` (*estimate*)


class PlanRow(BaseModel):
    trial_hash: str
    method: str
    label: str = Field(
        description="The method as the plan shows it, with what its cell's embedded knobs make "
        "of it (e.g. `dppo-topk-kl (lr = 0 mismatch control)`)."
    )
    model: str
    precision: str
    delta: float | None
    seed: int
    backend: str
    resources: str = Field(description="What one trial occupies while it runs.")
    gpus: int = Field(
        description="GPUs per trial on the cluster profile (0 on the embedded backend)."
    )
    est_gpu_hours: float = Field(
        description="Estimated GPU-hours on the cluster profile: steps, validations, start-up "
        "and saves (*estimate*; `cost_basis` says where the step time is from)."
    )
    step_seconds: float | None = Field(
        None, description="Seconds per RL step the GPU-hours assume (None: nothing to plan)."
    )
    cost_basis: str = Field(
        "catalog",
        description="`estimate`: the FLOP model (registry/cost.py); `measured`: the median "
        "logged step of runs of the same model, precision and resources; `catalog`: the "
        "model's hand-set step time.",
    )
    save_gb: float = Field(
        0.0,
        description="One save of the actor, in its training engine's checkpoint format "
        "(registry/cost.py: FSDP's or Megatron's).",
    )
    disk_running_gb: float = Field(
        0.0, description="Checkpoint disk while the trial runs (its kept saves + the next)."
    )
    disk_finished_gb: float = Field(
        0.0, description="What it keeps after it finished and `pdm clean` ran."
    )
    disk_uncleaned_gb: float = Field(
        0.0, description="What it keeps when nothing cleans (verl's kept saves)."
    )
    status: str = Field(description="done / failed / running / todo (from the tracking store).")
    run_name: str


def plan_rows(
    trials: list[Trial],
    cluster: str = "h20x32",
    status_of: Callable[[Trial], str] | None = None,
    workloads: dict[str, Workload] | None = None,
    measured: dict[str, float] | None = None,
) -> list[PlanRow]:
    """``workloads`` and ``measured``: by trial hash, the trial's workload (from its backend)
    and the measured seconds per step of its cell."""
    profile = CLUSTERS[cluster]
    workloads, measured = workloads or {}, measured or {}
    rows = []
    for t in trials:
        # None: the model does not fit this cluster's kind (a VeRL trial's job builder refuses
        # it; an embedded trial has nothing to estimate there).
        need = MODELS[t.model].gpu_needs.get(profile.gpu_kind)
        steps = t.steps or DEFAULT_VERL_STEPS
        gpus = need.gpus if need else 0
        load = workloads.get(t.trial_hash)
        cost = (
            trial_cost(t.model, cluster, load, measured.get(t.trial_hash))
            if load is not None
            else None
        )
        if cost is not None:
            step, basis, gpu_hours = cost.step_seconds, cost.basis, cost.gpu_hours
        elif need is not None:
            step, basis = need.seconds_per_step, "catalog"
            gpu_hours = gpus * step * steps / 3600
        else:
            step, basis, gpu_hours = None, "catalog", 0.0
        if BACKENDS[t.backend].occupies is Occupies.ONE_CPU:
            resources = Occupies.ONE_CPU.value
        else:
            resources = f"{gpus} {profile.gpu_kind}" if need else f"none fit on {cluster}"
        rows.append(
            PlanRow(
                trial_hash=t.trial_hash,
                method=t.method,
                label=t.method_label(),
                model=t.model,
                precision=t.precision,
                delta=t.delta,
                seed=t.seed,
                backend=t.backend,
                resources=resources,
                gpus=gpus,
                est_gpu_hours=round(gpu_hours, 1),
                step_seconds=step,
                cost_basis=basis,
                save_gb=cost.save_gb if cost else 0.0,
                disk_running_gb=cost.running_disk_gb if cost else 0.0,
                disk_finished_gb=cost.finished_disk_gb if cost else 0.0,
                disk_uncleaned_gb=cost.uncleaned_disk_gb if cost else 0.0,
                status=status_of(t) if status_of else "todo",
                run_name=t.run_name(),
            )
        )
    return rows


def _fitting(rows: list[PlanRow], cluster: str) -> list[PlanRow]:
    """The trials that fit on the cluster at once (smallest first, whole GPUs)."""
    total = CLUSTERS[cluster].gpus
    fits, used = [], 0
    for row in sorted(rows, key=lambda r: r.gpus):
        if used + row.gpus > total:
            break
        used += row.gpus
        fits.append(row)
    return fits


def concurrent_trials(rows: list[PlanRow], cluster: str) -> int:
    """How many of these trials fit on the cluster at once (whole GPUs)."""
    return len(_fitting(rows, cluster))


class DiskNeed(BaseModel):
    """The checkpoint root's need for a whole sweep, GB (``cost.py`` has the formulas)."""

    peak_gb: float = Field(
        description="Every trial finished and cleaned, plus the largest set of trials that can "
        "run at once holding their running saves: what the share must hold."
    )
    finished_gb: float = Field(description="Every trial finished, `pdm clean` run.")
    uncleaned_gb: float = Field(description="Every trial finished, nothing cleaned.")


def disk_need(rows: list[PlanRow], cluster: str) -> DiskNeed:
    total = CLUSTERS[cluster].gpus
    finished = sum(r.disk_finished_gb for r in rows)
    # the running set that holds the most extra disk and fits the GPUs (largest extra first)
    extra, used = 0.0, 0
    for row in sorted(rows, key=lambda r: r.disk_running_gb - r.disk_finished_gb, reverse=True):
        if row.gpus and used + row.gpus <= total:
            used += row.gpus
            extra += row.disk_running_gb - row.disk_finished_gb
    return DiskNeed(
        peak_gb=round(finished + extra, 1),
        finished_gb=round(finished, 1),
        uncleaned_gb=round(sum(r.disk_uncleaned_gb for r in rows), 1),
    )


# A printed plan lists at most this many trials one by one; a larger one is summarised per
# setting (a terminal table of 10^5 rows took minutes to lay out). `--json` lists every trial.
TABLE_ROWS = 200


def grouped_rows(rows: list[PlanRow]) -> list[list]:
    """One line per (method, model, precision, status): its deltas, trials, seeds, GPU-hours."""
    groups: dict[tuple, list[PlanRow]] = {}
    for r in rows:
        groups.setdefault((r.label, r.model, r.precision, r.status), []).append(r)
    out = []
    for (method, model, precision, status), members in groups.items():
        deltas = sorted({m.delta for m in members if m.delta is not None})
        shown = (
            "-"
            if not deltas
            else f"{deltas[0]:g}"
            if len(deltas) == 1
            else f"{deltas[0]:g}..{deltas[-1]:g} ({len(deltas)})"
        )
        out.append(
            [
                method,
                model.removeprefix("qwen3-").removesuffix("-base"),
                precision,
                shown,
                len(members),
                len({m.seed for m in members}),
                f"{sum(m.est_gpu_hours for m in members):,.0f}",
                status,
            ]
        )
    return out
