"""What runs inside a Ray worker for one trial: claim it, open its MLflow run, train, close the run.

Outcomes reported to Tune (``pdm_outcome``): ``finished``, ``already-done`` (a FINISHED run exists),
``claimed-elsewhere`` (another live invocation trains it), ``config-error`` (never retried: the
run is FAILED with the reason and ``pdm.failure_kind=config``), ``recipe-error`` (likewise),
``deterministic-error`` (an import error, an engine refusal, or a crash alike an earlier
attempt's: ``tracking.runs.FailureKind``; never retried; also an attempt that gives up at once
because its worker died twice alike in this invocation: ``deaths.py``), ``stalled`` (the trial
stalled more than ``STALL_RETRIES`` times: not retried again), ``store-unwritable`` (it crashed
and its store could not record why either: a full disk, a deleted state folder; not retried, the
sweep ends with ``environment_error``'s line). Everything after the run is open, the backend's
own config included, runs inside that error handling. A crash (exception, NaN loss) is recorded
on the run and re-raised so Tune retries it, and so is a run that is not complete when training
returns (``tracking/completeness.py``); a killed process is recorded by the sweep
(``deaths.py``), or else by the next attempt, which resumes from the trial's checkpoint if that
checkpoint belongs to the same run (``workdirs.py``).

Each attempt trains under pdmask's watchdog (``pdmask/watchdog.py``), beaten at every reported
step: a trial that stops reporting steps (a recipe stuck in a loop, a deadlock, a hung store) is
failed with ``pdm.failure_kind=stall`` and its process ended, and Tune retries it like a crash.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from functools import partial
from typing import Any

from pdmask.errors import ConfigError, RecipeError, environment_error
from pdmask.orchestration.trial_logs import captured, header, log_path, upload
from pdmask.orchestration.tune.search import OBJECTIVE, SEARCH_POINT_TAG
from pdmask.orchestration.tune.trial_config import trial_from_config
from pdmask.registry import Trial
from pdmask.tracking.evaluation_line import evaluation_line
from pdmask.tracking.runs import FailureKind, exception_kind
from pdmask.watchdog import WATCHDOG_TAG, Bounds, Watchdog, end_process

# A Tune trial's watchdog bounds (PDM_STALL_SECONDS / PDM_STARTUP_SECONDS override the first two):
# the embedded backend's steps take seconds and its start-up (model build, warm start under a
# lock shared with the other trials) a minute or two on a laptop; a backend with slower steps
# is covered by STALL_STEPS, which scales the bound with the longest step interval seen.
STARTUP_SECONDS = 900.0
STALL_SECONDS = 120.0
STALL_STEPS = 10.0
STALL_RETRIES = 1  # a trial that stalls again after its retry is FAILED for good
STALLS_TAG = "pdm.stalls"


def trial_bounds(env=None) -> Bounds:
    """The watchdog bounds of a Tune trial: the defaults above, or the site's (``site_bounds``)."""
    from pdmask.watchdog import site_bounds

    stall, startup = site_bounds(env)
    return Bounds(
        startup_seconds=startup or STARTUP_SECONDS,
        stall_seconds=stall or STALL_SECONDS,
        poll_seconds=min(10.0, (stall or STALL_SECONDS) / 4),
        stall_steps=STALL_STEPS,
    )


def run_trial(config: dict[str, Any]) -> None:
    """Tune function trainable."""
    from ray import tune

    from pdmask.orchestration.tune.storage import quiet_storage_logs

    quiet_storage_logs()  # this worker's checkpoint syncs, like the driver's (storage.py)

    from pdmask.backends.interface import planned_steps
    from pdmask.tracking import TrialRun, open_client
    from pdmask.tracking.store import resolve_tracking_uri

    trial = trial_from_config(config)
    base = {"pdm_trial_hash": trial.trial_hash, "pdm_total_steps": 0}
    # The store comes with the worker's environment (never in the Tune config, which Tune
    # writes to disk): a URI may hold a password. The driver checked it before launching.
    uri = resolve_tracking_uri(None)
    client = open_client(uri, integrity=False)
    claim, waited_for = _claim(trial.trial_hash, config["experiment_id"], client, base)
    if claim is None:
        tune.report({**base, "pdm_outcome": "claimed-elsewhere"})
        return
    try:
        tags = dict(config["tags"])
        if config.get("search"):  # lets a later invocation warm-start the search with this point
            tags[SEARCH_POINT_TAG] = json.dumps(config["search"], sort_keys=True)
        gave_up = _given_up(client, config, trial)
        if gave_up:  # its worker died twice alike in this invocation (``deaths.py``)
            tune.report({**base, "pdm_outcome": "deterministic-error", "pdm_error": gave_up})
            return
        run = TrialRun.start_or_resume(
            client,
            config["experiment_id"],
            trial,
            tags,
            steps=planned_steps(trial, config.get("backend")),
        )
        if run is None:
            tune.report({**base, "pdm_outcome": "already-done"})
            return
        log = log_path(trial.sweep, trial.run_name(), trial.trial_hash)
        first = header(trial.run_name(), trial.trial_hash, run.run_id, run.attempt)
        try:
            with captured(log, first):
                report = _attempt(config, trial, run, base, uri, waited_for)
        finally:  # finished or failed, the attempt's log goes with its run
            upload(client, run.run_id, log)
        tune.report(report)  # after the run is FINISHED: a stop arriving now cannot touch it
    finally:
        claim.release()


