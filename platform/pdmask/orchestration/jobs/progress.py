"""The job loop's progress line: done / running / failed / queued, elapsed and the ETA, as it polls.

The same header and the same ETA rule as the Tune path's (``progress_view.header``,
``eta.sweep_eta``): here each trial's row follows its job (submitted: running; retried:
retrying; ended: done or failed) and, while it runs, its run's RL steps in MLflow, read from the
history of the metric every backend logs at each step (``canary.TRAINING_METRIC``: its steps
and the times the job logged them) since this loop submitted it (``submitted``). A job attached
to, submitted before, counts the steps since its step count last went back (a retried job
resumes from its checkpoint: those are its latest attempt's). The line is printed when the
counts change and at least every ``HEARTBEAT_S`` while jobs run.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

from pdmask.orchestration.canary import TRAINING_METRIC
from pdmask.orchestration.eta import Capacity, Planned, Row, sweep_eta
from pdmask.orchestration.progress_view import HEARTBEAT_S, counts, header
from pdmask.tracking.runs import with_retry

STATES = {"active": "running", "finished": "done", "failed": "failed"}


class JobsProgress:
    """Rows of the job loop's trials, and its progress line. ``plans``: how the plan prices each
    trial (``trial_prices.planned``); ``capacity``: the cluster's GPUs and the sweep's bound on
    jobs at once; ``clock``: wall-clock seconds (MLflow's timestamps are). ``jobs``: the job
    loop's ``TrialJob``s (not imported: the loop imports this module)."""

    def __init__(
        self,
        sweep: str,
        client,
        plans: dict[str, Planned],
        capacity: Capacity,
        print_line: Callable[[str], None],
        clock: Callable[[], float] = time.time,
        started: float | None = None,
    ):
        self.sweep, self.client, self.plans, self.capacity = sweep, client, plans, capacity
        self.print_line, self.clock = print_line, clock
        self.started = clock() if started is None else started  # on ``clock``
        self.rows: dict[str, Row] = {}
        self._submitted: dict[str, float] = {}  # when this loop last submitted each trial's job
        self._last: tuple | None = None  # the counts last printed
        self._due = 0.0  # when the next line is due whatever the counts

    def submitted(self, trial_hash: str) -> None:
        """The job loop submitted the trial's job (again): its steps from now on are this
        attempt's. A job attached to (submitted before this invocation) has no such time: its
        steps are those since its step count last went back, its start-up not measured."""
        self._submitted[trial_hash] = self.clock()

    def _follow(self, job, now: float) -> None:
        """The job's row: created when it is first submitted, then following its state."""
        key = job.trial.trial_hash
        row = self.rows.get(key)
        if row is None:
            if job.state == "queued":
                return  # not submitted yet
            plan = self.plans.get(key)
            total = (plan.steps or 0) if plan else 0
            started = self._submitted.get(key, now)
            row = self.rows[key] = Row(name=job.trial.run_name(), trial_hash=key, started=started)
            row.plan, row.total = plan, total
        state = "retrying" if job.state == "queued" else STATES.get(job.state, row.state)
        if state != row.state and "retrying" in (state, row.state):
            # failed (its next attempt waits from now), or resubmitted: the next attempt's
            # start-up and steps are its own
            again = now if state == "retrying" else self._submitted.get(key, now)
            row.started, row.first_step_at = again, None
        if state in ("done", "failed") and row.finished_at is None:
            row.finished_at = now
        row.state = state

    def _steps(self, row: Row, run_id: str) -> None:
        """The running row's steps of this attempt, from its run's history in MLflow."""
        history = with_retry(lambda: self.client.get_metric_history(run_id, TRAINING_METRIC))
        since = self._submitted.get(row.trial_hash or "")
        points = sorted(
            (m.timestamp / 1000.0, m.step)
            for m in history
            if since is None or m.timestamp / 1000.0 >= since
        )
        start = 0
        for i in range(1, len(points)):
            if points[i][1] <= points[i - 1][1]:  # the step count went back: a resumed attempt
                start = i
        points = points[start:]
        if not points:
            return
        row.first_step_at, row.first_step = points[0]
        row.step = points[-1][1]

    def line(self, jobs: list) -> str:
        """The progress line now (each running job's steps read from MLflow)."""
        now = self.clock()
        for job in jobs:
            self._follow(job, now)
            row = self.rows.get(job.trial.trial_hash)
            if row is not None and row.state == "running" and job.run_id:
                # the store did not answer: the line goes on without this run's steps
                with contextlib.suppress(Exception):
                    self._steps(row, job.run_id)
        rows = list(self.rows.values())
        total = sum(j.state != "stopped" for j in jobs)
        queued = [
            self.plans.get(j.trial.trial_hash) or Planned(cell="", steps=None)
            for j in jobs
            if j.state == "queued" and j.trial.trial_hash not in self.rows
        ]
        eta = sweep_eta(rows, queued, now, self.capacity)
        return header(self.sweep, rows, total, now - self.started, eta)

    def tick(self, jobs: list) -> None:
        """Print the line when the counts changed or it is due."""
        now = self.clock()
        for job in jobs:
            self._follow(job, now)
        rows = list(self.rows.values())
        state = counts(rows, sum(j.state != "stopped" for j in jobs))
        if state == self._last and now < self._due:
            return
        self._last, self._due = state, now + HEARTBEAT_S
        self.print_line(f"[{time.strftime('%H:%M:%S')}] {self.line(jobs)}")
