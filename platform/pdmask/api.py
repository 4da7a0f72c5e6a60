"""The library entry point: run a named sweep from a script or a notebook, no CLI involved.

    import pdmask
    result = pdmask.run_sweep("smoke", pdmask.SweepOptions(profile="smoke", figures=False))
    result.ok, result.outcome.finished  # True, 2
    result.failures, result.results     # why each failed trial failed; each setting's mean ± sd
    result.dataframe()                  # its runs, one row each (pandas)

It does what `pdm sweep NAME` does (the command maps its flags onto ``SweepOptions``, calls this
and exits with ``result.exit_code``): validate the whole grid (``ValidationFailed`` before
anything launches), skip trials that already finished, train the rest on Ray, track them in
MLflow, print the summary, draw the figures, and return how it ended (``SweepResult``, like Ray
Tune's ``ResultGrid``). The project is found as the CLI finds it (``$PDM_PROJECT``, else the
current folder or one above it), and the state folder is ``$PDM_HOME``, else ``<project>/.pdm``.

``pdmask.runs("smoke")`` returns the sweep's runs as a pandas DataFrame (what `pdm runs` shows):
tags, status, attempts, wall time, params, the headline metric's final and best values;
``pdmask.history("smoke", metric="actor/entropy")`` every point of a metric, one row per run and
step (long format).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pdmask.orchestration.options import SweepOptions
from pdmask.registry import Registry, Trial, load_registry
from pdmask.registry.cli_overrides import with_overrides

if TYPE_CHECKING:
    from pdmask.orchestration.session import BestTrial, SweepOutcome
    from pdmask.orchestration.summary import SettingResult, TrialFailure


@dataclass(frozen=True)
class SweepResult:
    """How an invocation ended, what it ran and where its runs are (Ray Tune's ``ResultGrid``,
    for a sweep): the counts, each failed trial's reason, a search's best trial and each
    setting's final headline metric in ``outcome``, its runs as a DataFrame (``dataframe``)."""

    sweep: str
    tracking_uri: str
    trials: tuple[Trial, ...]  # as planned (a search: its template)
    # counts by final state (finished, skipped, failed, config_errors, recipe_errors,
    # interrupted, elsewhere, detached), failures, best, results, wall time, figures
    outcome: SweepOutcome
    search: bool = False  # the trials are points a search sampled, not a grid's

    @property
    def exit_code(self) -> int:
        """0: every trial finished and every figure was drawn; 1: some failed, a figure could
        not be drawn or the cluster was lost; 2: a trial's configuration was refused or its
        recipe raised; 130: interrupted (rerunning resumes)."""
        return self.outcome.exit_code

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def failures(self) -> list[TrialFailure]:
        """Each FAILED trial's run name and reason."""
        return self.outcome.failures

    @property
    def best(self) -> BestTrial | None:
        """A search's best finished trial (None for a grid)."""
        return self.outcome.best

    @property
    def results(self) -> list[SettingResult]:
        """Each setting's final headline metric over its seeds: ``setting``, ``n``, ``mean``,
        ``sd``."""
        return self.outcome.results

    def statuses(self) -> dict[str, str]:
        """done / failed / running / todo per trial hash, read from the tracking store now."""
        from pdmask.tracking import TrialStatusIndex

        index = TrialStatusIndex.open(self.tracking_uri, self.sweep)
        return {t.trial_hash: index.status_of(t) for t in self.trials}

    def dataframe(self):
        """This sweep's runs of these trials as a pandas DataFrame, one row per MLflow run, read
        now (the columns of ``pdmask.runs``; a search: every run of the sweep)."""
        from pdmask.tracking.results import runs as runs_frame

        frame = runs_frame(self.sweep, self.tracking_uri)
        if self.search or frame.empty:  # a search's points are all its runs
            return frame
        hashes = {t.trial_hash for t in self.trials}
        return frame[frame["trial_hash"].isin(hashes)].reset_index(drop=True)


