"""The library entry point: run a named sweep from a script or a notebook, no CLI involved.

    import pdmask
    result = pdmask.run_sweep("smoke", pdmask.SweepOptions(profile="smoke", figures=False))
    result.ok, result.statuses()        # True, {trial hash: "done", ...}

It does what `pdm sweep NAME` does (the command maps its flags onto ``SweepOptions`` and calls
this): validate the whole grid (``ValidationFailed`` before anything launches), skip trials that
already finished, train the rest on Ray, track them in MLflow, draw the figures. The project is
found as the CLI finds it (``$PDM_PROJECT``, else the current folder or one above it), and the
state folder is ``$PDM_HOME``, else ``<project>/.pdm``.

``pdmask.runs("smoke")`` returns the sweep's runs as a pandas DataFrame (what `pdm runs` shows):
tags, status, attempts, wall time, params, the headline metric's final and best values.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from pdmask.orchestration.options import SweepOptions
from pdmask.registry import Registry, Trial, load_registry


@dataclass(frozen=True)
class SweepResult:
    """How an invocation ended and where its runs are."""

    sweep: str
    # 0: every trial finished; 1: some failed or a figure could not be drawn; 2: a trial's
    # configuration was refused; 130: interrupted (rerunning resumes)
    exit_code: int
    tracking_uri: str
    trials: tuple[Trial, ...]

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def statuses(self) -> dict[str, str]:
        """done / failed / running / todo per trial hash, read from the tracking store now."""
        from pdmask.tracking import TrialStatusIndex

        index = TrialStatusIndex.open(self.tracking_uri, self.sweep)
        return {t.trial_hash: index.status_of(t) for t in self.trials}


def run_sweep(sweep: str, options: SweepOptions | None = None) -> SweepResult:
    """Run every unfinished trial of the sweep named ``sweep`` (``sweeps/<sweep>.yaml``)."""
    from pdmask.orchestration import run_sweep as run_trials
    from pdmask.tracking import resolve_tracking_uri

    options = options or SweepOptions()
    reg = load_registry()
    trials = plan(reg, sweep, options)
    code = run_trials(reg, reg.sweep(sweep), trials, options)
    return SweepResult(sweep, code, resolve_tracking_uri(options.tracking_uri), tuple(trials))


def runs(sweep: str | None = None, tracking_uri: str | None = None):
    """A pandas DataFrame with one row per MLflow run of ``sweep`` (every sweep's when None):
    identity (method, model, precision, delta, seed, backend, trial_hash, ...), status,
    attempts, start/end time and ``wall_s``, ``headline_final`` / ``headline_best`` (the headline
    metric: the figures' evaluation accuracy, averaged over datasets), then ``params.<name>`` as plain
    values. ``tracking_uri``: another store than the state folder's. An unknown sweep raises
    ``ConfigError`` with the closest known names."""
    from pdmask.tracking.results import runs as runs_frame

    return runs_frame(sweep, tracking_uri)


def plan(reg: Registry, sweep: str, options: SweepOptions) -> list[Trial]:
    """The sweep's trials after every check made before launch (``orchestration.preflight``):
    the grid, its recipes' code on synthetic batches, its dashboards. Raises
    ``ValidationFailed`` with every problem at once."""
    from pdmask.orchestration.preflight import checked_trials

    return checked_trials(
        reg,
        sweep,
        backend=options.backend,
        profile=options.profile,
        cluster=options.cluster,
        max_trials=options.max_trials,
        address=options.address or os.environ.get("RAY_ADDRESS"),
        insecure=options.insecure,
    )
