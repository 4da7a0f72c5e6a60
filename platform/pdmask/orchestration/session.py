"""One invocation of a sweep, whatever its launch kind: its session, what it has left to run, and
how it ended.

``SweepSession.open`` is the head every launch kind shares, made once: the tracking store
resolved and opened (a bad store stops the sweep here, before anything launches), the sweep's
experiment ensured and described, the provenance tags read. ``todo`` is skip-finished: the trials
without a FINISHED run (by trial hash), read once per invocation, after those FINISHED in another
sweep were linked into this one (reuse across sweeps, ``tracking/reuse.py``). A launcher
(``launcher.Launcher``) runs them; ``settle`` then reads their final states from MLflow into a
``SweepOutcome``, which the runner's tail prints and returns, and which the library hands its
caller (``pdmask.run_sweep``).

While open, the session holds what a launch must keep until its trials are settled (``hold``: a
Ray head pdm started for jobs, whose jobs stop with it); leaving the session releases it.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, TypedDict, TypeVar

from rich.console import Console

from pdmask.orchestration.canary import SettingGate, StoppedSetting
from pdmask.orchestration.interrupts import EXIT_INTERRUPTED, Interrupts
from pdmask.orchestration.options import SweepOptions
from pdmask.orchestration.summary import SettingResult, TrialFailure
from pdmask.registry import Registry, Sweep, Trial
from pdmask.registry.backends import BackendSpec, backend_spec
from pdmask.registry.cli_overrides import OVERRIDES_TAG, overrides_tag
from pdmask.tracking import (
    TrialStatusIndex,
    ensure_experiment,
    open_client,
    provenance_tags,
    resolve_tracking_uri,
    runs_by_hash,
    sanitize_metric,
)
from pdmask.tracking.reuse import Source, drop_broken_links, finished_elsewhere, link
from pdmask.tracking.runs import FAILURE_KIND_TAG, FailureKind

Held = TypeVar("Held")
INTERRUPTED_NOTE = "interrupted: run the same command again to resume"


class BestTrial(TypedDict):
    """A search's best finished trial."""

    value: float
    run_id: str
    run_name: str | None
    delta: str | None
    trial_hash: str | None


@dataclass
class SweepOutcome:
    """How an invocation ended: counts of its trials by final state, what the summary shows, and
    the exit code (``exit_code``, the one rule)."""

    finished: int  # finished by this invocation
    failed: int
    skipped: int  # FINISHED before it started
    interrupted: int
    elsewhere: int = 0  # RUNNING under another live invocation's claim
    finished_elsewhere: int = 0  # FINISHED meanwhile by another copy of the sweep (it trained them)
    best: BestTrial | None = None  # a search's
    config_errors: int = 0  # FAILED because their configuration was refused (never retried)
    recipe_errors: int = 0  # FAILED because their recipe's code raised (never retried)
    lost_cluster: str | None = None  # why the sweep ended early: its Ray cluster was lost
    detached: int = 0  # RUNNING as Ray jobs that run on after this invocation (it attaches again)
    # what to say when the sweep was interrupted (a launch kind's own sentence)
    resume_note: str = INTERRUPTED_NOTE
    wall_s: float | None = None  # from the invocation's start to its trials' settling
    # the final headline metric of each setting over its seeds (summary.results_by_setting)
    results: list[SettingResult] = field(default_factory=list)
    headline: list[str] = field(default_factory=list)  # the metrics it is the mean of
    failures: list[TrialFailure] = field(default_factory=list)  # name and reason (summary.py)
    stop_requested: bool = False  # SIGINT, SIGTERM or SIGHUP ended it (resumable)
    figures: dict[str, str] = field(default_factory=dict)  # name -> its PNG, each drawn
    figures_failed: list[str] = field(default_factory=list)  # names of those that failed
    # settings a deterministic failure stopped (``canary.py``), and their trials never started
    stopped: list[StoppedSetting] = field(default_factory=list)
    not_started: int = 0
    reused: int = 0  # linked by it from another sweep's FINISHED run, not trained (reuse.py)

    @property
    def exit_code(self) -> int:
        """0 all finished and drawn; ``EXIT_INTERRUPTED`` (130) interrupted or trials left
        unfinished (the same command resumes); 2 a trial's configuration was refused or its
        recipe raised (neither is retried: fix, then rerun); 1 a trial failed, a setting was
        stopped, a figure could not be drawn, or the cluster was lost."""
        if self.lost_cluster:
            return 1
        if self.stop_requested or self.interrupted:
            return EXIT_INTERRUPTED
        if self.config_errors or self.recipe_errors:
            return 2
        return 1 if self.failed or self.stopped or self.figures_failed else 0


