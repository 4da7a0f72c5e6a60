"""``pdm sweep ... --backend verl --address``: real VeRL training on a two-node Ray cluster, one
node of which dies mid-trial and comes back.

Built on this machine (``tests/cluster/two_node.py``): a head with no CPUs and no GPUs, so every
job's verl actors (TaskRunner, the FSDP worker, vLLM's server and engine) can only run on the
second node, which joins with the CPUs of the ``this-machine`` profile and the one logical GPU
its one trial needs;
token authentication on, every server on loopback; a real ``mlflow server`` (sqlite, 127.0.0.1,
one worker) as the tracking server, reached by the machine's host name (not a loopback name, which
pdm refuses for a cluster); a checkpoint root every node writes (one disk: every node's).

One trial (``pdm-agg``, mu from vLLM's rollout, three steps). Once its step 1 is on the server,
the second node's raylet is SIGKILLed: the node and everything on it die, as a machine's would.
Its attempt must end (Ray marks the node dead, the driver's actor dies with it), pdm must wait
for GPUs (the cluster has none left) and, once the node is started again, submit attempt 2 into
the same MLflow run; verl resumes it from the shared checkpoint root; every step is logged once;
the figure is built from the server's runs. The refusals before any job (a sqlite store, unset
checkpoints, an unauthenticated address) and a killed head ending ``pdm sweep`` within its bound
are tested in ``tests/cluster`` against the same kind of cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field

import pytest

from pdmask.orchestration.cluster.local_head import _processes
from tests.cluster.conftest import pdm_cmd
from tests.cluster.two_node import alive_nodes, site

from .conftest import ROOT, cpu_env
from .listening import process_name

SWEEP = "verl-cluster"
STEPS = 3
SWEEP_TEXT = f"""name: {SWEEP}
description: "One real VeRL trial on a two-node cluster whose worker node dies mid-trial."
figures: [verl-smoke]
backend: verl
cluster: this-machine
steps: {STEPS}
seeds: 1
retries: 1
max_concurrent: 1
grid:
  method: [pdm-agg]
  model: [qwen3-tiny]
  precision: [bf16]
  delta: [0.15]
