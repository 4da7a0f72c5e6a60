"""Serve the MLflow UI over the project's store, on loopback, with one worker."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

from pdmask.paths import default_artifact_root
from pdmask.tracking.store import open_client, resolve_tracking_uri


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def start_ui(
    uri: str | None = None, port: int | None = None, host: str = "127.0.0.1"
) -> tuple[subprocess.Popen, str]:
    """Start ``mlflow server`` (checked store, one worker); returns (process, url) once it answers."""
    uri = resolve_tracking_uri(uri)
    open_client(uri)  # fail with a clear message before starting a server on a bad store
    port = port or free_port(host)
    cmd = [
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
    ]
    if uri.startswith("sqlite:"):
        cmd += ["--default-artifact-root", default_artifact_root().as_uri()]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    url = f"http://{host}:{port}"
    deadline = time.time() + 90
    while time.time() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace")[-2000:]
            raise RuntimeError(f"mlflow server exited with code {proc.returncode}:\n{err}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                if resp.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.5)
    stop_ui(proc)
    raise RuntimeError(f"mlflow server did not answer on {url} within 90 s")


def stop_ui(proc: subprocess.Popen) -> None:
    """Stop the server and its workers (its own process group, started by us)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
