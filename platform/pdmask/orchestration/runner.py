"""Run a sweep's unfinished trials, track them in MLflow, resume after any stop: the one runner.

Flow: open the invocation's session once (the tracking store, checked before anything launches,
its experiment, the interrupts) → the backend's launch kind runs the trials without a FINISHED
run: ``Launch.TUNE`` here (start or join Ray, Tune trains them, one CPU each, retries on
crashes), ``Launch.RAY_JOBS`` in ``ray_jobs.py`` (each trial a Ray job on a cluster) → the shared
tail: settle (final states read from MLflow; runs left RUNNING by an interrupt become KILLED and
resume next time, unless their jobs run on, detached) → summary → figures, drawn from this
sweep's own trials → exit code.

Exit codes: 0 all finished and drawn; 1 a trial failed or a figure could not be built; 2 a
trial's configuration was refused or its recipe raised (neither is retried: fix, then rerun);
``EXIT_INTERRUPTED`` (130) interrupted (SIGINT, SIGTERM, or trials left unfinished), resumable
by running the same command again.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from rich.console import Console

from pdmask.console import console as sweep_console
from pdmask.console import table
from pdmask.errors import ClusterLost, StoreLost
from pdmask.orchestration.options import SweepOptions
from pdmask.paths import state_dir, tune_results_dir
from pdmask.registry import Registry, Sweep, Trial
from pdmask.tracking import (
    TrialStatusIndex,
    ensure_experiment,
    open_client,
    provenance_tags,
    resolve_tracking_uri,
    runs_by_hash,
    sanitize_metric,
)
from pdmask.tracking.runs import FAILURE_KIND_TAG
from pdmask.tracking.store import redact


@dataclass
class SweepSession:
    """One invocation of a sweep, opened once, whatever its launch kind: its trials, where they
    are tracked, how it talks and how it is stopped, and when it began."""

    reg: Registry
    sweep: Sweep
    trials: list[Trial]
    options: SweepOptions
    client: Any
    uri: str
    experiment_id: str
    tags: dict[str, str]
    console: Console
    interrupts: Any  # interrupts.Interrupts: SIGINT, SIGTERM, SIGHUP end the sweep, resumable
    started: float  # time.monotonic() at the start, for the wall time


@dataclass
class SweepOutcome:
    finished: int
    failed: int
    skipped: int
    interrupted: int
    elsewhere: int = 0  # RUNNING under another live invocation's claim
    best: dict[str, Any] | None = None
    config_errors: int = 0  # FAILED because their configuration was refused (never retried)
    recipe_errors: int = 0  # FAILED because their recipe's code raised (never retried)
    lost_cluster: str | None = None  # why the sweep ended early: its Ray cluster was lost
    detached: int = 0  # RUNNING as Ray jobs that run on after this invocation (it attaches again)
    # what to say when the sweep was interrupted (a launch kind's own sentence)
    resume_note: str = "interrupted: run the same command again to resume"
    wall_s: float | None = None  # from the invocation's start to its trials' settling
    # the final headline metric of each setting over its seeds (summary.results_by_setting)
    results: list[dict[str, Any]] = field(default_factory=list)
    headline: list[str] = field(default_factory=list)  # the metrics it is the mean of
    failures: list[dict[str, str]] = field(default_factory=list)  # name and reason (summary.py)


def run_sweep(reg: Registry, sweep: Sweep, trials: list[Trial], options: SweepOptions) -> int:
    """Run ``trials`` (the expanded ``sweep``): 0 when every one finished, 1 when some failed or
    a figure could not be drawn, 2 when a trial's configuration was refused or its recipe raised,
    130 when interrupted (rerunning resumes). Callers: ``pdmask.api``, after
    ``preflight.checked_trials``. Raises ``ClusterLost`` (exit 1) after the summary when the
    sweep's Ray cluster was lost."""
    from pdmask.orchestration.driver_logs import routed
    from pdmask.orchestration.interrupts import EXIT_INTERRUPTED, handled
    from pdmask.registry.backends import Launch, backend_spec

    started = time.monotonic()
    console = sweep_console()  # off a terminal: lines as long as they are (CI logs, pipes)
    backend = backend_spec(trials[0].backend if trials else options.backend or sweep.backend)
    figures_failed = 0
    with handled() as interrupts, routed(sweep.name):  # library lines go to driver.log
        uri = resolve_tracking_uri(options.tracking_uri)
        client = open_client(uri)  # a bad store stops us here, before anything launches
        session = SweepSession(
            reg=reg,
            sweep=sweep,
            trials=trials,
            options=options,
            client=client,
            uri=uri,
            experiment_id=ensure_experiment(client, sweep.name, sweep.description),
            tags=provenance_tags(reg.root),
            console=console,
            interrupts=interrupts,
            started=started,
        )
        if backend.launch is Launch.RAY_JOBS:  # each trial a Ray Job on a cluster
            from pdmask.orchestration.jobs.job_loop import run_jobs

            outcome = run_jobs(session)
        else:
            outcome = run_tune(session)
        _summary(console, sweep, outcome, uri)
        if outcome.lost_cluster:
            raise ClusterLost(f"sweep stopped: {outcome.lost_cluster}")
        drawable = outcome.interrupted == 0 and not interrupts.requested
        if options.figures and sweep.figures and drawable:
            figures_failed = _build_figures(console, reg, sweep, uri, trials)
    if interrupts.requested or outcome.interrupted:
        console.print(outcome.resume_note)
        return EXIT_INTERRUPTED
    if outcome.config_errors or outcome.recipe_errors:
        return 2
    return 0 if outcome.failed == 0 and figures_failed == 0 else 1