def run_sweep(sweep: str, options: SweepOptions | None = None) -> SweepResult:
    """Run every unfinished trial of the sweep named ``sweep`` (``sweeps/<sweep>.yaml``) and say
    how it ended; calling it again resumes.

    Raises:
        ConfigError: an unknown sweep, or a bad grid, recipe, dashboard or option;
            ``ValidationFailed`` lists every problem at once. Nothing was launched.
        TrackingError: the tracking store cannot be opened or trusted (nothing was launched).
        BackendUnavailable: the sweep's backend lacks its optional dependencies.
        ClusterLost: the sweep's Ray cluster was lost mid-sweep (the same call resumes).
        StoreLost: a trial's store could not record its failure (a full disk).
    """
    from pdmask.orchestration.runner import run_sweep as run_trials
    from pdmask.tracking import resolve_tracking_uri

    options = options or SweepOptions()
    reg = with_overrides(load_registry(), sweep, options.overrides)
    trials = plan(reg, sweep, options)
    planned = reg.sweep(sweep)
    outcome = run_trials(reg, planned, trials, options)
    uri = resolve_tracking_uri(options.tracking_uri)
    return SweepResult(sweep, uri, tuple(trials), outcome, search=planned.search is not None)


def runs(sweep: str | None = None, tracking_uri: str | None = None):
    """A pandas DataFrame with one row per MLflow run of ``sweep`` (every sweep's when None):
    identity (method, model, precision, delta, seed, backend, trial_hash, ...), status,
    attempts, start/end time and ``wall_s``, ``headline_final`` / ``headline_best`` (the headline
    metric: the figures' evaluation accuracy, averaged over datasets), then ``params.<name>`` as plain
    values. ``tracking_uri``: another store than the state folder's.

    Raises:
        ConfigError: an unknown sweep (with the closest known names).
        TrackingError: the store cannot be read or trusted.
    """
    from pdmask.tracking.results import runs as runs_frame

    return runs_frame(sweep, tracking_uri)


def history(sweep: str, metric: str | None = None, tracking_uri: str | None = None):
    """Every point of ``metric`` each run of ``sweep`` logged, as a long-format pandas
    DataFrame (one row per run and step): the run's identity (``run_id``, ``run_name``,
    ``method``, ``method_label``, ``model``, ``precision``, ``setting``, ``delta``, ``seed``,
    ``backend``, ``profile``, ``trial_hash``), then ``metric`` (the name as stored), ``step``,
    ``value``, ``timestamp`` (UTC). Raw, per step: no smoothing, no mean over datasets.

    ``metric``: a name as logged (``actor/entropy``; ``@`` or MLflow's ``_at_`` alike), or a
    pattern whose one ``*`` is a dataset; default the headline metric's pattern
    (``val-core/*/acc/mean_at_16``, one metric per dataset). ``tracking_uri``: another store
    than the state folder's. ``pdmask.history("smoke", "actor/entropy").pivot_table(
    index="step", columns="method", values="value")`` is entropy per step and method.

    Raises:
        ConfigError: an unknown sweep (with the closest names), a metric no run of the sweep
            logged (with the closest logged names), a pattern with more than one `*`.
        TrackingError: the store cannot be read or trusted.
    """
    from pdmask.tracking.history import history as history_frame
    from pdmask.tracking.metric_names import HEADLINE_PATTERN

    return history_frame(sweep, metric or HEADLINE_PATTERN, tracking_uri)


def plan(reg: Registry, sweep: str, options: SweepOptions) -> list[Trial]:
    """The sweep's trials after every check made before launch (``orchestration.preflight``):
    the grid, its recipes' code on synthetic batches, its dashboards, the Ray address.

    Raises:
        ValidationFailed: every problem at once (a ``ConfigError``), each naming file and field.
        BackendUnavailable: the sweep's backend lacks its optional dependencies.
    """
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