def _attempt(
    config: dict[str, Any], trial: Trial, run, base: dict[str, Any], uri: str, waited_for
) -> dict[str, Any]:
    """One attempt at the trial's open ``run``: its final report to Tune. A crash is recorded on
    the run and re-raised (Tune retries it)."""
    from pdmask.tracking.store import redact

    if waited_for:
        run.note(f"waited for sweep {waited_for}, which trained the same trial first")
    stalls = _stalls(run.client, run.run_id) if run.resumed else 0
    if stalls > STALL_RETRIES:
        reason = (
            f"stalled {stalls} times (each attempt's reason is in pdm.failures): not retried again"
        )
        run.fail(reason, final=True, kind=FailureKind.STALL)
        return {**base, "pdm_outcome": "stalled", "pdm_error": reason}
    try:
        return _train(config, trial, run, base, redact(uri))
    except ConfigError as err:  # never retried: the same input fails the same way
        # A bug in the recipe's file is the recipe's, not the sweep's configuration.
        kind = FailureKind.RECIPE if isinstance(err, RecipeError) else FailureKind.CONFIG
        label = {"recipe": "recipe error", "config": "configuration error"}[kind]
        print(f"{label}: {err}", file=sys.stderr)  # the trial's log says it too
        run.fail(f"{label}: {err}", final=True, kind=kind)
        return {**base, "pdm_outcome": f"{kind}-error", "pdm_error": str(err)[:500]}
    except (KeyboardInterrupt, SystemExit):
        # Tune stopping the trial (it raises SystemExit inside tune.report): the trial is
        # resumable, not failed.
        run.interrupted()
        raise
    except BaseException as err:
        reason = f"{type(err).__name__}: {err}".strip()
        traceback.print_exception(err)  # into the trial's log (Ray's own copy is unnamed)
        try:
            kind = run.fail(
                reason + "\n" + "".join(traceback.format_exception(err))[-1500:],
                kind=exception_kind(reason.splitlines()[0]),
            )
        except Exception as unrecorded:
            line = environment_error(unrecorded)
            if line is None:
                raise
            # Every retry would crash on the same store: the driver ends the sweep instead.
            line = f"tracking store {redact(uri)}: {line}"  # as open_client says it
            return {**base, "pdm_outcome": "store-unwritable", "pdm_error": line}
        if kind.deterministic:  # it would fail the same way again: Tune must not retry it
            print(f"not retried ({kind}): {reason.splitlines()[0]}", file=sys.stderr)
            return {**base, "pdm_outcome": "deterministic-error", "pdm_error": reason[:500]}
        raise


def _given_up(client, config: dict[str, Any], trial: Trial) -> str | None:
    """Why this attempt must not train: its run's last failure, in this invocation, was a worker
    death alike an earlier one (``deaths.given_up``); None otherwise."""
    from pdmask.orchestration.tune.deaths import SINCE_KEY, given_up
    from pdmask.tracking.runs import find_trial_runs

    if SINCE_KEY not in config:
        return None
    runs = find_trial_runs(client, config["experiment_id"], trial.trial_hash)
    return given_up(runs[0], config[SINCE_KEY]) if runs else None


WAIT_POLL_S = 2.0  # how often a trial waiting for another sweep's claim looks again


def _claim(trial_hash: str, experiment_id: str, client, base: dict[str, Any]):
    """``(claim, waited_for)``: the trial's claim, taken, or None when another invocation of
    this same sweep holds it (it trains the trial into this experiment). When the holder is
    another sweep (another experiment) this waits for it, reporting to Tune, since both need a
    run of the trial and its checkpoint folder is one; ``waited_for`` names that sweep."""
    from ray import tune

    from pdmask.orchestration.claims import Claim, claim_holder

    waited_for = None
    while True:
        claim = Claim(trial_hash, holder=experiment_id)
        if claim.take():
            return claim, waited_for
        other = claim_holder(trial_hash)
        if other in (None, experiment_id):
            return None, waited_for
        if waited_for is None:
            try:
                waited_for = client.get_experiment(other).name
            except Exception:  # a holder's experiment this store does not know: its id then
                waited_for = f"experiment {other}"
        # a stop request (SIGINT) arrives as SystemExit from tune.report: the wait ends with it
        tune.report({**base, "pdm_waiting_for": waited_for})
        time.sleep(WAIT_POLL_S)


