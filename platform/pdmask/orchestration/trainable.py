"""What runs inside a Ray worker for one trial: claim it, open its MLflow run, train, close the run.

Outcomes reported to Tune (``pdm_outcome``): ``finished``, ``already-done`` (a FINISHED run exists),
``claimed-elsewhere`` (another live invocation trains it), ``config-error`` (never retried). A crash
(exception, NaN loss) is recorded on the run and re-raised so Tune retries it; a killed process is
noticed and recorded by the next attempt, which resumes from the trial's checkpoint.
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

    from pdmask.backends.dispatch import planned_steps, run_backend
    from pdmask.orchestration.claims import Claim
    from pdmask.paths import state_dir
    from pdmask.tracking import TrialRun, open_client

    trial = trial_from_config(config)
    from pdmask.orchestration.calibration import STEPS as CALIBRATION_STEPS

    total = CALIBRATION_STEPS if config.get("calibration_seconds") else planned_steps(trial)
    base = {"pdm_trial_hash": trial.trial_hash, "pdm_total_steps": total or 0}
    with Claim(trial.trial_hash) as claimed:
        if not claimed:
            tune.report({**base, "pdm_outcome": "claimed-elsewhere"})
            return
        client = open_client(config["tracking_uri"])
        tags = dict(config["tags"])
        if config.get("search"):  # lets a later invocation warm-start the search with this point
            tags["pdm.search_point"] = json.dumps(config["search"], sort_keys=True)
        run = TrialRun.start_or_resume(client, config["experiment_id"], trial, tags)
        if run is None:
            tune.report({**base, "pdm_outcome": "already-done"})
            return
        workdir = state_dir() / "trials" / trial.trial_hash
        workdir.mkdir(parents=True, exist_ok=True)
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

        try:
            recipe = trial.recipe()  # the source planned with the sweep, never re-read
            backend = run_backend
            if config.get("calibration_seconds"):  # benchmarks/bench_sweep.py: known, fixed compute
                from pdmask.orchestration.calibration import busy_trial

                backend = partial(busy_trial, seconds=config["calibration_seconds"])
            summary = backend(
                trial, recipe, reporter=reporter, workdir=workdir, should_stop=lambda: False
            )
        except ConfigError as err:
            run.fail(f"configuration error: {err}", final=True)
            tune.report({**base, "pdm_outcome": "config-error", "pdm_error": str(err)[:500]})
            return
        except (KeyboardInterrupt, SystemExit):
            # Ctrl-C reaching the process group, or Tune stopping the trial (it raises SystemExit
            # inside tune.report): the trial is resumable, not failed.
            run.interrupted()
            raise
        except BaseException as err:
            reason = f"{type(err).__name__}: {err}".strip()
            run.fail(reason + "\n" + "".join(traceback.format_exception(err))[-1500:], final=True)
            raise
        run.finish(summary)
        final = {**base, "pdm_outcome": "finished", "pdm_step": run.last_step}
        if objective and objective in latest:
            final["pdm_objective"] = latest[objective]
        tune.report(final)
