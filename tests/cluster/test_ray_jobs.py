"""Ray Jobs round trips against a real local Ray head, with a stand-in trainer in place of VeRL.

What is real: the Ray head and its job API, pdmask's job builder (the stand-in receives the very
overrides and runtime env VeRL would), the `pdm sweep` command, and a sqlite MLflow store. What is
stood in: ``python3 -m verl.trainer.main_ppo`` (via ``PDM_VERL_ENTRYPOINT``), and the GPUs (the
head advertises 16 it does not have; each 4B trial on h20x32 takes 8).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pdmask.orchestration.cluster.local_head import tree_of
from tests.cluster.conftest import (
    ONE_MACHINE,
    env_for,
    pdm_cmd,
    ray_head_process,
    stop_by_pid,
    sweep_runs,
)

pytest.importorskip("verl")
pytestmark = [pytest.mark.verl, pytest.mark.slow, pytest.mark.processes]

STANDIN = Path(__file__).with_name("standin_trainer.py")
# How long an invocation may take to plan, build every job (verl's config classes import in tens of
# seconds on a loaded 2-core machine) and reach the head: a wait for an event, not a speed claim.
START_S = 240
SWEEP = """name: {name}
description: cluster test sweep
backend: verl
cluster: h20x32
steps: 3
retries: 1
seeds: {seeds}
grid:
  method: {methods}
  model: [qwen3-4b-base]
  precision: [bf16]
  delta: [0.15]
