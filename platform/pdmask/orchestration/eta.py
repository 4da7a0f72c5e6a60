"""The sweep's ETA: one rule for both launch kinds (Tune trials here, Ray jobs on a cluster), over
the trials' ``Row``s (what a launcher saw of each: its state, start, steps and their times) and
the plan's price of each (``Planned``; ``trial_prices.py``).

A trial takes its start-up (from its start to its first reported step) plus its steps at its
seconds per step. What each of these is, best first:

- **seconds per step** of a running trial: its own rate so far. Of any other trial: the median
  rate of this invocation's trials of its cell (model x precision: trials of one cell compute
  alike), running or done (a done trial's rate spans its first step to its end, evaluations and
  its last save included); else the plan's (``Planned.step_s``: the cell's measured step time in
  MLflow, ``tracking/step_times.py``, else the cost model's estimate, ``registry/cost.py``,
  validations and saves spread over the steps); else the median rate of every cell measured so
  far;
- **start-up**: the median of this invocation's measured start-ups, else the plan's.

Medians, not means, and a rate per cell: the first trial of each model pays a one-off (the
embedded backend builds its base model, which the model's later trials share), and a sweep's
trials are launched one model after the other in turn, canaries first; a mean over every
finished trial carried the first trials' builds and the large models' rates into the small
ones queued after them (the embedded path's ETA ran 15-30 % high, issue 47).

The queued trials are then placed as the launchers admit them: in launch order, each that fits
the free capacity now (``Capacity``: Tune's slots, one per trial; a cluster's GPUs, each job its
own; a smaller job goes ahead of a larger one that does not fit yet), else when the next trial
ends; the ETA is when the last one ends. Nothing to place and nothing running: 0. A trial whose
time cannot be told yet (no rate and no plan): no ETA.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field
from statistics import median


@dataclass(frozen=True)
class Planned:
    """A trial as the plan prices it before it runs."""

    cell: str  # model x precision (``cell_of``)
    steps: int | None  # RL steps it trains (None: unknown, as the others of the sweep)
    width: float = 1.0  # what it occupies of the capacity: a slot, or its job's GPUs
    step_s: float | None = None  # the plan's seconds per step (None: none)
    startup_s: float | None = None  # the plan's seconds to its first step (None: none)


# A trial's states as the launchers report them, by what the header counts them as
RUNNING = ("running", "waiting", "retrying")
FAILED = ("failed", "config error", "recipe error")
DONE = ("done", "skipped", "elsewhere")


@dataclass
class Row:
    """One trial as a launcher saw it (the progress view shows it; times on the launcher's
    clock): its state, start, first reported step and when, latest step, planned total."""

    name: str
    trial_hash: str | None = None
    state: str = "pending"
    step: int = -1
    total: int = 0
    eval: float | None = None
    attempt: int = 1
    started: float = field(default_factory=time.monotonic)
    first_step_at: float | None = None
    first_step: int = 0
    finished_at: float | None = None
    outcome: str | None = None
    plan: Planned | None = None  # how the plan prices it (None: unknown)

    def seconds_per_step(self, now: float) -> float | None:
        if self.first_step_at is None or self.step <= self.first_step:
            return None
        return (now - self.first_step_at) / (self.step - self.first_step)

    def remaining(self, now: float) -> float | None:
        """Seconds this running trial still needs, at its rate so far (None until known)."""
        rate = self.seconds_per_step(now)
        if self.state != "running" or rate is None or not self.total:
            return None
        return rate * max(self.total - self.step, 0)


@dataclass(frozen=True)
class Capacity:
    """What trials share: ``units`` (Tune's slots, or the cluster's GPUs) and at most
    ``trials`` at once (a sweep's ``max_concurrent``; None: no bound)."""

    units: float
    trials: int | None = None


def cell_of(model: str, precision: str) -> str:
    return f"{model} {precision}"


def _rate(row: Row, now: float) -> float | None:
    """Seconds per step of a running or done row since its first step (None: not known)."""
    if row.state in RUNNING:
        return row.seconds_per_step(now)
    if row.state == "done" and row.finished_at and row.first_step_at is not None:
        steps = row.total - row.first_step
        return (row.finished_at - row.first_step_at) / steps if steps > 0 else None
    return None


@dataclass(frozen=True)
class Measured:
    """What this invocation's trials measured: per cell the median rate, every cell's median,
    and the median start-up."""

    rates: dict[str, float]
    any_rate: float | None
    startup: float | None

    @classmethod
    def of(cls, rows: list[Row], now: float) -> Measured:
        by_cell: dict[str, list[float]] = {}
        for row in rows:
            rate = _rate(row, now)
            if rate is not None:
                by_cell.setdefault(row.plan.cell if row.plan else "", []).append(rate)
        startups = [  # not a job attached to when it had reported already (a later start)
            r.first_step_at - r.started
            for r in rows
            if r.first_step_at is not None
            and r.first_step_at >= r.started
            and (r.state in RUNNING or r.state in DONE)
        ]
        every = [rate for rates in by_cell.values() for rate in rates]
        return cls(
            rates={cell: median(rates) for cell, rates in by_cell.items()},
            any_rate=median(every) if every else None,
            startup=median(startups) if startups else None,
        )

    def step_s(self, plan: Planned | None) -> float | None:
        if plan is not None and plan.cell in self.rates:
            return self.rates[plan.cell]
        if plan is not None and plan.step_s is not None:
            return plan.step_s
        return self.any_rate

    def startup_s(self, plan: Planned | None) -> float | None:
        if self.startup is not None:
            return self.startup
        return plan.startup_s if plan is not None else None


def _typical_steps(rows: list[Row], queued: list[Planned]) -> int | None:
    """The steps of a trial whose plan does not say (a search's point): the others' median."""
    known = [r.total for r in rows if r.total] + [p.steps for p in queued if p.steps]
    return round(median(known)) if known else None


def remaining(row: Row, measured: Measured, now: float, steps: int | None) -> float | None:
    """Seconds a running trial still needs (None: cannot be told yet)."""
    total = row.total or (row.plan.steps if row.plan and row.plan.steps else steps)
    if not total:
        return None
    own = row.remaining(now)  # at its own rate
    if own is not None:
        return own
    step_s = measured.step_s(row.plan)
    if step_s is None:
        return None
    if row.first_step_at is not None:
        return step_s * max(total - row.step, 0)
    startup = measured.startup_s(row.plan)
    if startup is None:
        return None
    left = total - max(row.step, 0)  # a retried trial resumes at its checkpoint's step
    return max(startup + step_s * left - (now - row.started), 0.0)


def sweep_eta(
    rows: list[Row], queued: list[Planned], now: float, capacity: Capacity
) -> float | None:
    """Seconds until the last trial ends (the module docstring's rule); ``queued``: the trials
    not started yet, in launch order."""
    measured = Measured.of(rows, now)
    steps = _typical_steps(rows, queued)
    ends: list[tuple[float, float]] = []  # (when it ends, what it frees)
    for row in rows:
        if row.state not in RUNNING:
            continue
        left = remaining(row, measured, now, steps)
        if left is None:
            return None
        ends.append((left, row.plan.width if row.plan else 1.0))
    free = capacity.units - sum(width for _, width in ends)
    heapq.heapify(ends)
    last, clock, waiting = max((end for end, _ in ends), default=0.0), 0.0, list(queued)
    while waiting:
        for plan in list(waiting):  # in launch order, each that fits now (admission backfills)
            bound = capacity.trials is not None and len(ends) >= capacity.trials
            if plan.width > free or bound:
                continue
            step_s, startup = measured.step_s(plan), measured.startup_s(plan)
            trial_steps = plan.steps or steps
            if step_s is None or startup is None or trial_steps is None:
                return None
            end = clock + startup + trial_steps * step_s
            heapq.heappush(ends, (end, plan.width))
            free, last = free - plan.width, max(last, end)
            waiting.remove(plan)
        if waiting and not ends:  # wider than the whole capacity (refused before launch)
            free = max(free, waiting[0].width)
        elif waiting:  # the next trial to end frees its share
            end, width = heapq.heappop(ends)
            clock, free = max(clock, end), free + width
    return last
