"""``Launch.TUNE``: the session's unfinished trials trained by Ray Tune, one CPU each.

Ray is started here (an embedded instance private to the sweep, ``cluster.local_ray``) or joined
(``--address``); every trial runs ``trainable.run_trial`` in a reused Tune actor, which claims the
trial, opens its MLflow run, trains under the watchdog and closes the run. Tune retries a crashed
attempt ``sweep.retries`` times; a deterministic failure (a configuration or recipe error, an
import error, a crash alike an earlier attempt's: ``tracking.runs.FailureKind``) is never retried
(the worker reports it instead of raising). The progress display (``progress.SweepProgress``)
and the cluster watch (``cluster.watch.ClusterWatch``) are Tune callbacks. A grid's trials are
handed to Tune one at a time as the session's gate admits them (``gated_grid.py``: every
setting's canary first, one model at a time in turn, its other trials once the canary reported
its first training step and a validation, none of a setting a deterministic failure stopped); a
search samples its points with Optuna as it goes (``search.py``).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import asdict
from typing import Any

from ray.tune import Stopper

from pdmask.errors import ClusterLost, StoreLost
from pdmask.orchestration.interrupts import Interrupts
from pdmask.orchestration.launcher import Launched
from pdmask.orchestration.session import SweepSession, Todo
from pdmask.paths import state_dir, tune_results_dir

LOST_NOTE = (
    "; its trials are KILLED, not lost: run the same command again to resume them once the "
    "cluster is back"
)


class StopOnRequest(Stopper):
    """A Tune stopper: stops every trial once a stop was requested."""

    def __init__(self, interrupts: Interrupts):
        self.event = interrupts.event

    def __getstate__(self):
        # Tune pickles its run config; an event holds a lock (the stopper only runs here).
        return {}

    def __setstate__(self, state):
        self.event = threading.Event()

    def __call__(self, trial_id, result) -> bool:
        return self.event.is_set()

    def stop_all(self) -> bool:
        return self.event.is_set()


class TuneLauncher:
    """The ``Launcher`` of ``Launch.TUNE``. ``calibration_seconds``: every trial burns that much
    CPU instead of training (``calibration.py``; ``benchmarks/bench_sweep.py``)."""

    def __init__(self, calibration_seconds: float | None = None):
        self.calibration_seconds = calibration_seconds

    def check(self, session: SweepSession) -> None:
        """Nothing beyond the plan's checks: every setting Tune reads was checked there."""

    def launch(self, session: SweepSession, todo: Todo) -> Launched:
        from pdmask.orchestration.cluster.local_ray import connect, reap_embedded
        from pdmask.orchestration.driver_logs import reroute
        from pdmask.orchestration.tune.progress import Phase
        from pdmask.orchestration.tune.storage import check_writable, quiet_storage_logs

        reroute()  # importing Ray gave its logger a console handler (driver_logs.py)
        address, interrupts = session.options.address, session.interrupts
        env = {
            "PDM_PROJECT": str(session.reg.root),
            "PDM_HOME": str(state_dir()),
            "MLFLOW_TRACKING_URI": session.uri,
        }
        where = (
            ("connecting to the Ray cluster", "connected")
            if address
            else ("starting Ray", "Ray started")
        )
        with Phase(session.console, *where):
            started_ray = connect(address, env)
        reroute()
        quiet_storage_logs()
        interrupts.install()  # Ray's driver took SIGTERM over
        tuner, progress = self._tuner(session, todo)
        lost = None
        try:
            if not interrupts.requested:  # a stop requested while Ray started: launch nothing
                tuner.fit()
        except KeyboardInterrupt:  # only without pdmask's handlers (a library caller)
            session.console.print(
                "interrupted: stopping trials (they resume from their checkpoints next time)"
            )
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
        return Launched(
            lost_cluster=lost and lost + LOST_NOTE, trained_elsewhere=progress.trained_elsewhere()
        )

    def _tuner(self, session: SweepSession, todo: Todo):
        """The Tuner of the session's ``todo`` and its progress display."""
        import ray
        from ray import tune

        from pdmask.orchestration.cluster.watch import ClusterWatch
        from pdmask.orchestration.trial_prices import planned
        from pdmask.orchestration.tune.progress import Phase, SweepProgress
        from pdmask.orchestration.tune.trainable import run_trial
        from pdmask.orchestration.tune.trial_config import tune_dirnames

        sweep = session.sweep
        param_space, tune_config = self._space(session, todo)
        tune_config.trial_dirname_creator = tune_dirnames()  # Tune's trial folders: run names
        # the queued trials' names (a search's points are sampled as it goes: none known upfront)
        grid = session.gate.order if sweep.search is None else []
        names = {t.trial_hash: t.run_name() for t in grid}
        plans = planned(grid, session.planned_steps, cluster=session.cluster)
        cpus = int(ray.cluster_resources().get("CPU", 1))  # one CPU per trial
        first_step = Phase(
            session.console,
            f"starting {todo.count} trials (workers start, base models are loaded or built)",
            "first training step reported",
        )
        progress = SweepProgress(
            names,
            session.console,
            _failure_reader(session),
            on_store_lost=session.interrupts.event.set,
            sweep=sweep.name,
            total=todo.count,
            slots=min(tune_config.max_concurrent_trials or cpus, cpus),
            plans=plans,
            started=session.started,
            first_step=first_step,
        )
        session.gate.on_stop.append(progress.drop)  # a stopped setting's trials never start
        tuner = tune.Tuner(
            tune.with_resources(run_trial, {"cpu": 1}),
            param_space=param_space,
            tune_config=tune_config,
            run_config=tune.RunConfig(
                # unique per invocation
                name=f"{sweep.name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}",
                storage_path=str(tune_results_dir()),  # in the state folder, not ~/ray_results
                failure_config=tune.FailureConfig(max_failures=sweep.retries),
                callbacks=[progress, ClusterWatch()],
                stop=StopOnRequest(session.interrupts),
                verbose=0,
            ),
        )
        return tuner, progress

    def _space(self, session: SweepSession, todo: Todo):
        """Tune's param space and config: the grid's trials, or a search's template and space.
        The tracking URI reaches the trials through their environment only: Tune writes its
        config to disk and a URI may hold a password."""
        from ray import tune

        from pdmask.backends.interface import load_backend
        from pdmask.orchestration.driver_logs import reroute
        from pdmask.orchestration.tune.deaths import SINCE_KEY, launched_at
        from pdmask.orchestration.tune.gated_grid import GatedGrid
        from pdmask.orchestration.tune.search import search_space
        from pdmask.orchestration.tune.trainable import trial_bounds
        from pdmask.tracking import sanitize_metric

        sweep = session.sweep
        backend = load_backend(session.backend)  # one backend per sweep (Registry.expand)
        static: dict[str, Any] = {
            "experiment_id": session.experiment_id,
            "tags": session.tags,
            "project_root": str(session.reg.root),
            # The spec travels with the trials: a backend registered in this process only is
            # still found in the workers.
            "backend": backend.spec,
            "eval_metric": backend.eval_metrics(session.cluster)[0],
            "cluster": session.cluster,  # what a complete run holds (tracking/completeness.py)
            SINCE_KEY: launched_at(),  # a death repeated since is not retried again (deaths.py)
            "calibration_seconds": self.calibration_seconds,
            "watchdog": asdict(trial_bounds()),
        }
        if sweep.search is not None:
            space, searcher = search_space(sweep, session.client, session.experiment_id)
            reroute()  # importing Optuna gave its logger a console handler
            static["objective"] = sanitize_metric(sweep.search.metric)  # as logged
            param_space = {"trial": todo.trials[0].model_dump(mode="json"), "search": space}
            return {**param_space, **static}, tune.TuneConfig(
                search_alg=searcher,
                num_samples=todo.count,
                max_concurrent_trials=session.max_concurrent or 2,
                reuse_actors=True,
            )
        # Reused actors keep torch, MLflow and the registry imported between trials.
        return static, tune.TuneConfig(
            search_alg=GatedGrid(session.gate),
            num_samples=todo.count,
            max_concurrent_trials=session.max_concurrent or (os.cpu_count() or 2),
            reuse_actors=True,
        )


