"""A stand-in for ``python3 -m verl.trainer.main_ppo`` in cluster tests: same arguments, no GPU.

Run by the Ray job exactly where VeRL would run (``PDM_VERL_ENTRYPOINT="python3 standin_trainer.py
BEHAVIOUR.json"``), it receives the trial's Hydra overrides and its job environment, and does what
a VeRL job does to its pre-created MLflow run (``MLFLOW_RUN_ID``), as scripted per method (verl's
``loss_mode``) and attempt (``PDM_ATTEMPT``) by the behaviour file::

    {"pdm_agg": [{"result": "fail"}, {"result": "ok", "wait_for": "/tmp/x/release"}], ...}

Every result but ``fail`` first logs a validation at step 0 and a training step, as a job that
started does (a setting's canary: ``orchestration/canary.py``). Results: ``ok`` logs a metric
per step and ends the run FINISHED (verl's ``Tracking.finish``); ``open`` logs the metrics but
exits 0 leaving the run RUNNING; ``fail`` prints a traceback-like error, marks the run FAILED as
pdmask's verl trainer does, and exits 1. The last entry repeats. ``sleep`` (seconds) and
``wait_for`` (until that file exists) delay the result.
"""

from __future__ import annotations

import json
import os
import sys
import time

EVAL = "val-core/aime24/acc/mean_at_16"
EVALS = (EVAL, "val-core/aime25/acc/mean_at_16")  # what the paper's profile validates on


def main() -> int:
    behaviour_file, overrides = sys.argv[1], sys.argv[2:]
    config = dict(o.lstrip("+").split("=", 1) for o in overrides)
    loss_mode = config["actor_rollout_ref.actor.policy_loss.loss_mode"]
    attempt = int(os.environ["PDM_ATTEMPT"])
    with open(behaviour_file) as fh:
        script = json.load(fh)[loss_mode]
    step = script[min(attempt, len(script)) - 1]
    print(f"stand-in trainer: {loss_mode} attempt {attempt} -> {step}", flush=True)

    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    run_id = os.environ["MLFLOW_RUN_ID"]
    if step["result"] != "fail":  # as a job starts: the validation before training, one step
        now = int(time.time() * 1000)
        first = [Metric(name, 0.0, now, 0) for name in EVALS]
        first.append(Metric("critic/score/mean", 0.5, now, 1))
        client.log_batch(run_id, metrics=first)
    time.sleep(step.get("sleep", 0.0))
    release = step.get("wait_for")  # a file the test creates when the job may end
    deadline = time.time() + 120
    while release and not os.path.exists(release) and time.time() < deadline:
        time.sleep(0.2)
    if step["result"] == "fail":
        print("Traceback (most recent call last):", file=sys.stderr)
        print(
            f"RuntimeError: stand-in failure of {loss_mode} on attempt {attempt}", file=sys.stderr
        )
        client.set_tag(run_id, "pdm.failure_reason", "stand-in traceback")
        client.set_terminated(run_id, status="FAILED")
        return 1
    steps = int(config["trainer.total_training_steps"])
    now = int(time.time() * 1000)
    client.log_batch(
        run_id,
        metrics=[Metric(n, 0.1 * s, now, s) for n in EVALS for s in range(1, steps + 1)],  # 1..N
    )
    client.set_tag(run_id, "standin.seed", config["data.seed"])
    if step["result"] == "ok":
        client.set_terminated(run_id, status="FINISHED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