@dataclass(frozen=True)
class Todo:
    """What an invocation has left to run after skip-finished."""

    trials: list[Trial]  # in order; a search: its template (points are sampled as it goes)
    count: int  # trials this invocation runs (a search: its budget left)
    total: int  # trials of the sweep (a search: its budget)
    finished: frozenset[str]  # hashes of the trials with a FINISHED run
    # of those, the trials linked now from another sweep's FINISHED run (``tracking/reuse.py``)
    reused: frozenset[str] = frozenset()

    @property
    def skipped(self) -> int:
        return self.total - self.count


@dataclass
class SweepSession:
    """One invocation of a sweep, opened once, whatever its launch kind: its trials, where they
    are tracked, how it talks and how it is stopped, and when it began."""

    reg: Registry
    sweep: Sweep
    trials: list[Trial]
    options: SweepOptions
    client: Any  # the MLflow client of ``uri``
    uri: str
    experiment_id: str
    tags: dict[str, str]  # provenance, on every run
    console: Console
    interrupts: Interrupts  # SIGINT, SIGTERM, SIGHUP end the sweep, resumable
    started: float  # time.monotonic() at the start, for the wall time
    # which trials may start now, by setting: the canaries, fail-fast (opened by ``todo``)
    gate: SettingGate = field(default_factory=SettingGate.none)
    _held: ExitStack = field(default_factory=ExitStack, repr=False)

    @classmethod
    def open(
        cls,
        reg: Registry,
        sweep: Sweep,
        trials: list[Trial],
        options: SweepOptions,
        *,
        console: Console,
        interrupts: Interrupts,
        started: float | None = None,
    ) -> SweepSession:
        """Resolve and open the tracking store (``TrackingError`` when it cannot be trusted),
        ensure and describe the sweep's experiment, read the provenance tags."""
        uri = resolve_tracking_uri(options.tracking_uri)
        client = open_client(uri)  # a bad store stops us here, before anything launches
        return cls(
            reg=reg,
            sweep=sweep,
            trials=trials,
            options=options,
            client=client,
            uri=uri,
            experiment_id=ensure_experiment(client, sweep.name, sweep.description),
            tags={**provenance_tags(reg.root), **overrides_tag(options.overrides)},
            console=console,
            interrupts=interrupts,
            started=time.monotonic() if started is None else started,
        )

    def __enter__(self) -> SweepSession:
        return self

    def __exit__(self, *exc) -> None:
        self._held.close()

    def hold(self, resource: Held) -> Held:
        """Enter the context manager ``resource`` until the session closes, after its trials are
        settled (a Ray head pdm started: its jobs stop with it)."""
        return self._held.enter_context(resource)

    # ---------------------------------------------------------------- what the sweep is
    @property
    def backend(self) -> BackendSpec:
        """The one backend of the sweep's trials (``Registry.expand``)."""
        sweep, options = self.sweep, self.options
        return backend_spec(
            self.trials[0].backend if self.trials else options.backend or sweep.backend
        )

    @property
    def cluster(self) -> str:
        """The cluster profile the trials are planned for."""
        return self.options.cluster or self.sweep.cluster

    @property
    def max_concurrent(self) -> int | None:
        return self.options.max_concurrent or self.sweep.max_concurrent

    def planned_steps(self, trial: Trial) -> int | None:
        """The RL steps ``trial`` trains (``backends.interface.planned_steps``)."""
        from pdmask.backends.interface import planned_steps

        return planned_steps(trial)

    def headline(self) -> list[str]:
        """The metrics the headline metric is the mean of: the backend's evaluation metrics."""
        from pdmask.backends.interface import load_backend

        return load_backend(self.backend).eval_metrics(self.cluster) if self.trials else []

    # ---------------------------------------------------------------- skip-finished
    def todo(self) -> Todo:
        """The trials without a FINISHED run (by trial hash), in order, once those FINISHED in
        another sweep are linked (``_link_reusable``); a search's budget less the points it
        finished. Opens the session's gate on the same read of the runs: which of
        them may start when (``canary.py``; a search's points are each a setting of their own,
        its gate holds none back)."""
        by_hash = runs_by_hash(self.client, self.experiment_id)
        drop_broken_links(self.client, by_hash)
        done = TrialStatusIndex(by_hash).finished_hashes()
        search = self.sweep.search
        if search is not None:
            left = max(search.budget - len(done), 0)
            return Todo(self.trials[:1] if left else [], left, search.budget, frozenset(done))
        reused = self._link_reusable([t for t in self.trials if t.trial_hash not in done])
        if reused:
            by_hash = runs_by_hash(self.client, self.experiment_id)
            done = TrialStatusIndex(by_hash).finished_hashes()
        todo = [t for t in self.trials if t.trial_hash not in done]
        self.gate = SettingGate.of(
            self.trials,
            todo,
            by_hash,
            lambda: runs_by_hash(self.client, self.experiment_id),
            self.headline(),
            self.console.print,
        )
        return Todo(todo, len(todo), len(self.trials), frozenset(done), frozenset(reused))

    def _link_reusable(self, trials: list[Trial]) -> set[str]:
        """Link each of ``trials`` that FINISHED, complete, in another sweep into this sweep's
        experiment (``tracking/reuse.py``), under its claim: one another invocation trains or
        links right now is left to it. The hashes linked."""
        from pdmask.orchestration.claims import Claim
        from pdmask.tracking.runs import find_trial_runs

        linked = set()
        sources = reusable(self.client, self.experiment_id, trials, self.headline())
        if sources:  # a copy of every metric's history each: seconds for a large grid
            self.console.print(
                f"linking {len(sources)} trial(s) FINISHED in other sweeps (not trained again)…"
            )
        # the source's provenance stays; the link records this invocation's overrides
        tags = {k: v for k, v in self.tags.items() if k == OVERRIDES_TAG}
        for h, source in sources.items():
            with Claim(h, wait=0, holder=self.experiment_id) as ours:
                runs = find_trial_runs(self.client, self.experiment_id, h) if ours else []
                if not ours or any(r.info.status == "FINISHED" for r in runs):
                    continue
                link(self.client, source, self.experiment_id, self.sweep.name, tags)
                linked.add(h)
        return linked

    def start_line(self, todo: Todo) -> str:
        """The one line that says what this invocation runs."""
        from pdmask.tracking.store import redact

        overrides = self.tags.get(OVERRIDES_TAG)
        reused = f"{len(todo.reused)} reused from other sweeps, " if todo.reused else ""
        return (
            f"sweep {self.sweep.name}{f' ({overrides})' if overrides else ''}: {todo.total} "
            f"trials, {reused}{todo.skipped - len(todo.reused)} already finished, "
            f"{todo.count} to run (tracking: {redact(self.uri)})"
        )

    # ---------------------------------------------------------------- the end
    def unlaunched(self, todo: Todo) -> SweepOutcome:
        """The outcome of an invocation that launched nothing: its finished trials, read."""
        by_hash = runs_by_hash(self.client, self.experiment_id)
        runs = [r for h in todo.finished for r in by_hash.get(h, []) if r.info.status == "FINISHED"]
        skipped = todo.skipped - len(todo.reused)
        outcome = SweepOutcome(0, 0, skipped, 0, best=self.best(), reused=len(todo.reused))
        return self._concluded(outcome, runs)

    def settle(
        self,
        skipped: int,
        detached: set[str] | frozenset[str] = frozenset(),
        reused: int = 0,
        trained_elsewhere: set[str] | frozenset[str] = frozenset(),
    ) -> SweepOutcome:
        """Final states from MLflow; runs left RUNNING by an interrupt become KILLED (resumable),
        but those of the trials in ``detached`` (their Ray jobs run on: the same command
        attaches); with the results and failures of the runs read, and the wall time. A FINISHED
        trial of ``trained_elsewhere`` counts as finished by another invocation, not this one:
        two copies of a sweep add up to the trials trained.

        A trial not FINISHED in the snapshot is re-read under its claim: another invocation may be
        finishing it right now, and its state must never be overwritten from a stale snapshot.
        The trials a stopped setting kept from starting (``gate``) are counted apart.
        ``skipped``: the trials FINISHED before the launch; ``reused``: how many of them this
        invocation linked from other sweeps (``Todo.reused``), counted apart.
        """
        from pdmask.orchestration.claims import Claim
        from pdmask.tracking.runs import find_trial_runs, with_retry

        client, experiment_id = self.client, self.experiment_id
        by_hash = runs_by_hash(client, experiment_id)
        finished = failed = interrupted = elsewhere = config_errors = recipe_errors = 0
        by_other_copy = 0  # FINISHED: trained by another copy of this sweep
        running_on = 0  # detached jobs
        not_started = self.gate.not_started()
        search = self.sweep.search is not None
        hashes = list(by_hash) if search else [t.trial_hash for t in self.trials]
        read = []  # each trial's runs as last read
        for h in hashes:
            statuses = {r.info.status for r in by_hash.get(h, [])}
            if "FINISHED" in statuses:
                by_other_copy += h in trained_elsewhere
                finished += h not in trained_elsewhere
                read += [r for r in by_hash[h] if r.info.status == "FINISHED"]  # not a past failure
                continue
            if h in detached:  # its job runs on the cluster: its run is not ours to end
                read += by_hash.get(h, [])
                running_on += 1
                continue
            if h in not_started:  # its setting was stopped before it started
                continue
            with Claim(h, wait=0, holder=experiment_id) as ours:
                runs = find_trial_runs(client, experiment_id, h) if ours else by_hash.get(h, [])
                read += runs
                statuses = {r.info.status for r in runs}
                if "FINISHED" in statuses:
                    by_other_copy += h in trained_elsewhere
                    finished += h not in trained_elsewhere
                elif any(r.data.tags.get(FAILURE_KIND_TAG) == FailureKind.CONFIG for r in runs):
                    config_errors += 1
                elif any(r.data.tags.get(FAILURE_KIND_TAG) == FailureKind.RECIPE for r in runs):
                    recipe_errors += 1
                elif "FAILED" in statuses:
                    failed += 1
                elif not ours:  # another live invocation trains it now
                    elsewhere += 1
                else:
                    for r in runs:
                        if r.info.status == "RUNNING":
                            with_retry(
                                lambda r=r: client.set_terminated(r.info.run_id, status="KILLED")
                            )
                    interrupted += 1
        outcome = SweepOutcome(
            finished - skipped,
            failed,
            skipped - reused,
            interrupted,
            elsewhere=elsewhere,
            finished_elsewhere=by_other_copy,
            best=self.best(),
            config_errors=config_errors,
            recipe_errors=recipe_errors,
            detached=running_on,
            stopped=self.gate.stopped_settings(),
            not_started=len(not_started),
            reused=reused,
        )
        return self._concluded(outcome, read)

    def _concluded(self, outcome: SweepOutcome, runs: list) -> SweepOutcome:
        return concluded(outcome, runs, self.headline(), self.started)

    def best(self) -> BestTrial | None:
        """A search's best FINISHED trial by its metric (None for a grid, or none finished)."""
        search = self.sweep.search
        if search is None:
            return None
        key = sanitize_metric(search.metric)
        best: BestTrial | None = None
        for runs in runs_by_hash(self.client, self.experiment_id).values():
            for r in runs:
                value = r.data.metrics.get(key)
                if r.info.status != "FINISHED" or value is None:
                    continue
                if best is None or (
                    value > best["value"] if search.mode == "max" else value < best["value"]
                ):
                    best = BestTrial(
                        value=value,
                        run_id=r.info.run_id,
                        run_name=r.data.tags.get("mlflow.runName"),
                        delta=r.data.tags.get("pdm.delta"),
                        trial_hash=r.data.tags.get("pdm.trial_hash"),
                    )
        return best


