"""What runs inside a Ray worker for one trial: claim it, open its MLflow run, train, close the run.

Outcomes reported to Tune (``pdm_outcome``): ``finished``, ``already-done`` (a FINISHED run exists),
``claimed-elsewhere`` (another live invocation trains it), ``config-error`` (never retried: the
run is FAILED with the reason and ``pdm.failure_kind=config``). Everything after the run is open,
the backend's own config included, runs inside that error handling. A crash (exception, NaN
loss) is recorded on the run and re-raised so Tune retries it; a killed process is noticed and
recorded by the next attempt, which resumes from the trial's checkpoint if that checkpoint
belongs to the same run (``workdirs.py``).
"""

from __future__ import annotations

import json
import os
import traceback
from functools import partial
from typing import Any

from pdmask.errors import ConfigError
from pdmask.registry import Trial


def trial_from_config(config: dict[str, Any]) -> Trial:
    """The trial of a Tune config: a planned trial, or a search template plus sampled values."""
    trial = Trial.model_validate(config["trial"])
    sampled = config.get("search") or {}
    if sampled:
        params = dict(trial.params)
        update: dict[str, Any] = {}
        for axis, value in sampled.items():
            if axis == "delta":
                update["delta"] = float(value)
                if "delta" in params:
                    params["delta"] = float(value)
            else:
                params[axis.removeprefix("params.")] = value
        trial = trial.model_copy(update={**update, "params": params})
    return trial


def run_trial(config: dict[str, Any]) -> None:
    """Tune function trainable."""
    from ray import tune

    from pdmask.orchestration.claims import Claim
    from pdmask.tracking import TrialRun, open_client
    from pdmask.tracking.store import redact, resolve_tracking_uri

    trial = trial_from_config(config)
    base = {"pdm_trial_hash": trial.trial_hash, "pdm_total_steps": 0}
    with Claim(trial.trial_hash) as claimed:
        if not claimed:
            tune.report({**base, "pdm_outcome": "claimed-elsewhere"})
            return
        # The store comes with the worker's environment (never in the Tune config, which Tune
        # writes to disk): a URI may hold a password. The driver checked it before launching.
        uri = resolve_tracking_uri(None)
        client = open_client(uri, integrity=False)
        tags = dict(config["tags"])
        if config.get("search"):  # lets a later invocation warm-start the search with this point
            tags["pdm.search_point"] = json.dumps(config["search"], sort_keys=True)
        run = TrialRun.start_or_resume(client, config["experiment_id"], trial, tags)
        if run is None:
            tune.report({**base, "pdm_outcome": "already-done"})
            return
        try:
            final = _train(config, trial, run, base, redact(uri))
        except ConfigError as err:  # never retried: the same input fails the same way
            run.fail(f"configuration error: {err}", final=True, kind="config")
            tune.report({**base, "pdm_outcome": "config-error", "pdm_error": str(err)[:500]})
            return
        except (KeyboardInterrupt, SystemExit):
            # Tune stopping the trial (it raises SystemExit inside tune.report): the trial is
            # resumable, not failed.
            run.interrupted()
            raise
        except BaseException as err:
            reason = f"{type(err).__name__}: {err}".strip()
            run.fail(reason + "\n" + "".join(traceback.format_exception(err))[-1500:], final=True)
            raise
        tune.report(final)  # after the run is FINISHED: a stop arriving now cannot touch it


def _train(
    config: dict[str, Any], trial: Trial, run, base: dict[str, Any], where: str
) -> dict[str, Any]:
    """Train ``trial`` into its open ``run``, reporting to Tune; finishes the run and returns
    the final report."""
    from ray import tune

    from pdmask.backends.interface import load_backend
    from pdmask.orchestration.calibration import STEPS as CALIBRATION_STEPS
    from pdmask.orchestration.workdirs import bind_workdir

    runtime = load_backend(config.get("backend") or trial.backend)
    calibration = config.get("calibration_seconds")
    base["pdm_total_steps"] = (
        CALIBRATION_STEPS if calibration else runtime.planned_steps(trial)
    ) or 0
    workdir, discarded = bind_workdir(trial.trial_hash, run.run_id, where)
    if discarded:
        run.note("checkpoint of another run discarded (that run is lost): trained from scratch")
    (workdir / "pid").write_text(str(os.getpid()))
    objective = config.get("objective")
    latest: dict[str, float] = {}

    def reporter(step: int, metrics: dict[str, float]) -> None:
        run.log(step, metrics)
        latest.update(metrics)
        report = {**base, "pdm_step": step, "pdm_attempt": run.attempt}
        if config.get("eval_metric") in latest:
            report["pdm_eval"] = latest[config["eval_metric"]]
        if objective and objective in latest:
            report["pdm_objective"] = latest[objective]
        tune.report(report)

    recipe = trial.recipe()  # the source planned with the sweep, never re-read
    backend = runtime.train
    if calibration:  # benchmarks/bench_sweep.py: known, fixed compute
        from pdmask.orchestration.calibration import busy_trial

        backend = partial(busy_trial, seconds=calibration)
    summary = backend(trial, recipe, reporter=reporter, workdir=workdir, should_stop=lambda: False)
    run.finish(summary)
    final = {**base, "pdm_outcome": "finished", "pdm_step": run.last_step}
    if objective and objective in latest:
        final["pdm_objective"] = latest[objective]
    return final
