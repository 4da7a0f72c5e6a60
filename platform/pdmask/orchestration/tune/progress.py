"""Live progress of a sweep: a header (counts, elapsed, ETA) above the trials that fit, or lines.

On a terminal, a live display (``progress_view.view``): the header, running trials first, cut to
the terminal's height. Elsewhere (piped, ``CI`` set), one line per trial event (started,
finished, failed, retrying) and a heartbeat, the header's line with the time, every
``HEARTBEAT_S`` (the first when Tune's loop starts), printed even when no trial reports: Tune
calls ``on_step_begin`` many times a second. ``Phase``: a line for a slow step before the first
trial reports, and its time when done.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from ray.tune import Callback
from rich.console import Console
from rich.live import Live
from rich.markup import escape

from pdmask.orchestration.eta import Capacity, Planned, sweep_eta
from pdmask.orchestration.progress_view import (
    FAILED,
    HEARTBEAT_S,
    Row,
    counts,
    duration,
    header,
    view,
)

__all__ = ["HEARTBEAT_S", "Phase", "Row", "SweepProgress", "interactive"]


def interactive(console: Console) -> bool:
    """A live display: the console is a terminal and no CI says its output is a log."""
    return console.is_terminal and os.environ.get("CI", "").lower() in ("", "0", "false")


class Phase:
    """A slow step: ``doing…`` when it starts, ``done (time)`` when it ends (not on an error)."""

    def __init__(self, console: Console, doing: str, done: str, clock=time.monotonic):
        self.console, self.done, self.clock = console, done, clock
        self.console.print(f"{doing}…")
        self.began, self.ended = clock(), False

    def end(self) -> None:
        if not self.ended:
            self.ended = True
            self.console.print(f"{self.done} ({duration(self.clock() - self.began)})")

    def __enter__(self) -> Phase:
        return self

    def __exit__(self, kind, *_) -> None:
        if kind is None:
            self.end()


class SweepProgress(Callback):
    """A Tune callback: keeps one row per trial; live display on a terminal, lines otherwise.

    ``names``: run name of each planned trial by hash (the queued rows); ``total``: trials this
    invocation runs (default: one per name); ``slots``: how many run side by side (for the ETA;
    the most seen running when larger); ``plans``: how the plan prices each trial, by hash
    (``eta.Planned``, for the ETA); ``started``: when the sweep began, on ``clock``;
    ``first_step``: the phase that ends when the first trial reports a step."""

    def __init__(
        self,
        names: dict[str, str],
        console: Console | None = None,
        failure_of: Callable[[Any, bool], tuple[str | None, bool]] | None = None,
        on_store_lost: Callable[[], None] | None = None,
        *,
        sweep: str = "sweep",
        total: int | None = None,
        slots: int = 1,
        plans: dict[str, Planned] | None = None,
        clock: Callable[[], float] = time.monotonic,
        started: float | None = None,
        live: bool | None = None,
        first_step: Phase | None = None,
    ):
        self.rows: dict[str, Row] = {}
        self.names = names  # Tune trial id is unknown upfront: map via the reported trial hash
        self.console = console or Console(highlight=False)
        # ``(why, given_up)`` of a Tune trial's failed attempt (``final``: not retried), as its run
        # says (a death is recorded there first: ``deaths.py``); given_up: it is not retried again
        self.failure_of = failure_of
        # A trial's store cannot be written (``store-unwritable``): its line, and what stops the
        # sweep (no other trial can record anything either).
        self.store_lost: str | None = None
        self.on_store_lost = on_store_lost
        self.sweep, self.total, self.slots = sweep, len(names) if total is None else total, slots
        self.plans = plans or {}
        self.clock = clock
        self.started = clock() if started is None else started
        self.next_heartbeat: float | None = None  # due at once when Tune's loop starts
        self.first_step = first_step
        self.live: Live | None = None
        if live if live is not None else interactive(self.console):
            self.live = Live(
                console=self.console,
                get_renderable=self.render,
                refresh_per_second=2,
                transient=False,
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
        state["clock"] = None  # a test's clock may not pickle
        state["first_step"] = None  # holds the console
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.console = Console(highlight=False)
        self.clock = time.monotonic

    def _row(self, trial, result=None) -> Row:
        key = trial.trial_id
        if key not in self.rows:
            self.rows[key] = Row(name=trial.trial_id, started=self.clock())
            self._name_from_config(self.rows[key], getattr(trial, "config", None))
        row = self.rows[key]
        if result and "pdm_trial_hash" in result:
            row.trial_hash = result["pdm_trial_hash"]
            row.name = self.names.get(row.trial_hash, row.name)
            row.plan = self.plans.get(row.trial_hash, row.plan)
        return row

    def _name_from_config(self, row: Row, config: dict | None) -> None:
        """The trial's hash and run name, from its Tune config (a search's sampled point too)."""
        from pdmask.orchestration.tune.trial_config import trial_from_config

        try:
            trial = trial_from_config(config)
        except Exception:  # not a pdmask config: the Tune trial id stays its name
            return
        row.trial_hash = trial.trial_hash
        row.name = self.names.get(row.trial_hash) or trial.run_name()
        row.plan = self.plans.get(row.trial_hash)

    def drop(self, hashes: list[str]) -> None:
        """Trials that will not start (their setting was stopped): no longer queued or counted."""
        dropped = [h for h in hashes if self.names.pop(h, None) is not None]
        self.total -= len(dropped)

    def trained_elsewhere(self) -> frozenset[str]:
        """The trials another invocation of the sweep trained: this one found their claim held
        (``claimed-elsewhere``) or, once it took it, their run finished (``already-done``)."""
        theirs = ("claimed-elsewhere", "already-done")
        return frozenset(r.trial_hash for r in self.rows.values() if r.outcome in theirs)

    def eta(self, rows: list[Row], now: float) -> float | None:
        """``eta.sweep_eta`` over the rows and the trials not started yet (in launch order; a
        search's points, not known upfront, as the others)."""
        unknown = Planned(cell="", steps=None)
        started = {r.trial_hash for r in rows}
        queued = [r.plan or unknown for r in rows if r.state == "pending"]  # Tune's, not started
        queued += [self.plans.get(h) or unknown for h in self.names if h not in started]
        left = counts(rows, self.total).queued
        queued = queued[:left] + [unknown] * max(left - len(queued), 0)
        return sweep_eta(rows, queued, now, Capacity(self._slots(rows)))

    def _event(self, row: Row, text: str) -> None:
        if self.live is None:
            self.console.print(f"[{time.strftime('%H:%M:%S')}] {escape(row.name)}: {escape(text)}")

    def header(self) -> str:
        now = self.clock()
        rows = list(self.rows.values())
        return header(self.sweep, rows, self.total, now - self.started, self.eta(rows, now))

    def _slots(self, rows: list[Row]) -> int:
        return max(self.slots, sum(r.state == "running" for r in rows), 1)

    def heartbeat(self) -> None:
        """Off a terminal: the header's line when it is due (every ``HEARTBEAT_S``)."""
        now = self.clock()
        if self.live is not None or (self.next_heartbeat is not None and now < self.next_heartbeat):
            return
        self.next_heartbeat = now + HEARTBEAT_S
        self.console.print(f"[{time.strftime('%H:%M:%S')}] {self.header()}")

    def on_step_begin(self, iteration, trials, **info):
        self.heartbeat()

    def on_trial_start(self, iteration, trials, trial, **info):
        row = self._row(trial)
        row.state = "running"

    def on_trial_result(self, iteration, trials, trial, result, **info):
        row = self._row(trial, result)
        row.total = int(result.get("pdm_total_steps") or 0)
        row.attempt = int(result.get("pdm_attempt", row.attempt))
        if "pdm_step" in result:
            if row.first_step_at is None:
                row.first_step_at, row.first_step = self.clock(), int(result["pdm_step"])
            row.step = int(result["pdm_step"])
            if self.first_step is not None:
                self.first_step.end()
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
            row.finished_at = self.clock()
            row.state = {
                "finished": "done",
                "already-done": "skipped",
                "claimed-elsewhere": "elsewhere",
                "config-error": "config error",
                "recipe-error": "recipe error",
            }.get(outcome, "failed")
            detail = f" (eval {row.eval:.3f})" if row.eval is not None else ""
            if result.get("pdm_error"):  # a configuration or recipe error: show it, not retried
                detail += f": {result['pdm_error']}"
                if self.live is not None:  # the live table has no room for it
                    self.console.print(escape(f"{row.name}: {outcome}{detail}"))
            self._event(row, f"{outcome}{detail}")
        elif self.live is None and row.step == row.first_step:
            self._event(row, f"started (attempt {row.attempt})")

    def on_trial_recover(self, iteration, trials, trial, **info):
        row = self._row(trial)
        row.state, row.first_step_at = "retrying", None
        self._failure(row, trial, "retrying from its checkpoint", final=False)

    def on_trial_error(self, iteration, trials, trial, **info):
        row = self._row(trial)
        if row.state not in FAILED:
            row.state, row.finished_at = "failed", self.clock()
        self._failure(row, trial, "retries exhausted", final=True)

    def _failure(self, row: Row, trial, then: str, final: bool) -> None:
        reason, given_up = self.failure_of(trial, final) if self.failure_of else (None, False)
        if given_up:
            then = "not retried again"
        text = f"{reason}; {then}" if reason else f"crashed; {then}"
        if reason and self.live is not None:  # the live table has no room for it
            self.console.print(escape(f"{row.name}: {text}"))
        self._event(row, text)

    def render(self):
        now = self.clock()
        rows = list(self.rows.values())  # a snapshot: the live display renders from its thread
        return view(
            self.sweep,
            rows,
            total=self.total,
            elapsed=now - self.started,
            now=now,
            eta=self.eta(rows, now),
            height=self.console.size.height,
        )

    def close(self) -> None:
        if self.live is not None:
            self.live.refresh()
            self.live.stop()
            self.live = None