def _failure_reader(session: SweepSession):
    """``(why, given_up)`` of a Tune trial's failed attempt, from its run (the progress line's
    detail): the watchdog's or the trial's own account, else a worker death, recorded first
    (``deaths.DeathRecorder``); given_up: a death alike an earlier one, not retried again."""
    from pdmask.orchestration.tune.deaths import DeathRecorder, error_text
    from pdmask.orchestration.tune.trial_config import trial_from_config
    from pdmask.tracking.runs import attempt_failure, find_trial_runs, take_watchdog_reason

    client, experiment_id = session.client, session.experiment_id
    deaths = DeathRecorder(client, experiment_id, lambda: session.interrupts.requested)

    def failure_of(trial, final: bool) -> tuple[str | None, bool]:
        try:
            trial_hash = trial_from_config(trial.config).trial_hash
            runs = find_trial_runs(client, experiment_id, trial_hash)
            if not runs:
                return None, False
            stalled = take_watchdog_reason(client, runs[0].info.run_id)
            crashed = None if stalled else attempt_failure(runs[0])
            if stalled or crashed:
                return stalled or f"crashed: {crashed}", False
            return deaths.record(trial_hash, error_text(trial), final)
        except Exception:  # the progress line only loses its detail; the run keeps the reason
            return None, False

    return failure_of


def _cluster_lost(err: BaseException | None) -> str | None:
    """The reason of a ``ClusterLost`` raised by the cluster watch, however Tune wrapped it."""
    while err is not None:
        if isinstance(err, ClusterLost):
            return str(err)
        err = err.__cause__ or err.__context__
    return None