def _train(
    config: dict[str, Any], trial: Trial, run, base: dict[str, Any], where: str
) -> dict[str, Any]:
    """Train ``trial`` into its open ``run``, reporting to Tune; finishes the run and returns
    the final report."""
    from ray import tune

    from pdmask.backends.interface import load_backend
    from pdmask.orchestration.tune.calibration import STEPS as CALIBRATION_STEPS
    from pdmask.orchestration.workdirs import bind_workdir
    from pdmask.tracking.completeness import Plan, require_complete

    runtime = load_backend(config.get("backend") or trial.backend)
    calibration = config.get("calibration_seconds")
    plan = (
        Plan(CALIBRATION_STEPS)
        if calibration
        else Plan.of(runtime.planned_steps(trial), runtime.eval_metrics(config["cluster"]))
    )
    base["pdm_total_steps"] = plan.last_step or 0
    workdir, discarded = bind_workdir(trial.trial_hash, run.run_id, where)
    if discarded:
        run.note("checkpoint of another run discarded (that run is lost): trained from scratch")
    (workdir / "pid").write_text(str(os.getpid()))
    objective = config.get("objective")
    latest: dict[str, float] = {}
    evaluated = [time.monotonic(), None]  # when and at which step the last evaluation was

    def reporter(step: int, metrics: dict[str, float]) -> None:
        if dog is not None:
            dog.beat(f"step {step}")
        run.log(step, metrics)
        latest.update(metrics)
        now, since = time.monotonic(), evaluated[1]
        rate = (now - evaluated[0]) / (step - since) if since is not None and step > since else None
        headlines = [config["eval_metric"]] if config.get("eval_metric") else []
        line = evaluation_line(step, base["pdm_total_steps"], metrics, headlines, rate)
        if line is not None:  # into the trial's log (this process's stdout): ``pdm logs -f``
            print(line, flush=True)
            evaluated[:] = [now, step]
        report = {**base, "pdm_step": step, "pdm_attempt": run.attempt}
        if config.get("eval_metric") in latest:
            report["pdm_eval"] = latest[config["eval_metric"]]
        if objective and objective in latest:
            report[OBJECTIVE] = latest[objective]
        tune.report(report)

    recipe = trial.recipe()  # the source planned with the sweep, never re-read
    backend = runtime.train
    if calibration:  # benchmarks/bench_sweep.py: known, fixed compute
        from pdmask.orchestration.tune.calibration import busy_trial

        backend = partial(busy_trial, seconds=calibration)
    bounds = Bounds(**config["watchdog"]) if config.get("watchdog") else None
    log = log_path(trial.sweep, trial.run_name(), trial.trial_hash)
    dog = Watchdog(bounds, partial(_end_stalled, run, log)).start() if bounds else None

    def note(line: str) -> None:  # the trial log (stderr goes there) and the run's record
        print(f"pdmask: {line}", file=sys.stderr, flush=True)
        run.note(line)

    try:
        summary = backend(
            trial, recipe, reporter=reporter, workdir=workdir, should_stop=lambda: False, note=note
        )
    finally:
        if dog is not None:
            dog.stop()
    require_complete(run.client, run.run_id, plan)  # IncompleteRun: a failed attempt
    run.finish(summary)
    final = {**base, "pdm_outcome": "finished", "pdm_step": run.last_step}
    if objective and objective in latest:
        final[OBJECTIVE] = latest[objective]
    return final


def _stalls(client, run_id: str) -> int:
    from pdmask.tracking.runs import with_retry

    return int(with_retry(lambda: client.get_run(run_id)).data.tags.get(STALLS_TAG, "0"))


def _end_stalled(run, log, reason: str) -> None:
    """The watchdog's fault action in a Tune trial: the run FAILED with the reason (kind
    ``stall``, counted in ``pdm.stalls``), its log (``log``, which holds the reason: stderr goes
    there) uploaded, then this worker process ends; Tune sees a crashed trial and retries it
    (``STALL_RETRIES``)."""
    from pdmask.tracking.runs import with_retry

    def record(why: str) -> None:
        stalls = _stalls(run.client, run.run_id) + 1
        with_retry(lambda: run.client.set_tag(run.run_id, STALLS_TAG, str(stalls)))
        with_retry(lambda: run.client.set_tag(run.run_id, WATCHDOG_TAG, why))
        run.fail(why, final=True, kind=FailureKind.STALL)
        upload(run.client, run.run_id, log)  # the process ends before its attempt's own upload

    end_process(reason, record)
