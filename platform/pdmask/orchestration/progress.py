"""Live progress of a sweep: a table (trial, state, step, latest eval, ETA) and a final summary."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ray.tune import Callback
from rich.console import Console
from rich.live import Live

from pdmask.console import table


@dataclass
class Row:
    name: str
    state: str = "pending"
    step: int = -1
    total: int = 0
    eval: float | None = None
    attempt: int = 1
    started: float = field(default_factory=time.time)
    first_step_at: float | None = None
    first_step: int = 0
    outcome: str | None = None

    def eta(self) -> str:
        if (
            self.state != "running"
            or self.first_step_at is None
            or self.step <= self.first_step
            or not self.total
        ):
            return ""
        rate = (time.time() - self.first_step_at) / (self.step - self.first_step)
        return f"{rate * max(self.total - self.step, 0):.0f}s"


class SweepProgress(Callback):
    """A Tune callback: keeps one row per trial; live table on a terminal, lines otherwise."""

    def __init__(
        self,
        names: dict[str, str],
        console: Console | None = None,
        failure_of: Callable[[dict], str | None] | None = None,
        on_store_lost: Callable[[], None] | None = None,
    ):
        self.rows: dict[str, Row] = {}
        self.names = names  # Tune trial id is unknown upfront: map via the reported trial hash
        self.console = console or Console(highlight=False)
        # why a trial's attempt failed (from its Tune config), where its run says
        self.failure_of = failure_of
        # A trial's store cannot be written (``store-unwritable``): its line, and what stops the
        # sweep (no other trial can record anything either).
        self.store_lost: str | None = None
        self.on_store_lost = on_store_lost
        self.live: Live | None = None
        if sys.stdout.isatty():
            self.live = Live(
                self.render(), console=self.console, refresh_per_second=2, transient=False
            )
            self.live.start()

    def __getstate__(self):
        # Tune pickles its run config (callbacks included) to disk; a console and a live display
        # hold locks and a terminal, so they stay out of the pickle.
        state = dict(self.__dict__)
        state["console"] = None
        state["live"] = None
        state["failure_of"] = None  # holds the driver's MLflow client
        state["on_store_lost"] = None  # holds the driver's stop event
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.console = Console(highlight=False)

    def _row(self, trial, result=None) -> Row:
        key = trial.trial_id
        if key not in self.rows:
            self.rows[key] = Row(name=trial.trial_id)
        row = self.rows[key]
        if result and "pdm_trial_hash" in result:
            row.name = self.names.get(result["pdm_trial_hash"], result["pdm_trial_hash"])
        return row

    def _event(self, row: Row, text: str) -> None:
        if self.live is not None:
            self.live.update(self.render())
        else:
            self.console.print(f"[{time.strftime('%H:%M:%S')}] {row.name}: {text}")

    def on_trial_start(self, iteration, trials, trial, **info):
        row = self._row(trial)
        row.state = "running"
        if self.live is not None:
            self.live.update(self.render())

    def on_trial_result(self, iteration, trials, trial, result, **info):
        row = self._row(trial, result)
        row.total = int(result.get("pdm_total_steps") or 0)
        row.attempt = int(result.get("pdm_attempt", row.attempt))
        if "pdm_step" in result:
            if row.first_step_at is None:
                row.first_step_at, row.first_step = time.time(), int(result["pdm_step"])
            row.step = int(result["pdm_step"])
        if "pdm_waiting_for" in result and row.state != "waiting":
            row.state = "waiting"
            self._event(
                row,
                f"waiting: sweep {result['pdm_waiting_for']} is training the same trial (they "
                "share its checkpoint folder); this sweep trains its own run of it after",
            )
        if "pdm_eval" in result:
            row.eval = float(result["pdm_eval"])
        outcome = result.get("pdm_outcome")
        if outcome == "store-unwritable" and self.store_lost is None:
            self.store_lost = result.get("pdm_error") or "the tracking store cannot be written"
            if self.on_store_lost is not None:
                self.on_store_lost()
        if outcome:
            row.outcome = outcome
            row.state = {
                "finished": "done",
                "already-done": "skipped",
                "claimed-elsewhere": "elsewhere",
                "config-error": "config error",
            }.get(outcome, "failed")
            detail = f" (eval {row.eval:.3f})" if row.eval is not None else ""
            if result.get("pdm_error"):  # a configuration or recipe error: show it, not retried
                detail += f": {result['pdm_error']}"
                if self.live is not None:  # the live table has no room for it
                    self.console.print(f"{row.name}: {outcome}{detail}")
            self._event(row, f"{outcome}{detail}")
        elif self.live is not None:
            self.live.update(self.render())
        elif row.step == row.first_step:
            self._event(row, f"started (attempt {row.attempt})")

    def on_trial_recover(self, iteration, trials, trial, **info):
        row = self._row(trial)
        row.state, row.first_step_at = "retrying", None
        self._failure(row, trial, "retrying from its checkpoint")

    def on_trial_error(self, iteration, trials, trial, **info):
        row = self._row(trial)
        row.state = "failed"
        self._failure(row, trial, "retries exhausted")

    def _failure(self, row: Row, trial, then: str) -> None:
        reason = self.failure_of(trial.config) if self.failure_of else None
        text = f"{reason}; {then}" if reason else f"crashed; {then}"
        if reason and self.live is not None:  # the live table has no room for it
            self.console.print(f"{row.name}: {text}")
        self._event(row, text)

    def render(self):
        body = [
            [
                r.name,
                r.state,
                f"{max(r.step, 0)}/{r.total}" if r.total else max(r.step, 0),
                "" if r.eval is None else f"{r.eval:.3f}",
                r.eta(),
            ]
            for r in self.rows.values()
        ]
        return table("trials", ["trial", "state", "step", "avg@16", "ETA"], body)

    def close(self) -> None:
        if self.live is not None:
            self.live.update(self.render())
            self.live.stop()
            self.live = None
