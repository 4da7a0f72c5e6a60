"""The plan of a sweep: one row per trial with resources, GPU-hour estimates and status."""

from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel, Field

from pdmask.registry.backends import BACKENDS, Occupies
from pdmask.registry.catalog import CLUSTERS, MODELS
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
        description="Estimated GPU-hours on the cluster profile (*estimate*)."
    )
    status: str = Field(description="done / failed / running / todo (from the tracking store).")
    run_name: str


def plan_rows(
    trials: list[Trial], cluster: str = "h20x32", status_of: Callable[[Trial], str] | None = None
) -> list[PlanRow]:
    profile = CLUSTERS[cluster]
    rows = []
    for t in trials:
        # None: the model does not fit this cluster's kind (a VeRL trial's job builder refuses
        # it; an embedded trial has nothing to estimate there).
        need = MODELS[t.model].gpu_needs.get(profile.gpu_kind)
        steps = t.steps or DEFAULT_VERL_STEPS
        gpus = need.gpus if need else 0
        gpu_hours = gpus * need.seconds_per_step * steps / 3600 if need else 0.0
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
                status=status_of(t) if status_of else "todo",
                run_name=t.run_name(),
            )
        )
    return rows


def concurrent_trials(rows: list[PlanRow], cluster: str) -> int:
    """How many of these trials fit on the cluster at once (largest first, whole GPUs)."""
    total = CLUSTERS[cluster].gpus
    fits, used = 0, 0
    for gpus in sorted((r.gpus for r in rows), reverse=False):
        if used + gpus > total:
            break
        used += gpus
        fits += 1
    return fits


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