def concluded(
    outcome: SweepOutcome, runs: list, headline: list[str], started: float | None
) -> SweepOutcome:
    """``outcome`` with what the summary shows besides counts, from the trials' ``runs``:
    results per setting (``headline``: the metrics the headline metric is the mean of), failures,
    and the wall time since ``started`` (``time.monotonic``)."""
    from pdmask.orchestration.summary import failures, results_by_setting

    outcome.headline = list(headline)
    outcome.results = results_by_setting(runs, outcome.headline) if headline else []
    outcome.failures = failures(runs)
    outcome.wall_s = None if started is None else time.monotonic() - started
    return outcome


def reusable(
    client, experiment_id: str | None, trials: list[Trial], eval_metrics: list[str]
) -> dict[str, Source]:
    """Each of ``trials`` with a FINISHED run in another sweep's experiment that is complete as
    this trial's plan says (``completeness.gap``: planned steps and validations on
    ``eval_metrics``), by trial hash: what the invocation links instead of training, and what
    the plan shows as "reuse"."""
    from pdmask.backends.interface import planned_steps
    from pdmask.tracking.completeness import Plan, gap

    by_hash = {t.trial_hash: t for t in trials}

    def complete(h: str, run) -> bool:
        plan = Plan.of(planned_steps(by_hash[h]), eval_metrics)
        return gap(client, run.info.run_id, plan) is None

    return finished_elsewhere(client, experiment_id, by_hash, complete)