def run_tune(session: SweepSession) -> SweepOutcome:
    """``Launch.TUNE``: the session's unfinished trials trained on Ray Tune (``execute``)."""
    outcome = execute(
        session.sweep,
        session.trials,
        client=session.client,
        uri=session.uri,
        experiment_id=session.experiment_id,
        tags=session.tags,
        address=session.options.address,
        max_concurrent=session.options.max_concurrent or session.sweep.max_concurrent,
        root=session.reg.root,
        console=session.console,
        interrupts=session.interrupts,
        started=session.started,
    )
    if outcome.lost_cluster:
        outcome.lost_cluster += (
            "; its trials are KILLED, not lost: run the same command again to resume them once "
            "the cluster is back"
        )
    return outcome


def unfinished(by_hash: dict, trials: list[Trial]) -> tuple[list[Trial], set[str]]:
    """Skip-finished, for every launch kind: the trials without a FINISHED run among ``by_hash``
    (``runs_by_hash``), in order, and the hashes of those with one."""
    done = TrialStatusIndex(by_hash).finished_hashes()
    return [t for t in trials if t.trial_hash not in done], done


def spread_by_model(trials: list[Trial]) -> list[Trial]:
    """``trials`` in launch order: one of each model in turn. Trials of one model share its warm
    start (the embedded backend's base model, built once under a lock): launched side by side,
    the first ones would wait for one build while the other cores idle; spread out, the first
    trials build different models at once (`main-figure` on 2 cores: ~170 core-seconds of lock
    waits gone)."""
    by_model: dict[str, list[Trial]] = {}
    for t in trials:
        by_model.setdefault(t.model, []).append(t)
    queues = list(by_model.values())
    out: list[Trial] = []
    for i in range(max(map(len, queues), default=0)):
        out += [q[i] for q in queues if i < len(q)]
    return out


