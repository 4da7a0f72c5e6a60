"""The sweep's ETA rule (``orchestration/eta.py``) against hand-computed schedules, and the plan's
prices it starts from (``orchestration/trial_prices.py``). Pure: no Ray, no store, fake times."""

from __future__ import annotations

import pytest

from pdmask.orchestration.eta import Capacity, Planned, Row, sweep_eta
from pdmask.orchestration.trial_prices import planned
from pdmask.registry import load_registry
from pdmask.registry.cost import Workload, trial_cost


def _done(cell: str, started: float, startup: float, steps: int, rate: float) -> Row:
    first = started + startup
    return Row(
        name=cell,
        state="done",
        started=started,
        first_step_at=first,
        first_step=0,
        step=steps,
        total=steps,
        finished_at=first + steps * rate,
        plan=Planned(cell=cell, steps=steps),
    )


def _running(cell: str, started: float, first_at: float, first: int, step: int, **plan) -> Row:
    return Row(
        name=cell,
        state="running",
        started=started,
        first_step_at=first_at,
        first_step=first,
        step=step,
        total=plan["steps"],
        plan=Planned(cell=cell, **plan),
    )


def test_per_cell_rates_and_the_median_start_up_leave_out_one_off_builds():
    """The first trial built its model (100 s of start-up) and is of a slow cell (4 s a step);
    three small trials are left. The old rule, every queued trial at the finished ones' mean
    duration ((140 + 20 + 50) / 3 = 70 s), said 210 s."""
    rows = [
        _done("big", started=0, startup=100, steps=10, rate=4.0),  # ends at 140
        _done("small", started=140, startup=10, steps=10, rate=1.0),  # ends at 160
        _done("big", started=160, startup=10, steps=10, rate=4.0),  # ends at 210
    ]
    queued = [Planned(cell="small", steps=10)] * 3
    # each: the median start-up (10 s) + 10 steps at the small cell's 1 s = 20 s, one at a time
    assert sweep_eta(rows, queued, now=210.0, capacity=Capacity(1)) == pytest.approx(60.0)
    # two slots: two side by side (20 s), then the third (20 s)
    assert sweep_eta(rows, queued, now=210.0, capacity=Capacity(2)) == pytest.approx(40.0)


def test_gpus_are_shared_as_admission_shares_them_and_an_unmeasured_cell_takes_the_plans_price():
    """16 GPUs. A running 8-GPU job: started at 0, step 1 at 50 s, step 11 at 150 s (10 s a
    step), 100 steps. Queued in launch order: a 16-GPU job of a cell nothing measured yet
    (the plan: 30 s a step, 60 s of start-up), then an 8-GPU job of the running one's cell."""
    running = _running("4b", 0.0, 50.0, 1, 11, steps=100, width=8)
    queued = [
        Planned(cell="30b", steps=10, width=16, step_s=30.0, startup_s=60.0),
        Planned(cell="4b", steps=100, width=8, step_s=99.0, startup_s=60.0),
    ]
    eta = sweep_eta([running], queued, now=150.0, capacity=Capacity(16))
    # the running job: 89 steps at 10 s, ends at 890. The 8-GPU job fits the 8 free GPUs at
    # once (admission lets a job that fits go ahead of one that does not): the measured
    # start-up (50 s, not the plan's 60) + 100 steps at its cell's measured 10 s (not the
    # plan's 99), ends at 1050. The 16-GPU job starts when both ended: 1050 + 50 + 10 x 30.
    assert eta == pytest.approx(1400.0)
    # before any job measured anything, the plan's prices alone: 16 GPUs, one after the other
    assert sweep_eta([], queued, now=0.0, capacity=Capacity(16)) == pytest.approx(
        (60 + 10 * 30) + (60 + 100 * 99)
    )


def test_a_bound_on_trials_at_once_holds_them_back_whatever_the_capacity():
    queued = [Planned(cell="c", steps=10, width=0, step_s=2.0, startup_s=5.0)] * 3
    assert sweep_eta([], queued, 0.0, Capacity(units=8, trials=1)) == pytest.approx(75.0)
    assert sweep_eta([], queued, 0.0, Capacity(units=8)) == pytest.approx(25.0)


def test_a_running_trial_without_a_rate_of_its_own_takes_its_cells_and_its_start_up_left():
    """Started 30 s ago, no step yet; its cell measured 2 s a step, start-ups 40 s: 10 s of
    start-up and 50 steps left."""
    rows = [
        _done("c", started=0, startup=40, steps=50, rate=2.0),
        Row(name="new", state="running", started=70.0, total=50, plan=Planned("c", 50)),
    ]
    assert sweep_eta(rows, [], now=100.0, capacity=Capacity(2)) == pytest.approx(110.0)


def test_nothing_known_is_no_eta_and_nothing_left_is_zero():
    unknown = Row(name="r", state="running", started=0.0, total=10, plan=Planned("c", 10))
    assert sweep_eta([unknown], [], now=5.0, capacity=Capacity(1)) is None
    assert sweep_eta([], [Planned("c", 10)], now=5.0, capacity=Capacity(1)) is None
    assert sweep_eta([], [], now=5.0, capacity=Capacity(1)) == 0.0


def test_a_jobs_plan_price_is_the_cost_models_with_validations_and_saves_over_its_steps(project):
    trial = load_registry(project).expand("main-figure", backend="verl")[0]
    load = Workload(
        prompts=64, group_size=8, steps=20, val_prompts=60, val_samples=16, test_freq=5,
        save_freq=10, checkpoints_kept=1,
    )  # fmt: skip
    spec = {
        "trial_hash": trial.trial_hash,
        "workload": load.model_dump(),
        "resources": {"nodes": 1, "gpus_per_node": 8, "gpus": 8, "gpu_kind": "H20"},
    }
    absent = f"sqlite:///{project / 'no-store.db'}"  # no runs measured: the estimate alone
    price = planned([trial], lambda t: 20, cluster="h20x32", specs=[spec], tracking_uri=absent)[
        trial.trial_hash
    ]
    cost = trial_cost(trial.model, "h20x32", load)
    assert cost is not None and cost.basis == "estimate"
    per_step = cost.step_seconds + (cost.validation_seconds + cost.save_seconds) / 20
    assert price.step_s == pytest.approx(per_step) and price.startup_s == cost.startup_seconds
    assert (price.width, price.steps, price.cell) == (8.0, 20, f"{trial.model} {trial.precision}")
    # a backend without workloads (the embedded one): steps and cell, no price
    (sim,) = planned([trial], lambda t: 50, cluster="h20x32").values()
    assert (sim.step_s, sim.startup_s, sim.steps, sim.width) == (None, None, 50, 1.0)
