"""A FINISHED run is a complete run: the one rule both launch kinds apply before a run may end
FINISHED (a Tune trial in ``TrialRun.finish``, a Ray job that SUCCEEDED in
``orchestration/jobs/job_loop``).

A backend can end without every step in its run: verl's MLflow adapter drops a step's metrics
after three failed writes, trains on and closes the run FINISHED; a trainer can return early. A
run that passed as finished would be skipped forever with curves that end early, so a run is
complete only when its metrics reach the planned last step and every evaluation metric holds the
planned validations: both backends evaluate the base model at step 0 and the trained one at the
last step (``backends.interface.Reporter``). ``gap`` names what is missing; the caller fails the
attempt with it (``FailureKind.INCOMPLETE``: retried, the retry resumes from its checkpoint).
"""

from __future__ import annotations

from dataclasses import dataclass

from pdmask.errors import IncompleteRun
from pdmask.tracking.runs import last_logged_step, with_retry


@dataclass(frozen=True)
class Plan:
    """What a complete run of a trial holds."""

    last_step: int | None  # the planned last step; None: the backend cannot say (any step then)
    eval_metrics: tuple[str, ...] = ()  # each holds a value at every step of ``validations``
    validations: tuple[int, ...] = ()

    @classmethod
    def of(cls, planned_steps: int | None, eval_metrics: list[str]) -> Plan:
        """The plan of a trial its backend plans ``planned_steps`` for (``Backend.
        planned_steps``), validated before training and at the last step on ``eval_metrics``
        (``Backend.eval_metrics``)."""
        if planned_steps is None:
            return cls(None)
        return cls(planned_steps, tuple(eval_metrics), (0, planned_steps))


def gap(client, run_id: str, plan: Plan) -> str | None:
    """What run ``run_id`` lacks to be complete under ``plan``, in words; None when complete."""
    run = with_retry(lambda: client.get_run(run_id))
    reached = last_logged_step(client, run)
    if reached < 0:
        return "its run holds no metrics at all"
    if plan.last_step is not None and reached < plan.last_step:
        return f"its metrics stop at step {reached}, before the planned last step {plan.last_step}"
    missing = []
    for metric in plan.eval_metrics:
        history = with_retry(lambda m=metric: client.get_metric_history(run_id, m))
        held = {m.step for m in history}
        lacking = [s for s in plan.validations if s not in held]
        if lacking:
            missing.append(
                f"{metric} at step{'s' if len(lacking) > 1 else ''} " + ", ".join(map(str, lacking))
            )
    if missing:
        return "its planned validations are missing: " + "; ".join(missing)
    return None


def require_complete(client, run_id: str, plan: Plan) -> None:
    """``IncompleteRun`` naming the gap unless run ``run_id`` is complete under ``plan``: what a
    trial's training checks before it closes its run FINISHED (``TrialRun.finish``)."""
    missing = gap(client, run_id, plan)
    if missing:
        raise IncompleteRun(f"the trial's training ended, but {missing}")