def execute(
    sweep: Sweep,
    trials: list[Trial],
    *,
    client,
    uri: str,
    experiment_id: str,
    tags: dict[str, str],
    address: str | None,
    max_concurrent: int | None,
    root,
    console: Console,
    calibration_seconds: float | None = None,
    interrupts=None,
    started: float | None = None,
) -> SweepOutcome:
    """Train the unfinished ``trials`` on Ray Tune; their final states, read from MLflow.
    ``interrupts``: stop requests (SIGINT, SIGTERM) that end the sweep early, resumable;
    ``started``: when the invocation began (``time.monotonic``; default: now), for its wall time."""
    started = time.monotonic() if started is None else started
    from ray import tune

    from pdmask.orchestration.driver_logs import reroute

    reroute()  # importing Ray gave its logger a console handler (driver_logs.py)

    from pdmask.backends.interface import load_backend
    from pdmask.orchestration.cluster.watch import ClusterWatch
    from pdmask.orchestration.interrupts import Interrupts, StopOnRequest
    from pdmask.orchestration.cluster.local_ray import connect, reap_embedded
    from pdmask.orchestration.tune.progress import Phase, SweepProgress
    from pdmask.orchestration.tune.storage import check_writable, quiet_storage_logs
    from pdmask.orchestration.tune.trainable import run_trial, trial_bounds
    from pdmask.orchestration.trial_logs import tune_dirnames

    by_hash = runs_by_hash(client, experiment_id)
    grid_todo, done = unfinished(by_hash, trials)
    # the headline metric: the mean of the backend's evaluation metrics (summary.py)
    headline = load_backend(trials[0].backend).eval_metrics(sweep.cluster) if trials else []
    if sweep.search is not None:
        todo_count = max(sweep.search.budget - len(done), 0)
        todo = trials[:1] if todo_count else []
        skipped = len(done)
    else:
        todo = grid_todo
        todo_count, skipped = len(todo), len(trials) - len(todo)
    console.print(
        f"sweep {sweep.name}: {len(trials) if sweep.search is None else sweep.search.budget} trials, "
        f"{skipped} already finished, {todo_count} to run (tracking: {redact(uri)})"
    )
    if not todo:
        outcome = SweepOutcome(0, 0, skipped, 0, best=_best(client, experiment_id, sweep))
        runs = [r for h, rs in by_hash.items() if h in done for r in rs]
        return _concluded(outcome, runs, headline, started)
    interrupts = interrupts or Interrupts()
    if interrupts.requested:  # stopped while the store was checked: start nothing
        return settle(
            client, experiment_id, sweep, trials, skipped, console, headline, started=started
        )

    env = {"PDM_PROJECT": str(root), "PDM_HOME": str(state_dir()), "MLFLOW_TRACKING_URI": uri}
    where = (
        ("connecting to the Ray cluster", "connected")
        if address
        else ("starting Ray", "Ray started")
    )
    with Phase(console, *where):
        started_ray = connect(address, env)
    reroute()
    quiet_storage_logs()
    interrupts.install()  # Ray's driver took SIGTERM over
    # The tracking URI reaches the trials through their environment only: Tune writes its
    # config to disk and a URI may hold a password.
    backend = load_backend(todo[0].backend)  # one backend per sweep (Registry.expand)
    static = {
        "experiment_id": experiment_id,
        "tags": tags,
        "project_root": str(root),
        # The spec travels with the trials: a backend registered in this process only is
        # still found in the workers.
        "backend": backend.spec,
        "eval_metric": backend.eval_metrics(sweep.cluster)[0],
        "calibration_seconds": calibration_seconds,
        "watchdog": asdict(trial_bounds()),
    }
    # the queued trials' names (a search's points are sampled as it goes: none known upfront)
    names = {t.trial_hash: t.run_name() for t in todo} if sweep.search is None else {}
    if sweep.search is not None:
        space, searcher = _search_space(sweep, client, experiment_id)
        reroute()  # importing Optuna gave its logger a console handler
        static["objective"] = sanitize_metric(sweep.search.metric)  # as logged
        param_space = {"trial": todo[0].model_dump(mode="json"), "search": space, **static}
        tune_config = tune.TuneConfig(
            search_alg=searcher,
            num_samples=todo_count,
            max_concurrent_trials=max_concurrent or 2,
            reuse_actors=True,
        )
    else:
        param_space = {
            "trial": tune.grid_search([t.model_dump(mode="json") for t in spread_by_model(todo)]),
            **static,
        }
        # Reused actors keep torch, MLflow and the registry imported between trials.
        tune_config = tune.TuneConfig(
            max_concurrent_trials=max_concurrent or (os.cpu_count() or 2), reuse_actors=True
        )
    tune_config.trial_dirname_creator = tune_dirnames()  # Tune's trial folders: the run names

    def failure_of(config: dict) -> str | None:  # why a trial's attempt failed, from its run
        from pdmask.orchestration.tune.trainable import trial_from_config
        from pdmask.tracking.runs import attempt_failure, find_trial_runs, take_watchdog_reason

        try:
            runs = find_trial_runs(client, experiment_id, trial_from_config(config).trial_hash)
        except Exception:  # the progress line only loses its detail; the run keeps the reason
            return None
        if not runs:
            return None
        stalled = take_watchdog_reason(client, runs[0].info.run_id)
        crashed = None if stalled else attempt_failure(runs[0])
        return stalled or (crashed and f"crashed: {crashed}")

    import ray

    cpus = int(ray.cluster_resources().get("CPU", 1))  # one CPU per trial
    first_step = Phase(
        console,
        f"starting {todo_count} trials (workers start, base models are loaded or built)",
        "first training step reported",
    )
    progress = SweepProgress(
        names,
        console,
        failure_of,
        on_store_lost=interrupts.event.set,
        sweep=sweep.name,
        total=todo_count,
        slots=min(tune_config.max_concurrent_trials or cpus, cpus),
        started=started,
        first_step=first_step,
    )
    tuner = tune.Tuner(
        tune.with_resources(run_trial, {"cpu": 1}),
        param_space=param_space,
        tune_config=tune_config,
        run_config=tune.RunConfig(
            name=f"{sweep.name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}",  # unique per invocation
            storage_path=str(tune_results_dir()),  # in the state folder, not ~/ray_results
            failure_config=tune.FailureConfig(max_failures=sweep.retries),
            callbacks=[progress, ClusterWatch()],
            stop=StopOnRequest(interrupts),
            verbose=0,
        ),
    )
    lost = None
    try:
        if not interrupts.requested:  # a stop requested while Ray started: launch nothing
            tuner.fit()
    except KeyboardInterrupt:  # only without pdmask's handlers (a library caller)
        console.print("interrupted: stopping trials (they resume from their checkpoints next time)")
    except Exception as err:
        lost = _cluster_lost(err)
        # A store lost with its state folder takes Ray's session folder too: StoreLost says it.
        if lost is None and progress.store_lost is None:
            check_writable(state_dir())  # a full or vanished disk is the cause Tune cannot name
            raise
    finally:
        progress.close()
        if started_ray:
            import ray

            ray.shutdown()
    if progress.store_lost is not None:  # settling would fail on the same store
        raise StoreLost(progress.store_lost)
    if lost is not None and started_ray:
        reap_embedded()  # its orphaned trials must stop before their runs are settled
    outcome = settle(client, experiment_id, sweep, trials, skipped, console, headline, started)
    outcome.lost_cluster = lost
    return outcome


