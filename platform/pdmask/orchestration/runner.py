"""Run a sweep's unfinished trials, track them in MLflow, resume after any stop: the one runner.

Flow, the same for every launch kind: the head opens the invocation's session once
(``session.SweepSession``: the tracking store, checked before anything launches, its experiment,
the interrupts), lets the launch kind refuse what it cannot run (``Launcher.check``), skips the
finished trials and says what is left in one line, with the gate both launch kinds consult
(``canary.py``: a canary per setting, fail-fast on deterministic failures) → the launch kind's
launcher runs the rest (``launcher.py``: Ray Tune trials in ``tune/``, Ray jobs in ``jobs/``) →
the tail: settle (final states read from MLflow; runs left RUNNING by an interrupt become KILLED
and resume next time, unless their jobs run on, detached) → summary → figures, drawn from this
sweep's own trials → the outcome, whose ``exit_code`` is the command's.

Exit codes (``SweepOutcome.exit_code``): 0 all finished and drawn; 1 a trial failed, a setting
was stopped or a figure could not be built; 2 a trial's configuration was refused or its recipe
raised (neither is retried: fix, then rerun); ``EXIT_INTERRUPTED`` (130) interrupted (SIGINT,
SIGTERM, or trials left unfinished), resumable by running the same command again.
"""

from __future__ import annotations

import time

from rich.console import Console

from pdmask.console import console as sweep_console
from pdmask.errors import ClusterLost
from pdmask.orchestration.options import SweepOptions
from pdmask.orchestration.session import SweepOutcome, SweepSession
from pdmask.registry import Registry, Sweep, Trial
from pdmask.tracking.store import redact


def run_sweep(
    reg: Registry, sweep: Sweep, trials: list[Trial], options: SweepOptions
) -> SweepOutcome:
    """Run ``trials`` (the expanded ``sweep``, after ``preflight.checked_trials``) and return how
    it ended; its ``exit_code`` is the command's. Caller: ``pdmask.api``.

    Raises:
        TrackingError: the tracking store cannot be opened or trusted (nothing launched).
        ConfigError: the launch kind refuses the sweep (``ValidationFailed``: every problem at
            once), before anything launches.
        ClusterLost: after the summary, when the sweep's Ray cluster was lost (resumable).
        StoreLost: a trial's store could not record its failure (a full disk).
    """
    from pdmask.orchestration.driver_logs import routed
    from pdmask.orchestration.interrupts import EXIT_INTERRUPTED, handled
    from pdmask.orchestration.launcher import Launched, load_launcher
    from pdmask.orchestration.report import print_summary

    started = time.monotonic()
    console = sweep_console()  # off a terminal: lines as long as they are (CI logs, pipes)
    with handled() as interrupts, routed(sweep.name):  # library lines go to driver.log
        with SweepSession.open(
            reg, sweep, trials, options, console=console, interrupts=interrupts, started=started
        ) as session:
            launcher = load_launcher(session.backend.launch)
            launcher.check(session)
            todo = session.todo()
            console.print(session.start_line(todo))
            if not todo.count:
                outcome = session.unlaunched(todo)
            else:
                if line := session.gate.plan_line():
                    console.print(line)
                launched = Launched()
                if not interrupts.requested:  # stopped while the store was checked: start nothing
                    launched = launcher.launch(session, todo)
                outcome = session.settle(
                    todo.skipped, launched.detached, len(todo.reused), launched.trained_elsewhere
                )
                outcome.lost_cluster = launched.lost_cluster
                outcome.resume_note = launched.resume_note or outcome.resume_note
        print_summary(console, sweep, outcome, session.uri)
        if outcome.lost_cluster:
            raise ClusterLost(f"sweep stopped: {outcome.lost_cluster}")
        drawable = outcome.interrupted == 0 and not interrupts.requested
        if options.figures and sweep.figures and drawable:
            _build_figures(console, session, outcome)
    outcome.stop_requested = interrupts.requested
    if outcome.exit_code == EXIT_INTERRUPTED:
        console.print(outcome.resume_note)
    return outcome


def _build_figures(console: Console, session: SweepSession, outcome: SweepOutcome) -> None:
    """Draw the sweep's figures from its own trials (this profile's, not another's that share
    the experiment) into ``outcome``: each figure's PNG, or its name among those that failed."""
    from pdmask.figures import build_figure
    from pdmask.figures.styles import MethodStyle

    sweep = session.sweep
    styles = {name: MethodStyle(r.display_name, r.color) for name, r in session.reg.recipes.items()}
    # A search's trials are sampled points, unknown upfront: its figures read every run.
    hashes = {t.trial_hash for t in session.trials} if sweep.search is None else None
    for name in sweep.figures:
        try:
            result = build_figure(
                name, sweep=sweep.name, tracking_uri=session.uri, styles=styles, trial_hashes=hashes
            )
        except Exception as err:  # a figure problem must not hide that the training finished
            console.print(
                f"[red]figure {name} failed: {type(err).__name__}: {redact(str(err))}[/red]"
            )
            outcome.figures_failed.append(name)
            continue
        outcome.figures[name] = str(result.paths.get("png"))
        console.print(f"figure {name}: {result.paths.get('png')}")
        if extended := result.paths.get("extended_png"):  # the figure-spec's `beyond_paper`
            console.print(f"figure {name} with the methods beyond the paper: {extended}")
        if numbers := result.paths.get("summary_md"):  # the paired differences are there
            console.print(f"figure {name} in numbers, paired against the baseline: {numbers}")
