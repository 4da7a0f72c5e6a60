"""A real Ray head on loopback for Ray Jobs tests, a scratch project, and `pdm` in a subprocess.

The head is started with ``ray start --head --block`` in its own session, with its own temporary
folder and free ports (several engineers' heads may share the machine), and fake GPUs: Ray takes
``--num-gpus`` at its word, so admission control is testable without GPUs. It is stopped by PID:
every process it started (its process tree and session, found before stopping) gets SIGTERM, then
SIGKILL. Never ``ray stop``: that would stop every Ray on the machine.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from pdmask.loopback import free_ports
from pdmask.orchestration.cluster.local_head import PORT_FLAGS, tree_of
from pdmask.orchestration.cluster.local_ray import LOOPBACK_ENV

ROOT = Path(__file__).resolve().parents[2]
HEAD_GPUS = 16  # two 8-GPU trials of the h20x32 profile at once
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
# `pdm sweep` flags for `ray_head`: its job API has no authentication and its one node is this
# machine, so the submitter's sqlite store and state folder are the node's own (test_cluster_check.py
# covers the refusals these flags lift).
ONE_MACHINE = ("--insecure", "--skip-cluster-check")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def stop_by_pid(pids: list[int], grace: float = 5.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, sig)
        deadline = time.time() + grace
        while time.time() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.2)


@dataclass
class RayHead:
    address: str  # http://127.0.0.1:PORT, the Jobs API
    process: subprocess.Popen  # `ray start --block`, the root of every process the head starts


@contextlib.contextmanager
def ray_head_process():
    """A fresh head with 2 CPUs and 16 fake GPUs, stopped by PID (its whole tree) on exit."""
    tmp = tempfile.mkdtemp(
        prefix="pdmray", dir="/tmp"
    )  # short: Ray's socket paths are length-capped
    ports = dict(zip(PORT_FLAGS, free_ports(len(PORT_FLAGS)), strict=True))
    dash = ports["--dashboard-port"]
    cmd = [
        str(Path(sys.executable).with_name("ray")),
        "start",
        "--head",
        "--block",
        "--node-ip-address=127.0.0.1",
        "--dashboard-host=127.0.0.1",
        "--include-dashboard=true",
        "--disable-usage-stats",
        "--num-cpus=2",
        f"--num-gpus={HEAD_GPUS}",
        f"--object-store-memory={512 * 1024 * 1024}",
        f"--temp-dir={tmp}",
        *(f"{k}={v}" for k, v in ports.items()),
    ]
    log = open(Path(tmp) / "head.log", "w")  # noqa: SIM115 (closed at teardown)
    head = subprocess.Popen(
        cmd,
        # Ray's single-machine mode, as pdm's own local heads run: every server of the head binds
        # to loopback (in cluster mode its GCS and raylet listen on every interface, open).
        env={**os.environ, **RAY_ENV, **LOOPBACK_ENV},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    address = f"http://127.0.0.1:{dash}"
    try:
        _wait_for_jobs_api(address, head, Path(tmp) / "head.log")
        yield RayHead(address, head)
    finally:
        stop_by_pid(tree_of(head.pid))
        head.wait(timeout=10)
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def ray_head():
    """``http://127.0.0.1:PORT`` of a fresh head (``ray_head_process``) for the module's tests."""
    with ray_head_process() as head:
        yield head.address


def _wait_for_jobs_api(
    address: str, head: subprocess.Popen, log: Path, timeout: float = 90
) -> None:
    import urllib.request

    deadline = time.time() + timeout
    while time.time() < deadline:
        if head.poll() is not None:
            raise RuntimeError(f"ray start exited {head.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{address}/api/version", timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"Ray's job API did not come up at {address}:\n{log.read_text()[-3000:]}")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    for name in ("recipes", "sweeps", "dashboards"):
        shutil.copytree(ROOT / name, tmp_path / name)
    (tmp_path / ".pdm").mkdir()
    return tmp_path


def env_for(project: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS")}
    env.update(RAY_ENV)
    env.update(
        {
            "PDM_PROJECT": str(project),
            "PDM_HOME": str(project / ".pdm"),
            "PDM_DATA_DIR": str(project / "data-on-the-nodes"),
            "PDM_JOB_POLL_SECONDS": "0.5",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(extra)
    return env


def pdm_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "pdmask", *args]


def tracking_client(project: Path):
    """A client on the project's store, opened the way pdm opens it: a test that watches a
    running sweep may be the first to touch the store, and must not race the sweep's migration."""
    from pdmask.tracking.store import sqlite_client

    (project / ".pdm").mkdir(exist_ok=True)  # the sweep may not have made its state folder yet
    return sqlite_client(f"sqlite:///{project / '.pdm' / 'mlflow.db'}")


def sweep_runs(project: Path, sweep: str) -> dict[str, object]:
    """The sweep's runs by trial hash (one run per trial is part of what is tested)."""
    client = tracking_client(project)
    exp = client.get_experiment_by_name(sweep)
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    out: dict[str, list] = {}
    for r in runs:
        out.setdefault(r.data.tags["pdm.trial_hash"], []).append(r)
    return out