def _cluster_lost(err: BaseException | None) -> str | None:
    """The reason of a ``ClusterLost`` raised by the cluster watch, however Tune wrapped it."""
    while err is not None:
        if isinstance(err, ClusterLost):
            return str(err)
        err = err.__cause__ or err.__context__
    return None


def settle(
    client, experiment_id, sweep, trials, skipped, console, headline=(), started=None, detached=()
) -> SweepOutcome:
    """Final states from MLflow; runs left RUNNING by an interrupt become KILLED (resumable),
    but those of the trials in ``detached`` (their Ray jobs run on: the same command attaches);
    with the results (``headline``: the metrics the headline metric is the mean of) and
    failures of the runs read, and the wall time since ``started`` (``time.monotonic``).

    A trial not FINISHED in the snapshot is re-read under its claim: another invocation may be
    finishing it right now, and its state must never be overwritten from a stale snapshot.
    """
    from pdmask.orchestration.claims import Claim
    from pdmask.tracking.runs import find_trial_runs, with_retry

    by_hash = runs_by_hash(client, experiment_id)
    finished = failed = interrupted = elsewhere = config_errors = recipe_errors = 0
    running_on = 0  # detached jobs
    hashes = list(by_hash) if sweep.search is not None else [t.trial_hash for t in trials]
    read = []  # each trial's runs as last read
    for h in hashes:
        statuses = {r.info.status for r in by_hash.get(h, [])}
        if "FINISHED" in statuses:
            finished += 1
            read += [r for r in by_hash[h] if r.info.status == "FINISHED"]  # not a past failure
            continue
        if h in detached:  # its job runs on the cluster: its run is not ours to end
            read += by_hash.get(h, [])
            running_on += 1
            continue
        with Claim(h, wait=0, holder=experiment_id) as ours:
            runs = find_trial_runs(client, experiment_id, h) if ours else by_hash.get(h, [])
            read += runs
            statuses = {r.info.status for r in runs}
            if "FINISHED" in statuses:
                finished += 1
            elif any(r.data.tags.get(FAILURE_KIND_TAG) == "config" for r in runs):
                config_errors += 1
            elif any(r.data.tags.get(FAILURE_KIND_TAG) == "recipe" for r in runs):
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
        skipped,
        interrupted,
        elsewhere=elsewhere,
        best=_best(client, experiment_id, sweep),
        config_errors=config_errors,
        recipe_errors=recipe_errors,
        detached=running_on,
    )
    return _concluded(outcome, read, list(headline), started)


