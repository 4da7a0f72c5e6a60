"""Serve the MLflow UI over the project's store: loopback only, one worker, no orphans.

The server runs under :mod:`pdmask.process_group`, so it and its helpers go down with the process
that started it, however that process ends (Ctrl-C, SIGTERM, SIGKILL). Its output goes to
``<state>/ui/mlflow-server.log`` (a pipe nobody reads would fill up and stall the server).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from pdmask.errors import ConfigError
from pdmask.loopback import LOOPBACK, free_port
from pdmask.paths import default_artifact_root, state_dir
from pdmask.tracking.store import open_client, resolve_tracking_uri

START_TIMEOUT_S = 120
UI_APP = "pdm-training"  # tracking/ui_app.py, registered as an `mlflow.app` entry point
# pdmask runs no MLflow server jobs (GenAI scorers, prompt optimisation): without them the server
# starts no job runner and no Huey consumers, 8 fewer processes.
SERVER_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def require_free_port(host: str, port: int) -> None:
    """ConfigError when ``port`` on ``host`` is taken: the server would fail to bind while the
    other server's ``/health`` answered for it, and its links would show another store."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        # as the server binds: a port left in TIME_WAIT by a stopped server is free
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as err:
            raise ConfigError(
                f"port {port} on {host} is in use ({err.strerror}; another `pdm ui`?): choose "
                "another with --port, or --port 0 for any free one"
            ) from None


def runs_table_url(ui_url: str, experiment_id: str) -> str:
    """The deep link to an experiment's runs table (MLflow 3 would open its traces view)."""
    return f"{ui_url}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"


def server_log() -> Path:
    path = state_dir() / "ui" / "mlflow-server.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def start_ui(
    uri: str | None = None, port: int | None = None, host: str = LOOPBACK
) -> tuple[subprocess.Popen, str]:
    """Start ``mlflow server`` (checked store, one worker); returns (process, url) once it answers.

    The process is the group's guard: stop it with :func:`stop_ui`.
    """
    uri = resolve_tracking_uri(uri)
    open_client(uri)  # fail with a clear message before starting a server on a bad store
    if port:
        require_free_port(host, port)
    port = port or free_port(host)
    server = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        uri,
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        "1",
        "--app-name",
        UI_APP,
    ]
    if uri.startswith("sqlite:"):
        server += ["--default-artifact-root", default_artifact_root().as_uri()]
    guard = [sys.executable, "-m", "pdmask.process_group", str(os.getpid()), "--", *server]
    log_path = server_log()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            guard,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, which it takes down when it stops
            env={**os.environ, **SERVER_ENV},
        )
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
    try:
        _wait_until_serving(proc, url, log_path)
    except BaseException:  # Ctrl-C or SIGTERM while it starts included: nothing is left running
        stop_ui(proc)
        raise
    return proc, url


def _wait_until_serving(proc: subprocess.Popen, url: str, log_path: Path) -> None:
    deadline = time.time() + START_TIMEOUT_S
    while time.time() < deadline:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"mlflow server exited with code {proc.returncode}:\n{tail}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                # the answer must be our server's: alive after it (one that failed to bind exits)
                if resp.status == 200 and proc.poll() is None:
                    return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(
        f"mlflow server did not answer on {url} within {START_TIMEOUT_S} s (log: {log_path})"
    )


def stop_ui(proc: subprocess.Popen, timeout: float = 30) -> None:
    """Stop the server and every process of its group (the guard waits for them)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
