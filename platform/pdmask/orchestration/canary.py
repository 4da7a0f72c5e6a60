"""A canary per setting, and fail-fast on deterministic failures: one gate, whatever the launch kind.

**A setting** is what a sweep's seeds sample, the cell of a figure panel: a trial's identity
without its seed (``Trial.cell_hash``; ``Trial.cell_name`` names it): the method with its
parameters, model, precision, delta, the source of mu, the embedded knobs, backend and budget.

**The canary.** A setting's first unfinished trial in the plan's order is its canary (one that
had a run already, a resumed canary, is preferred). Every canary is launched before any other
trial (``launch_order``), and a setting's other trials start only once its canary has reached
its first training step and one validation: its run holds a metric of an RL step
(``TRAINING_METRIC``, which every backend logs at each step and never at step 0's evaluation)
and one of the backend's evaluation metrics. A setting one of whose runs got there before (an
interrupted sweep, resumed) is open at once. A canary that ends for good without getting there
and without a deterministic failure (it stalled, or crashed beyond its retries with errors that
differ) opens its setting too: those faults can pass.

**Fail-fast.** An attempt's failure kind is decided where it is recorded (``TrialRun.fail``,
with the kinds and the fingerprint in ``tracking/runs.py``): deterministic by kind (a
configuration or recipe error, an import error, an engine refusal) or by repetition (a crash
with the fingerprint of an earlier attempt's). A deterministic failure is not retried (the Tune
worker returns instead of raising, the job loop does not resubmit) and stops its setting: its
queued trials never start, one line names the error and the setting, the summary lists it
(``SweepOutcome.stopped``) and the exit code is at least 1. The other settings go on.

Both launch kinds consult the session's one ``SettingGate``: Ray Tune through a searcher that
hands out only the trials it admits (``tune/gated_grid.py``), the job loop at admission
(``jobs/job_loop.py``). The gate reads what it decides on from MLflow, where both kinds' trials
write: the runs' metrics and failure kinds. A search has no canary: each of its points is a
setting of its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypedDict

from pdmask.registry import Trial
from pdmask.tracking.runs import DETERMINISTIC, FAILURE_KIND_TAG, FailureKind, failure_headline

# verl's mean reward: logged by every backend at every RL step, never at step 0's evaluation.
TRAINING_METRIC = "critic/score/mean"
REFRESH_S = 2.0  # how often the gate reads the runs again (each read is one store query)


class StoppedSetting(TypedDict):
    """A setting a deterministic failure stopped: what the summary says of it."""

    setting: str  # its cell name (``Trial.cell_name``)
    error: str  # the failure's line
    kind: str  # its ``FailureKind``
    trial: str  # the run name of the trial that failed it
    not_started: int  # its queued trials, never started


@dataclass
class _Cell:
    name: str
    trials: list[str]  # this invocation's trials of the setting, in the plan's order
    canary: str | None  # the trial it waits for; None: open (or stopped)
    stopped: StoppedSetting | None = None


@dataclass
class SettingGate:
    """Which of the session's trials may start now, by setting (see the module docstring)."""

    cells: dict[str, _Cell]  # by cell hash
    cell_of: dict[str, str]  # trial hash -> cell hash
    order: list[Trial]  # launch order: every canary first
    read_runs: Callable[[], dict[str, list]]  # the experiment's runs by trial hash
    eval_metrics: list[str]
    say: Callable[[str], None]  # one line to the sweep's console
    attempts_before: dict[str, int]  # run id -> attempts when the gate opened
    started: set[str] = field(default_factory=set)  # trials launched in this invocation
    ended: set[str] = field(default_factory=set)  # trials that will not run again here
    on_stop: list[Callable[[list[str]], None]] = field(default_factory=list)  # hooks
    _read_at: float = float("-inf")

    @classmethod
    def of(
        cls,
        trials: list[Trial],
        todo: list[Trial],
        by_hash: dict[str, list],
        read_runs: Callable[[], dict[str, list]],
        eval_metrics: list[str],
        say: Callable[[str], None],
    ) -> SettingGate:
        """The gate of ``todo`` (the unfinished ``trials`` of a grid, in the plan's order), its
        settings' states from the runs ``by_hash`` (``read_runs`` reads them again: the
        experiment's runs by trial hash); ``eval_metrics``: the backend's; ``say``: a line to
        the sweep's console."""
        cells: dict[str, _Cell] = {}
        cell_of: dict[str, str] = {}
        for trial in todo:
            cell_of[trial.trial_hash] = trial.cell_hash
            cell = cells.setdefault(trial.cell_hash, _Cell(trial.cell_name(), [], None))
            cell.trials.append(trial.trial_hash)
        # every trial of the sweep counts for whether a setting proved itself before
        proved = {
            t.cell_hash
            for t in trials
            if any(_reached_first_step(r, eval_metrics) for r in by_hash.get(t.trial_hash, []))
        }
        for key, cell in cells.items():
            if key not in proved:
                resumed = [h for h in cell.trials if by_hash.get(h)]
                cell.canary = (resumed or cell.trials)[0]
        canaries = {c.canary for c in cells.values()}
        return cls(
            cells=cells,
            cell_of=cell_of,
            order=launch_order([t for t in todo if t.trial_hash in canaries])
            + launch_order([t for t in todo if t.trial_hash not in canaries]),
            read_runs=read_runs,
            eval_metrics=eval_metrics,
            say=say,
            attempts_before={
                r.info.run_id: int(r.data.tags.get("pdm.attempts", "0"))
                for runs in by_hash.values()
                for r in runs
            },
        )

    @classmethod
    def none(cls) -> SettingGate:
        """A gate that holds nothing back (a search's: each point is a setting of its own)."""
        return cls({}, {}, [], dict, [], print, {})

    # ---------------------------------------------------------------- asked by the launchers

    def _cell(self, trial: Trial) -> _Cell | None:
        return self.cells.get(self.cell_of.get(trial.trial_hash, ""))

    def is_canary(self, trial: Trial) -> bool:
        cell = self._cell(trial)
        return cell is not None and cell.canary == trial.trial_hash

    def admissible(self, trial: Trial) -> bool:
        """True when ``trial`` may start now: it is its setting's canary, or the setting is
        open (a trial the gate does not hold, always); never in a stopped setting."""
        cell = self._cell(trial)
        return cell is None or (cell.stopped is None and cell.canary in (None, trial.trial_hash))

    def is_stopped(self, trial: Trial) -> bool:
        cell = self._cell(trial)
        return cell is not None and cell.stopped is not None

    def start(self, trial: Trial) -> None:
        """``trial`` is launched now."""
        self.started.add(trial.trial_hash)

    def end(self, trial_hash: str) -> None:
        """``trial_hash`` will not run again in this invocation (finished, or failed for good)."""
        self.ended.add(trial_hash)
        self.refresh(force=True)

    # ---------------------------------------------------------------- what it decides
    def refresh(self, force: bool = False) -> None:
        """Read the runs again (at most every ``REFRESH_S`` unless ``force``): stop a setting
        with a deterministic failure of this invocation, open one whose canary proved it."""
        now = time.monotonic()
        undecided = any(  # a canary to prove, or trials that may still fail
            c.stopped is None and (c.canary or not self._all_ended(c)) for c in self.cells.values()
        )
        if not undecided or (not force and now - self._read_at < REFRESH_S):
            return
        self._read_at = now
        by_hash = self.read_runs()
        for cell in self.cells.values():
            if cell.stopped is not None:
                continue
            runs = [r for h in cell.trials for r in by_hash.get(h, [])]
            failed = next((r for r in runs if self._failed_deterministically(r)), None)
            if failed is not None:
                self._stop(cell, failed)
            elif cell.canary is not None and (
                any(_reached_first_step(r, self.eval_metrics) for r in runs)
                or cell.canary in self.ended
            ):
                cell.canary = None

    def plan_line(self) -> str | None:
        """What the canaries hold back, in one line (None: nothing waits for a canary)."""
        held = [c for c in self.cells.values() if c.canary is not None]
        waiting = sum(len(c.trials) - 1 for c in held)
        if not waiting:
            return None
        return (
            f"canaries: the first trial of each of {len(held)} setting(s) starts first; their "
            f"{waiting} other trial(s) start once it reported its first training step and a "
            "validation (a deterministic failure stops its setting)"
        )

    def stopped_settings(self) -> list[StoppedSetting]:
        return [c.stopped for c in self.cells.values() if c.stopped is not None]

    def not_started(self) -> set[str]:
        """The trials a stopped setting kept from starting."""
        return {
            h
            for c in self.cells.values()
            if c.stopped is not None
            for h in c.trials
            if h not in self.started
        }

    def _all_ended(self, cell: _Cell) -> bool:
        return all(h in self.ended for h in cell.trials)

    def _failed_deterministically(self, run) -> bool:
        kind = run.data.tags.get(FAILURE_KIND_TAG)
        attempts = int(run.data.tags.get("pdm.attempts", "0"))
        new = attempts > self.attempts_before.get(run.info.run_id, 0)  # not a past invocation's
        return new and run.info.status == "FAILED" and kind in DETERMINISTIC

    def _stop(self, cell: _Cell, run) -> None:
        queued = [h for h in cell.trials if h not in self.started]
        reason = (run.data.tags.get("pdm.failure_reason") or "").strip()
        cell.canary = None
        cell.stopped = StoppedSetting(
            setting=cell.name,
            error=failure_headline(reason)[:300] or "no reason recorded",
            kind=FailureKind(run.data.tags[FAILURE_KIND_TAG]).value,
            trial=run.data.tags.get("mlflow.runName") or run.info.run_id,
            not_started=len(queued),
        )
        self.say(stop_line(cell.stopped))
        for hook in self.on_stop:
            hook(queued)


def stop_line(stopped: StoppedSetting) -> str:
    """The one line a stopped setting gets, on the console and in the summary."""
    return (
        f"setting {stopped['setting']} stopped: {stopped['error']} ({stopped['kind']}, trial "
        f"{stopped['trial']}; not retried); its {stopped['not_started']} queued trial(s) will "
        "not start"
    )


def _reached_first_step(run, eval_metrics: list[str]) -> bool:
    metrics = run.data.metrics
    return TRAINING_METRIC in metrics and any(m in metrics for m in eval_metrics)


def launch_order(trials: list[Trial]) -> list[Trial]:
    """``trials`` one model at a time in turn. Trials of one model share its warm start (the
    embedded backend's base model, built once under a lock): launched side by side, the first
    ones would wait for one build while the other cores idle; spread out, the first trials build
    different models at once (`main-figure` on 2 cores: ~170 core-seconds of lock waits gone)."""
    by_model: dict[str, list[Trial]] = {}
    for t in trials:
        by_model.setdefault(t.model, []).append(t)
    queues = list(by_model.values())
    out: list[Trial] = []
    for i in range(max(map(len, queues), default=0)):
        out += [q[i] for q in queues if i < len(q)]
    return out
