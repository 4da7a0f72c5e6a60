"""A VeRL job killed mid-training is retried from its checkpoint into the same MLflow run.

Real throughout: the sweep runs one trial on the local Ray head; once step 1 is logged (verl
checkpoints every step before logging it), the job is stopped through Ray's job API, as an
operator or a node failure would. pdmask marks the attempt failed, resubmits it as attempt 2,
verl resumes from the latest checkpoint, logs into the same run, and no metric has a step twice.
"""

from __future__ import annotations

import re
import subprocess
import time

from tests.cluster.conftest import pdm_cmd, sweep_runs, tracking_client

from .conftest import cpu_env

STEPS = 3
SWEEP = f"""name: kill-retry
description: one VeRL trial on this machine, killed and retried
backend: verl
cluster: this-machine
steps: {STEPS}
retries: 1
seeds: 1
grid:
  method: [pdm-agg]
  model: [qwen3-tiny]
  precision: [bf16]
  delta: [0.15]
"""
KEYS = ("actor/pdm/kl_topk_mean", "actor/pg_loss", "critic/score/mean")


def _wait_for(predicate, what: str, proc, timeout: float = 1800):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        assert proc.poll() is None, f"the sweep ended while waiting for {what}"
        time.sleep(3)
    raise AssertionError(f"timed out waiting for {what}")


def test_killed_job_resumes_from_its_checkpoint_into_the_same_run(cpu_project):
    project = cpu_project
    (project / "sweeps" / "kill-retry.yaml").write_text(SWEEP)
    log = project / "pdm.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            pdm_cmd("sweep", "kill-retry", "--no-figures"),
            env=cpu_env(project),
            cwd=project,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
    try:
        address = _wait_for(
            lambda: (
                (m := re.search(r"on (http://127\.0\.0\.1:\d+)", log.read_text())) and m.group(1)
            ),
            "the local Ray head",
            proc,
        )

        def first_step_logged():
            runs = (
                sweep_runs(project, "kill-retry") if (project / ".pdm/mlflow.db").exists() else {}
            )
            for (run,) in runs.values():
                history = tracking_client(project).get_metric_history(run.info.run_id, KEYS[0])
                if any(m.step >= 1 for m in history):
                    return run
            return None

        run = _wait_for(first_step_logged, "step 1 in MLflow", proc)
        from ray.job_submission import JobSubmissionClient

        jobs = JobSubmissionClient(address)
        sid = f"pdm-kill-retry-{run.data.tags['pdm.trial_hash']}-a1"
        assert jobs.stop_job(sid), f"could not stop {sid}"
        retry = sid[: -len("a1")] + "a2"

        def resumed():
            try:
                logs = jobs.get_job_logs(retry)
            except Exception:  # not submitted yet
                return None
            return re.search(r"Resuming from \S*global_step_(\d+)", logs)

        match = _wait_for(resumed, "attempt 2 to resume from a checkpoint", proc)
        assert int(match.group(1)) >= 1
        proc.wait(timeout=2400)
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=120)
    text = log.read_text()
    assert proc.returncode == 0, text[-6000:]
    assert f"{sid}: " in text and "retrying" in text, text[-3000:]

    runs = sweep_runs(project, "kill-retry")
    assert len(runs) == 1 and len(next(iter(runs.values()))) == 1, "one run for the trial"
    (final,) = next(iter(runs.values()))
    assert final.info.run_id == run.info.run_id
    assert final.info.status == "FINISHED"
    assert final.data.tags["pdm.attempts"] == "2"
    assert final.data.tags["pdm.ray_job"].endswith("-a2")
    client = tracking_client(project)
    for key in KEYS:
        steps = [m.step for m in client.get_metric_history(final.info.run_id, key)]
        assert sorted(steps) == list(range(1, STEPS + 1)), f"{key}: steps {sorted(steps)}"
    checkpoints = project / ".pdm" / "checkpoints" / "verl" / "kill-retry"
    (trial_dir,) = checkpoints.iterdir()
    assert (trial_dir / "latest_checkpointed_iteration.txt").read_text().strip() == str(STEPS)
