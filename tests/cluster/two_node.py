"""A real two-node Ray cluster on this machine, token authentication on, every server on loopback,
and a real MLflow tracking server on 127.0.0.1: what ``pdm cluster check`` and the cluster path of
``pdm sweep`` are tested against.

Each node is a ``ray start --block`` in a session of its own, with its own temporary folder and
free ports (other engineers' Ray instances share the machine); the second node joins through
``join_node.py`` (why: there). Processes are started without waiting, so the head, an open
(unauthenticated) head and the tracking server come up side by side, and stopped by PID: every
process each started, and every process left in its session (a Ray worker whose raylet died is
re-parented, not gone), gets SIGTERM, then SIGKILL. Never ``ray stop``.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from pdmask.loopback import LOOPBACK, free_port, free_ports
from pdmask.orchestration.cluster.local_head import NODE_PORT_FLAGS, PORT_FLAGS, tree_of
from pdmask.orchestration.cluster.local_ray import LOOPBACK_ENV
from tests.cluster.conftest import stop_by_pid

BIN = Path(sys.executable).parent
START_TIMEOUT_S = 120.0
WORKER_RESOURCE = "pdm_worker_node"  # what only the joining node has


@dataclass
class Started:
    """One started process: its command's log and temporary folder, stopped by PID."""

    process: subprocess.Popen
    folder: Path
    log: Path
    extra: dict = field(default_factory=dict)

    def fail(self, what: str) -> RuntimeError:
        return RuntimeError(f"{what}:\n{self.log.read_text()[-3000:]}")

    def processes(self) -> list[int]:
        """Its process, its descendants and whatever is left in its session."""
        return tree_of(self.process.pid)

    def stop(self) -> None:
        stop_by_pid(self.processes())
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        shutil.rmtree(self.folder, ignore_errors=True)


def ray_env(token: str | None) -> dict[str, str]:
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token} if token else {}
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    return {
        **env,
        "RAY_AUTH_MODE": "disabled",
        **auth,
        "RAY_USAGE_STATS_ENABLED": "0",
        **LOOPBACK_ENV,
        # the check job's `python3` is this environment's, as on a node with pdmask installed
        "PATH": os.pathsep.join([str(BIN), os.environ.get("PATH", "")]),
    }


def _spawn(cmd: list[str], env: dict[str, str], prefix: str, **extra) -> Started:
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))  # short: Ray's socket paths
    log = folder / "out.log"
    with open(log, "w") as fh:
        process = subprocess.Popen(
            [c.replace("{folder}", str(folder)) for c in cmd],
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=folder,
            start_new_session=True,
        )
    return Started(process, folder, log, extra)


def start_head(token: str | None, num_cpus: int = 1, num_gpus: int = 0) -> Started:
    ports = dict(zip(PORT_FLAGS, free_ports(len(PORT_FLAGS)), strict=True))
    gcs, dash = ports["--port"], ports["--dashboard-port"]
    cmd = [
        str(BIN / "ray"),
        "start",
        "--head",
        "--block",
        f"--node-ip-address={LOOPBACK}",
        f"--dashboard-host={LOOPBACK}",
        "--include-dashboard=true",
        "--disable-usage-stats",
        f"--num-cpus={num_cpus}",
        f"--num-gpus={num_gpus}",
        f"--object-store-memory={256 * 1024 * 1024}",
        "--temp-dir={folder}",
        *(f"{k}={v}" for k, v in ports.items()),
    ]
    return _spawn(
        cmd, ray_env(token), "pdmh", gcs=f"{LOOPBACK}:{gcs}", address=f"http://{LOOPBACK}:{dash}"
    )


def start_worker(head: Started, token: str | None, num_cpus: int = 1, num_gpus: int = 0) -> Started:
    """A node joining ``head``'s cluster, with the custom resource ``pdm_worker_node``."""
    cmd = [
        sys.executable,
        str(Path(__file__).with_name("join_node.py")),
        "start",
        "--block",
        f"--address={head.extra['gcs']}",
        f"--node-ip-address={LOOPBACK}",
        "--disable-usage-stats",
        f"--num-cpus={num_cpus}",
        f"--num-gpus={num_gpus}",
        "--resources=" + json.dumps({WORKER_RESOURCE: 1}),
        f"--object-store-memory={256 * 1024 * 1024}",
        "--temp-dir={folder}",
        *(
            f"{flag}={port}"
            for flag, port in zip(NODE_PORT_FLAGS, free_ports(len(NODE_PORT_FLAGS)), strict=True)
        ),
    ]
    return _spawn(cmd, ray_env(token), "pdmw")