def _concluded(outcome: SweepOutcome, runs: list, headline: list[str], started) -> SweepOutcome:
    """``outcome`` with what the summary shows besides counts, from the trials' ``runs``."""
    from pdmask.orchestration.summary import failures, results_by_setting

    outcome.headline = headline
    outcome.results = results_by_setting(runs, headline) if headline else []
    outcome.failures = failures(runs)
    outcome.wall_s = None if started is None else time.monotonic() - started
    return outcome


def _search_space(sweep: Sweep, client, experiment_id: str):
    """Tune search space and an Optuna searcher warm-started with the finished trials' results."""
    from ray import tune
    from ray.tune.search.optuna import OptunaSearch

    space = {}
    for axis, dim in sweep.search.space.items():
        if dim.choices is not None:
            space[axis] = tune.choice(dim.choices)
        else:
            space[axis] = (tune.loguniform if dim.log else tune.uniform)(dim.low, dim.high)
    points, rewards = [], []
    for runs in runs_by_hash(client, experiment_id).values():
        for r in runs:
            value = r.data.metrics.get(sanitize_metric(sweep.search.metric))
            if r.info.status == "FINISHED" and value is not None:
                trial = json.loads(r.data.tags.get("pdm.search_point", "{}") or "{}")
                if set(trial) == set(space):
                    points.append({"search": trial})
                    rewards.append(value)
    searcher = OptunaSearch(
        metric="pdm_objective",
        mode=sweep.search.mode,
        seed=0,
        points_to_evaluate=points or None,
        evaluated_rewards=rewards or None,
    )
    return space, searcher