"""
# Two attempts of one trial (a job start is 95-240 s on 2 loaded cores, a step ~10-30 s) and the
# cluster's start: well inside this; the module's pytest timeout adds the teardown.
SWEEP_TIMEOUT_S = 1500
# The killed node's job ends once Ray's GCS marks the node dead (its health checks: seconds to
# tens of seconds) and the driver's TaskRunner actor dies with it; the stall bound (the job's
# watchdog) is the backstop.
STALL_S = "300"
NODE_DEATH_BOUND_S = 300
KEYS = ("actor/pdm/kl_topk_mean", "actor/pg_loss", "critic/score/mean", "actor/grad_norm")
WORKER_CPUS = 16  # the local head's logical CPUs (ray_jobs_local.LOGICAL_CPUS): what verl holds

pytestmark = [pytest.mark.timeout(SWEEP_TIMEOUT_S + 300), pytest.mark.processes]


@dataclass
class NodeKill:
    """Kills the worker node's raylet once the trial's step 1 is on the server, then brings the
    node back once the attempt ended; records what happened when."""

    cluster: object
    client: object  # MLflow, on the tracking server
    jobs: object  # Ray's job client, with the token
    run_id: str | None = None
    submission_id: str | None = None
    killed_at: float | None = None
    raylet: int | None = None
    ended_status: str | None = None
    ended_at: float | None = None
    dead_at: float | None = None  # when Ray listed the node dead
    restarted_at: float | None = None
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> NodeKill:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=150)

    def _run(self) -> None:
        while self.restarted_at is None and not self._stop.wait(1.0):
            try:
                self._round()
            except Exception as err:  # reported by the tests, never hidden
                self.errors.append(f"{type(err).__name__}: {err}")
                return

    def _round(self) -> None:
        if self.killed_at is None:
            return self._kill_when_a_step_is_logged()
        if self.ended_at is None:
            info = self.jobs.get_job_info(self.submission_id)
            if info.end_time:
                self.ended_status = str(getattr(info.status, "value", info.status))
                self.ended_at = info.end_time / 1000
            return None
        # Back once Ray has marked the old node dead, as an operator would bring a machine
        # back; a node still listed alive would be a candidate for the retry's placement.
        if alive_nodes(self.cluster.address, self.cluster.token) > 1:
            return None
        self.dead_at = time.time()
        self.cluster.restart_worker()
        self.restarted_at = time.time()
        return None

    def _kill_when_a_step_is_logged(self) -> None:
        exp = self.client.get_experiment_by_name(SWEEP)
        if exp is None:
            return
        for run in self.client.search_runs([exp.experiment_id], "attributes.status = 'RUNNING'"):
            sid = run.data.tags.get("pdm.ray_job")
            if not sid or not any(
                m.step >= 1 for m in self.client.get_metric_history(run.info.run_id, KEYS[0])
            ):
                continue
            raylets = [p for p in self.cluster.worker.processes() if process_name(p) == "raylet"]
            assert len(raylets) == 1, f"expected the worker node's raylet, found {raylets}"
            self.run_id, self.submission_id, self.raylet = run.info.run_id, sid, raylets[0]
            os.kill(raylets[0], signal.SIGKILL)
            self.killed_at = time.time()
            return


def _tracking_host() -> str:
    """The machine's name, as the nodes would reach a tracking host (pdm refuses loopback names
    for a cluster); the server listens on 127.0.0.1, which the name must resolve to."""
    host = socket.gethostname()
    if not socket.gethostbyname(host).startswith("127."):
        pytest.skip(f"{host} does not resolve to this machine's loopback address")
    return host


@pytest.fixture(scope="module")
def outcome(tmp_path_factory, tiny_cache):
    """The sweep on the cluster with its node killed and restarted (minutes)."""
    from mlflow.tracking import MlflowClient
    from ray.job_submission import JobSubmissionClient

    host = _tracking_host()
    project = tmp_path_factory.mktemp("verl-cluster")
    for name in ("recipes", "sweeps", "dashboards"):
        shutil.copytree(ROOT / name, project / name)
    (project / "sweeps" / f"{SWEEP}.yaml").write_text(SWEEP_TEXT)
    checkpoints = tmp_path_factory.mktemp("shared") / "checkpoints"
    log = project / "pdm.log"
    with site(head_cpus=0, worker_cpus=WORKER_CPUS, worker_gpus=1, open_head=False) as cluster:
        uri = cluster.tracking_uri.replace("127.0.0.1", host)
        started = time.time()
        with open(log, "w") as out:
            proc = subprocess.Popen(
                pdm_cmd(
                    "sweep",
                    SWEEP,
                    "--backend",
                    "verl",
                    "--address",
                    cluster.address,
                    "--tracking-uri",
                    uri,
                ),
                env=cpu_env(
                    project,
                    RAY_AUTH_TOKEN=cluster.token,
                    PDM_VERL_CHECKPOINT_DIR=str(checkpoints),
                    PDM_STALL_SECONDS=STALL_S,
                ),
                cwd=project,
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
            )
        headers = {"Authorization": f"Bearer {cluster.token}"}
        jobs = JobSubmissionClient(cluster.address, headers=headers)
        fault = NodeKill(cluster, MlflowClient(cluster.tracking_uri), jobs)
        try:
            with fault:
                proc.wait(timeout=SWEEP_TIMEOUT_S)
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=120)
        seconds = time.time() - started
        retry = fault.submission_id and fault.submission_id[: -len("a1")] + "a2"
        retry_log = ""
        with contextlib.suppress(Exception):
            retry_log = jobs.get_job_logs(retry) if retry else ""
        placed = _actor_placement(cluster.address, headers)
        client = MlflowClient(cluster.tracking_uri)
        exp = client.get_experiment_by_name(SWEEP)
        runs = client.search_runs([exp.experiment_id]) if exp else []
        history = {
            key: [(m.step, m.value) for m in client.get_metric_history(r.info.run_id, key)]
            for r in runs[:1]
            for key in (*KEYS, "val-core/synth/acc/mean_at_2")
        }
        sessions = {p.process.pid for p in cluster.processes}
    left = [p for p, (_, sid, state) in _processes().items() if sid in sessions and state != "Z"]
    return {
        "project": project,
        "rc": proc.returncode,
        "out": log.read_text(),
        "seconds": seconds,
        "fault": fault,
        "retry_log": retry_log or "",
        "placed": placed,
        "runs": runs,
        "history": history,
        "checkpoints": checkpoints,
        "left": left,
    }


def _actor_placement(address: str, headers: dict[str, str]) -> dict[str, list[str]]:
    """Ray's record of every actor (dead ones too): class name -> "head" / "worker" per actor."""
    from ray.util.state import StateApiClient
    from ray.util.state.common import ListApiOptions, StateResource

    api = StateApiClient(address, headers={"Content-Type": "application/json", **headers})
    options = ListApiOptions(detail=True, limit=10_000)
    nodes = api.list(StateResource.NODES, options=options, raise_on_missing_output=False)
    head = {n.node_id for n in nodes if n.is_head_node}
    out: dict[str, list[str]] = {}
    for actor in api.list(StateResource.ACTORS, options=options, raise_on_missing_output=False):
        out.setdefault(actor.class_name, []).append("head" if actor.node_id in head else "worker")
    return out