def start_tracking_server(store: Path | None = None) -> Started:
    """``mlflow server`` on loopback, its store ``store`` (a sqlite file; default: its folder's)."""
    port, host = free_port(), socket.gethostname()
    cmd = [
        str(BIN / "mlflow"),
        "server",
        "--backend-store-uri",
        f"sqlite:///{store}" if store else "sqlite:///{folder}/mlflow.db",
        "--default-artifact-root",
        "{folder}/artifacts",
        "--host",
        LOOPBACK,
        "--port",
        str(port),
        "--workers",
        "1",
        # the names a client may use (MLflow refuses other Host headers): the machine's own name
        # stands for a tracking host's name in test_cluster_check.py
        "--allowed-hosts",
        f"{LOOPBACK},{LOOPBACK}:*,localhost:*,{host},{host}:*",
    ]
    return _spawn(cmd, dict(os.environ), "pdmtrack", port=port, uri=f"http://{LOOPBACK}:{port}")


def _get(url: str, token: str | None = None) -> int | None:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=3) as r:
            return r.status
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return None


def wait_until(started: Started, ready, what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if started.process.poll() is not None:
            raise started.fail(f"{what} exited ({started.process.returncode})")
        if ready():
            return
        time.sleep(0.5)
    raise started.fail(f"{what} not ready within {START_TIMEOUT_S:.0f} s")


def alive_nodes(address: str, token: str | None) -> int:
    from ray.util.state import StateApiClient
    from ray.util.state.common import ListApiOptions, StateResource

    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        nodes = StateApiClient(address, headers=headers).list(
            StateResource.NODES, options=ListApiOptions(), raise_on_missing_output=False
        )
    except Exception:
        return 0
    return sum(1 for n in nodes if n.state == "ALIVE")


@dataclass
class Site:
    """What the tests run against."""

    token: str
    address: str  # the two-node cluster's job API (token auth on)
    open_address: str | None  # a one-node head without authentication (when asked for)
    tracking_uri: str  # the MLflow server
    processes: list[Started]  # every process started so far, a restarted node's too
    head: Started
    worker: Started  # the joining node now in the cluster
    worker_shape: dict[str, int]  # its CPUs and GPUs, for a restart

    def restart_worker(self) -> Started:
        """A node like the worker joins again (its own new folder and ports), as a machine
        whose raylet died and was brought back: a new node to Ray."""
        self.worker = start_worker(self.head, self.token, **self.worker_shape)
        self.processes.append(self.worker)
        alive = alive_nodes(self.address, self.token)
        wait_until(
            self.worker,
            lambda: alive_nodes(self.address, self.token) > alive,
            "the restarted node",
        )
        return self.worker


@contextlib.contextmanager
def site(
    head_cpus: int = 1,
    worker_cpus: int = 1,
    worker_gpus: int = 0,
    open_head: bool = True,
    head_gpus: int = 0,
):
    """The cluster (a ``head_cpus`` / ``head_gpus`` head and a ``worker_cpus`` / ``worker_gpus``
    node; GPUs are logical), the tracking server and, with ``open_head``, a one-node head
    without authentication."""
    token = "pdm-test-" + secrets.token_hex(16)
    started: list[Started] = []
    try:
        head = start_head(token, num_cpus=head_cpus, num_gpus=head_gpus)
        started.append(head)
        unauthenticated = start_head(None) if open_head else None
        if unauthenticated:
            started.append(unauthenticated)
        tracking = start_tracking_server()
        started.append(tracking)
        address = head.extra["address"]
        wait_until(head, lambda: _get(f"{address}/api/version", token) == 200, "the Ray head")
        shape = {"num_cpus": worker_cpus, "num_gpus": worker_gpus}
        worker = start_worker(head, token, **shape)
        started.append(worker)
        uri = tracking.extra["uri"]
        wait_until(tracking, lambda: _get(f"{uri}/health") == 200, "the MLflow server")
        if unauthenticated:
            wait_until(
                unauthenticated,
                lambda: _get(f"{unauthenticated.extra['address']}/api/version") == 200,
                "the open Ray head",
            )
        wait_until(worker, lambda: alive_nodes(address, token) == 2, "the second node")
        open_address = unauthenticated.extra["address"] if unauthenticated else None
        yield Site(token, address, open_address, uri, started, head, worker, shape)
    finally:  # all at once: SIGTERM to every process of every node, then SIGKILL
        stop_by_pid(sorted(set().union(*(p.processes() for p in started))))
        for process in started:
            process.stop()  # reaps it, removes its folder (nothing is left to signal)
