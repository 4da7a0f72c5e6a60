"""A FINISHED run is a complete run (``tracking/completeness.py``), as a Tune trial closes it:
``TrialRun.finish`` on a real sqlite store refuses a run that stops before its planned last step
or lacks a planned validation, naming the gap, and the failure is of its own kind (retried)."""

from __future__ import annotations

import pytest

from pdmask.backends.interface import load_backend
from pdmask.errors import IncompleteRun
from pdmask.registry import load_registry
from pdmask.tracking import TrialRun
from pdmask.tracking.completeness import Plan, gap, require_complete
from pdmask.tracking.runs import FailureKind, attempt_kind, exception_kind

from .conftest import ROOT

pytestmark = pytest.mark.processes


@pytest.fixture(scope="module")
def store(main_figure_store):
    return main_figure_store


def _open(store, index: int) -> tuple[TrialRun, Plan]:
    client, exp = store
    reg = load_registry(ROOT)
    trial = reg.expand("main-figure")[index]
    backend = load_backend(trial.backend)
    plan = Plan.of(
        backend.planned_steps(trial), backend.eval_metrics(reg.sweeps["main-figure"].cluster)
    )
    return TrialRun.start_or_resume(client, exp, trial, {}, log_params=False), plan


def _train(run: TrialRun, plan: Plan, until: int, validations=(0,)) -> None:
    """What the sim trainer reports: the base evaluation at 0, then a step's metrics each step
    (the evaluation metric at ``validations`` only)."""
    (metric,) = plan.eval_metrics
    for step in range(until + 1):
        values = {metric: 0.5} if step in validations else {}
        if step:
            values["critic/score/mean"] = 0.1 * step
        run.log(step, values)


def _finish(run: TrialRun, summary, plan: Plan) -> None:
    """How a Tune trial closes its run (``tune/trainable._train``)."""
    require_complete(run.client, run.run_id, plan)
    run.finish(summary)


def test_the_plan_is_the_backend_s_steps_with_a_validation_before_and_at_the_end(store):
    run, plan = _open(store, 0)
    assert plan.last_step and plan.last_step > 1
    assert plan.validations == (0, plan.last_step) and len(plan.eval_metrics) == 1


def test_a_run_that_stops_early_is_not_finished_and_says_where(store):
    run, plan = _open(store, 1)
    _train(run, plan, plan.last_step - 1)
    with pytest.raises(IncompleteRun) as err:
        _finish(run, {"x": 1.0}, plan)
    line = f"{type(err.value).__name__}: {err.value}"
    assert (
        f"stop at step {plan.last_step - 1}, before the planned last step {plan.last_step}" in line
    )
    assert exception_kind(line) is FailureKind.INCOMPLETE
    assert not FailureKind.INCOMPLETE.deterministic  # retried: the retry resumes the run
    assert run.client.get_run(run.run_id).info.status == "RUNNING"


def test_a_run_without_its_last_validation_is_not_finished(store):
    run, plan = _open(store, 2)
    _train(run, plan, plan.last_step)  # every step, but no evaluation at the last one
    (metric,) = plan.eval_metrics
    assert gap(run.client, run.run_id, plan) == (
        f"its planned validations are missing: {metric} at step {plan.last_step}"
    )
    with pytest.raises(IncompleteRun):
        _finish(run, None, plan)


def test_a_complete_run_finishes(store):
    run, plan = _open(store, 3)
    _train(run, plan, plan.last_step, validations=plan.validations)
    _finish(run, {"x": 1.0}, plan)
    assert run.client.get_run(run.run_id).info.status == "FINISHED"


def test_without_a_plan_a_run_needs_one_step(store):
    run, _ = _open(store, 4)
    with pytest.raises(IncompleteRun, match="holds no metrics"):
        _finish(run, None, Plan(None))
    run.log(0, {"critic/score/mean": 0.1})
    _finish(run, None, Plan(None))
    assert run.client.get_run(run.run_id).info.status == "FINISHED"


def test_an_incomplete_end_twice_alike_is_not_retried_again():
    line = "IncompleteRun: the trial's training ended, but its metrics stop at step 3, before 6"
    first = attempt_kind(FailureKind.INCOMPLETE, line, [])
    earlier = [{"kind": first.value, "reason": line}]
    assert first is FailureKind.INCOMPLETE
    assert attempt_kind(FailureKind.INCOMPLETE, line, earlier) is FailureKind.REPEATED