def test_the_trial_survives_its_node_and_finishes_as_attempt_2_in_one_run(outcome):
    out, fault = outcome["out"], outcome["fault"]
    assert outcome["rc"] == 0, out[-6000:]
    assert not fault.errors, fault.errors
    assert fault.killed_at and fault.restarted_at, f"the node was not killed and restarted: {fault}"
    runs = outcome["runs"]
    assert len(runs) == 1, [r.info.run_id for r in runs]
    run = runs[0]
    assert run.info.run_id == fault.run_id, "attempt 2 logged into the trial's run"
    assert run.info.status == "FINISHED"
    assert run.data.tags["pdm.attempts"] == "2"
    assert fault.submission_id.endswith("-a1")
    assert run.data.tags["pdm.ray_job"] == fault.submission_id[: -len("a1")] + "a2"
    failures = json.loads(run.data.tags["pdm.failures"])
    assert [f["attempt"] for f in failures] == [1], failures
    assert f"FAILED {fault.submission_id}: " in out and "retrying" in out, out[-3000:]
    took = fault.ended_at - fault.killed_at
    assert fault.ended_status == "FAILED" and 0 < took <= NODE_DEATH_BOUND_S, fault
    print(
        f"{SWEEP}: {outcome['seconds']:.0f} s; after the raylet's kill the job ended in "
        f"{took:.0f} s, Ray listed the node dead in {fault.dead_at - fault.killed_at:.0f} s; "
        f"reason: {failures[0]['reason'][:300]}"
    )


def test_the_retry_resumed_from_the_shared_checkpoint_and_logged_every_step_once(outcome):
    match = re.search(r"Resuming from \S*global_step_(\d+)", outcome["retry_log"])
    assert match and int(match.group(1)) >= 1, outcome["retry_log"][-3000:]
    run = outcome["runs"][0]
    done = list(outcome["checkpoints"].glob(f"{SWEEP}/*/latest_checkpointed_iteration.txt"))
    assert [p.parent.name for p in done] == [run.data.tags["pdm.trial_hash"]], done
    assert done[0].read_text().strip() == str(STEPS)
    history = outcome["history"]
    for key in KEYS:
        steps = sorted(s for s, _ in history[key])
        assert steps == list(range(1, STEPS + 1)), f"{key} at steps {steps}"
    val = sorted(s for s, _ in history["val-core/synth/acc/mean_at_2"])
    assert val[0] == 0 and val[-1] == STEPS and val == sorted(set(val)), val
    assert any(v > 0 for _, v in history["actor/grad_norm"]), "nothing was trained"


def test_every_verl_actor_ran_on_the_worker_node(outcome):
    placed = outcome["placed"]
    runners = [where for name, where in placed.items() if name.startswith("TaskRunner")]
    assert runners and len(runners[0]) == 2, f"one TaskRunner per attempt: {placed}"
    # Ray's job supervisor (the entrypoint's parent) stays on the head, as Ray places it.
    elsewhere = {
        name: where for name, where in placed.items() if "head" in where and name != "JobSupervisor"
    }
    assert not elsewhere, elsewhere


def test_the_figure_came_from_the_tracking_server_and_nothing_is_left(outcome):
    project = outcome["project"]
    figures = list((project / ".pdm" / "figures" / SWEEP).rglob("*.png"))
    assert figures, outcome["out"][-3000:]
    assert not (project / ".pdm" / "mlflow.db").exists(), "a local store was written"
    assert outcome["left"] == [], f"processes left in the cluster's sessions: {outcome['left']}"