"""


def write_sweep(project: Path, name: str, methods: list[str], seeds: int = 1) -> None:
    text = SWEEP.format(name=name, seeds=seeds, methods="[" + ", ".join(methods) + "]")
    (project / "sweeps" / f"{name}.yaml").write_text(text)


def standin_env(project: Path, behaviour: dict) -> dict[str, str]:
    path = project / "behaviour.json"
    path.write_text(json.dumps(behaviour))
    return env_for(project, PDM_VERL_ENTRYPOINT=f"{sys.executable} {STANDIN} {path}")


def run_pdm(project: Path, env: dict[str, str], *args: str, timeout: float = 240):
    return subprocess.run(
        pdm_cmd(*args), env=env, cwd=project, capture_output=True, text=True, timeout=timeout
    )


def cluster_jobs(address: str, sweep: str) -> dict[str, object]:
    from ray.job_submission import JobSubmissionClient

    jobs = JobSubmissionClient(address).list_jobs()
    return {j.submission_id: j for j in jobs if j.submission_id.startswith(f"pdm-{sweep}-")}


def max_overlap(jobs) -> int:
    """Most jobs alive (submitted and not yet ended) at any one time."""
    events = sorted([(j.start_time, 1) for j in jobs] + [(j.end_time, -1) for j in jobs])
    alive = peak = 0
    for _, delta in events:
        alive += delta
        peak = max(peak, alive)
    return peak


def test_sweep_submits_admits_retries_and_settles_runs(ray_head, project):
    """Four trials, room for two: retry after a failure, a final failure with its log tail, a run
    left RUNNING by a successful job, then a second invocation that resumes only the failed one."""
    write_sweep(project, "jobs", ["grpo-clip-higher", "dppo-topk-kl", "pdm-agg", "pdm-uni"])
    behaviour = {
        "vanilla": [{"result": "ok"}],
        "dppo_topk_kl": [{"result": "open"}],
        "pdm_agg": [{"result": "fail"}, {"result": "ok"}],
        "pdm_uni": [{"result": "fail"}, {"result": "fail"}, {"result": "ok"}],
    }
    env = standin_env(project, behaviour)
    first = run_pdm(
        project, env, "sweep", "jobs", "--address", ray_head, *ONE_MACHINE, "--no-figures"
    )
    out = first.stdout + first.stderr
    assert first.returncode == 1, out  # pdm-uni failed both of its attempts
    assert "waiting for GPUs" in out, out
    # the progress line as the loop polls: two 8-GPU jobs on 16 GPUs, two queued, the ETA
    # priced by the plan's cost model before any job reported a step
    assert re.search(r"\] jobs: 0/4 done, 2 running, 0 failed, 2 queued; elapsed \S+, ETA \d", out)

    jobs = cluster_jobs(ray_head, "jobs")
    by_trial: dict[str, list[str]] = {}
    for sid in jobs:
        by_trial.setdefault(sid.rsplit("-", 2)[1], []).append(sid.rsplit("-", 1)[1])
    runs = sweep_runs(project, "jobs")
    assert all(len(r) == 1 for r in runs.values()), "one MLflow run per trial"
    method = {h: r[0].data.tags["pdm.method"] for h, r in runs.items()}
    attempts = {method[h]: sorted(a) for h, a in by_trial.items()}
    assert attempts == {
        "grpo-clip-higher": ["a1"],
        "dppo-topk-kl": ["a1"],
        "pdm-agg": ["a1", "a2"],
        "pdm-uni": ["a1", "a2"],
    }
    assert max_overlap(jobs.values()) <= 2, "admission: 16 GPUs hold two 8-GPU trials"

    run = {method[h]: r[0] for h, r in runs.items()}
    status = {m: r.info.status for m, r in run.items()}
    assert status == {
        "grpo-clip-higher": "FINISHED",
        "dppo-topk-kl": "FINISHED",
        "pdm-agg": "FINISHED",
        "pdm-uni": "FAILED",
    }
    # The stand-in got the trial's own overrides and logged into the pre-created run.
    assert all(r.data.tags["standin.seed"] == "0" for m, r in run.items() if m != "pdm-uni")
    # its last step, 3, as verl validates the last step
    assert run["pdm-agg"].data.metrics["val-core/aime24/acc/mean_at_16"] == pytest.approx(0.3)
    # the pre-created run carries pdmask's params, the steps it trains among them, none of
    # them a `/`-separated path as verl's own params are (a conflict would disable verl's MLflow)
    params = run["pdm-agg"].data.params
    assert params["steps"] == "3" and params["method"] == "pdm-agg"
    assert not [name for name in params if "/" in name]
    assert "pdm.finished_by" in run["dppo-topk-kl"].data.tags  # job SUCCEEDED, run left RUNNING
    assert "pdm.finished_by" not in run["grpo-clip-higher"].data.tags
    reason = run["pdm-uni"].data.tags["pdm.failure_reason"]
    assert "-a2 FAILED (exit code 1)" in reason
    assert "RuntimeError: stand-in failure of pdm_uni on attempt 2" in reason  # the log tail
    failures = json.loads(run["pdm-uni"].data.tags["pdm.failures"])
    assert [f["attempt"] for f in failures] == [1, 2]
    assert "attempt 1" in failures[0]["reason"] or "a1 FAILED" in failures[0]["reason"]
    assert len(json.loads(run["pdm-agg"].data.tags["pdm.failures"])) == 1
    assert run["pdm-agg"].data.tags["pdm.ray_job"].endswith("-a2")

    # Second invocation: finished trials are skipped by hash; pdm-uni resumes into its run as a3.
    second = run_pdm(
        project, env, "sweep", "jobs", "--address", ray_head, *ONE_MACHINE, "--no-figures"
    )
    assert second.returncode == 0, second.stdout + second.stderr
    assert "3 already finished, 1 to run" in second.stdout
    jobs = cluster_jobs(ray_head, "jobs")
    assert len(jobs) == 7 and any(sid.endswith("-a3") for sid in jobs)
    runs_after = sweep_runs(project, "jobs")
    uni = [r[0] for r in runs_after.values() if r[0].data.tags["pdm.method"] == "pdm-uni"]
    assert len(runs_after) == 4 and all(len(r) == 1 for r in runs_after.values())
    assert uni[0].info.run_id == run["pdm-uni"].info.run_id
    assert uni[0].info.status == "FINISHED" and uni[0].data.tags["pdm.attempts"] == "3"


def test_interrupted_sweep_attaches_to_running_jobs(ray_head, project):
    """SIGTERM detaches like Ctrl-C (exit 130, the jobs keep running); the next invocation
    attaches, never resubmits."""
    write_sweep(project, "attach", ["pdm-agg"], seeds=2)
    release = project / "release"
    env = standin_env(project, {"pdm_agg": [{"result": "ok", "wait_for": str(release)}]})
    cmd = pdm_cmd("sweep", "attach", "--address", ray_head, *ONE_MACHINE, "--no-figures")
    first = subprocess.Popen(
        cmd, env=env, cwd=project, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: list[str] = []
    deadline = time.time() + START_S
    while sum("submitted pdm-attach-" in line for line in lines) < 2:
        line = first.stdout.readline()
        assert line or first.poll() is None, "".join(lines)
        assert time.time() < deadline, "".join(lines)
        lines.append(line)
    first.send_signal(signal.SIGTERM)  # a scheduler's or an operator's stop (SIGINT: the same)
    rest, _ = first.communicate(timeout=60)
    assert first.returncode == 130, "".join(lines) + rest
    assert "detached: 2 job(s) keep running on the cluster" in rest, "".join(lines) + rest

    second = subprocess.Popen(
        cmd, env=env, cwd=project, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines, deadline = [], time.time() + START_S
    while sum("attached to pdm-attach-" in line for line in lines) < 2:
        line = second.stdout.readline()
        assert line or second.poll() is None, "".join(lines)
        assert time.time() < deadline, "".join(lines)
        lines.append(line)
    release.touch()  # the jobs may end now
    out = "".join(lines) + second.communicate(timeout=120)[0]
    assert second.returncode == 0, out
    assert "submitted" not in out, out
    assert sorted(sid.rsplit("-", 1)[1] for sid in cluster_jobs(ray_head, "attach")) == ["a1", "a1"]
    runs = sweep_runs(project, "attach")
    assert len(runs) == 2
    assert all(
        r[0].info.status == "FINISHED" and r[0].data.tags["pdm.attempts"] == "1"
        for r in runs.values()
    )


def test_a_lost_head_ends_the_sweep_within_the_bound_with_the_command_to_resume(project):
    """The head dies mid-sweep: a line per retry, then exit 1 within the bound, one error line
    that names the job API and the command to run again, no traceback. A bound that is not a
    number of seconds is refused before any job."""
    write_sweep(project, "lost", ["pdm-agg"])
    release = project / "release"  # never created: the job runs until the head dies
    env = standin_env(project, {"pdm_agg": [{"result": "ok", "wait_for": str(release)}]})
    bound_s = 8
    with ray_head_process() as head:
        cmd = pdm_cmd("sweep", "lost", "--address", head.address, *ONE_MACHINE, "--no-figures")
        refused = run_pdm(project, {**env, "PDM_CLUSTER_UNREACHABLE_SECONDS": "soon"}, *cmd[3:])
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "PDM_CLUSTER_UNREACHABLE_SECONDS must be a positive number" in refused.stderr
        assert cluster_jobs(head.address, "lost") == {}, "refused before any job"

        env["PDM_CLUSTER_UNREACHABLE_SECONDS"] = str(bound_s)
        sweep = subprocess.Popen(
            cmd, env=env, cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        lines: list[str] = []
        deadline = time.time() + START_S
        while not any("submitted pdm-lost-" in line for line in lines):
            line = sweep.stdout.readline()
            assert line or sweep.poll() is None, "".join(lines) + sweep.stderr.read()
            assert time.time() < deadline, "".join(lines)
            lines.append(line)
        stop_by_pid(tree_of(head.process.pid))  # the head and its jobs, as a lost node
        lost_at = time.time()
        out, err = sweep.communicate(timeout=120)
        took = time.time() - lost_at
    out = "".join(lines) + out
    assert sweep.returncode == 1, out + err
    assert "Traceback" not in out + err, out + err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err
    assert f"the Ray job API at {head.address} has not answered for" in errors[0]
    resume = f"pdm sweep lost --address {head.address} --insecure --skip-cluster-check"
    assert f"`{resume} --no-figures` attaches to the jobs still running" in errors[0], errors[0]
    retries = [line for line in out.splitlines() if "does not answer" in line]
    # One line per round: the job's poll and the admission share the round's line.
    assert 2 <= len(retries) <= bound_s / 0.5 + 2, retries
    assert all("giving up in" in line for line in retries), retries
    # The bound, plus a poll, the job API's own connection timeouts and the interpreter's exit.
    assert took <= bound_s + 60, f"the sweep ended {took:.0f} s after its head died"
    assert "sweep lost: Ray jobs" in out, "the summary is printed before the error"
    print(f"head lost: exit 1 {took:.0f} s later, after {len(retries)} retry lines; {errors[0]}")


def test_duplicate_submission_id_attaches_and_failure_keeps_log_tail(ray_head):
    """The job API refuses a second job with the same id: pdmask reads that as "attach"."""
    from pdmask.backends.interface import JobResources, JobSpec
    from pdmask.orchestration.jobs.cluster import JobCluster

    cluster = JobCluster(ray_head)
    spec = JobSpec(
        trial_hash="0123456789abcdef",
        submission_id="pdm-unit-0123456789abcdef-a1",
        attempt=1,
        entrypoint=f"{sys.executable} -c \"import sys; print('boom here'); sys.exit(3)\"",
        runtime_env={"env_vars": {"MLFLOW_RUN_ID": "run-123"}},
        resources=JobResources(nodes=1, gpus_per_node=0, gpus=0, gpu_kind="CPU"),
    )
    assert cluster.submit(spec, {}) is False
    assert cluster.submit(spec, {}) is True
    deadline = time.time() + 60
    while (view := cluster.view(spec.submission_id)).active:
        assert time.time() < deadline
        time.sleep(0.3)
    assert view.status == "FAILED" and view.run_id == "run-123"
    reason = cluster.failure_reason(view)
    assert reason.startswith("Ray job pdm-unit-0123456789abcdef-a1 FAILED (exit code 3)")
    assert reason.rstrip().endswith("boom here")
    assert list(cluster.pdm_jobs("unit")["0123456789abcdef"]) == [1]
    assert cluster.node_gpus() == [16.0]