def _best(client, experiment_id: str, sweep: Sweep) -> dict[str, Any] | None:
    if sweep.search is None:
        return None
    key = sanitize_metric(sweep.search.metric)
    best = None
    for runs in runs_by_hash(client, experiment_id).values():
        for r in runs:
            value = r.data.metrics.get(key)
            if r.info.status != "FINISHED" or value is None:
                continue
            better = best is None or (
                value > best["value"] if sweep.search.mode == "max" else value < best["value"]
            )
            if better:
                best = {
                    "value": value,
                    "run_id": r.info.run_id,
                    "run_name": r.data.tags.get("mlflow.runName"),
                    "delta": r.data.tags.get("pdm.delta"),
                    "trial_hash": r.data.tags.get("pdm.trial_hash"),
                }
    return best


def _summary(console: Console, sweep: Sweep, out: SweepOutcome, uri: str) -> None:
    """Counts and wall time; each setting's final headline metric, mean ± sd over its seeds;
    one line per failed trial with its reason; the best trial of a search."""
    from rich.markup import escape

    from pdmask.orchestration.progress_view import duration, headline_label
    from pdmask.orchestration.summary import format_mean_sd

    rows = [
        ["finished now", out.finished],
        ["already finished (skipped)", out.skipped],
        ["failed", out.failed],
        ["configuration refused (fix it; never retried)", out.config_errors],
        ["recipe error (fix the recipe file; never retried)", out.recipe_errors],
        ["interrupted (resume: run again)", out.interrupted],
        ["running in another invocation", out.elsewhere],
        ["running on as Ray jobs (detached: the same command attaches)", out.detached],
    ]
    wall = "" if out.wall_s is None else f", wall time {duration(out.wall_s)}"
    console.print(table(f"sweep {sweep.name}: summary{wall}", ["", "trials"], rows))
    if out.results:
        body = [[r["setting"], r["n"], format_mean_sd(r["mean"], r["sd"])] for r in out.results]
        label = headline_label(out.headline)
        title = f"final {label} per setting, mean ± sd over seeds"
        console.print(table(title, ["setting", "n", "mean ± sd"], body))
        console.print(f"{label}: the mean of {', '.join(out.headline)} at the last step")
    for f in out.failures:
        console.print(
            f"[red]failed[/red] {escape(f['name'])}: {escape(f['reason'])} "
            f"(its log: `pdm logs {escape(f['name'])}`)"
        )
    if out.best:
        console.print(
            f"best trial: {out.best['run_name']} ({sweep.search.metric} = {out.best['value']:.4f}, "
            f"delta = {out.best['delta']}, run {out.best['run_id']})"
        )
    console.print(f"runs: {redact(uri)} (experiment {sweep.name}); inspect with `pdm ui`")
    console.print(f"trial logs: {trial_logs_dir(sweep.name)} (`pdm logs RUN` prints one)")


def trial_logs_dir(sweep: str):
    """The folder of ``sweep``'s trial logs (``trial_logs.log_path``)."""
    from pdmask.orchestration.trial_logs import log_path

    return log_path(sweep, "RUN").parent


def _build_figures(
    console: Console, reg: Registry, sweep: Sweep, uri: str, trials: list[Trial]
) -> int:
    """Draw the sweep's figures from its own trials (this profile's, not another's that share
    the experiment); returns how many failed."""
    from pdmask.figures import build_figure
    from pdmask.figures.styles import MethodStyle

    styles = {name: MethodStyle(r.display_name, r.color) for name, r in reg.recipes.items()}
    # A search's trials are sampled points, unknown upfront: its figures read every run.
    hashes = {t.trial_hash for t in trials} if sweep.search is None else None
    failed = 0
    for name in sweep.figures:
        try:
            result = build_figure(
                name, sweep=sweep.name, tracking_uri=uri, styles=styles, trial_hashes=hashes
            )
        except Exception as err:  # a figure problem must not hide that the training finished
            console.print(
                f"[red]figure {name} failed: {type(err).__name__}: {redact(str(err))}[/red]"
            )
            failed += 1
            continue
        console.print(f"figure {name}: {result.paths.get('png')}")
    return failed
