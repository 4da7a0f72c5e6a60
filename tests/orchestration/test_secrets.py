"""No credential leaves pdmask (``console.redact``, ``console.QUIET_MLFLOW``).

A real MLflow server reached through a URI with a password, and a Ray token in the environment:
a real embedded sweep (whose trials end their runs, where MLflow prints "View run ... at: <URI>")
and a VeRL dry run in JSON, then everything they printed and wrote (the state folder, the trial
logs and the server's artifacts, every file of them) is searched for the secrets.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from pdmask.console import print_json, redact
from tests.cluster.two_node import start_tracking_server, wait_until
from tests.orchestration.conftest import env_for

PASSWORD = "pdm-s3cret-7f3a9c"
TOKEN = "pdm-token-91c2e4"  # Ray's: never used here (auth is off), only carried
SWEEP = "smoke"


def _hits(folder: Path) -> list[str]:
    """Every file under ``folder`` holding a secret (binary files too: a sqlite store)."""
    found = []
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            if PASSWORD.encode() in data or TOKEN.encode() in data:
                found.append(str(path.relative_to(folder)))
    return found


@pytest.fixture(scope="module")
def server():
    started = start_tracking_server()
    try:
        wait_until(started, lambda: _answers(started.extra["uri"]), "mlflow server")
        yield started
    finally:
        started.stop()


def _answers(uri: str) -> bool:
    try:
        with urllib.request.urlopen(f"{uri}/health", timeout=3) as r:
            return r.status == 200
    except OSError:
        return False


def _pdm(project: Path, uri: str, *args: str) -> subprocess.CompletedProcess:
    env = {**env_for(project), "RAY_AUTH_TOKEN": TOKEN, "MLFLOW_TRACKING_PASSWORD": PASSWORD}
    return subprocess.run(
        [sys.executable, "-m", "pdmask", *args, "--tracking-uri", uri],
        capture_output=True,
        text=True,
        env=env,
        cwd=project,
        timeout=600,
    )


@pytest.mark.slow
@pytest.mark.processes
def test_no_secret_in_what_a_sweep_and_a_verl_dry_run_print_or_write(project, server):
    host = server.extra["uri"].removeprefix("http://")
    uri = f"http://alice:{PASSWORD}@{host}"
    ran = _pdm(project, uri, "sweep", SWEEP)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    dry = _pdm(project, uri, "sweep", SWEEP, "--backend", "verl", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stdout[-3000:] + dry.stderr[-3000:]
    jobs = [t["job"] for t in json.loads(dry.stdout)["trials"]]
    assert jobs and all(
        j["runtime_env"]["env_vars"]["MLFLOW_TRACKING_URI"] == f"http://alice:***@{host}"
        for j in jobs
    )
    for out in (ran, dry):
        assert PASSWORD not in out.stdout + out.stderr and TOKEN not in out.stdout + out.stderr
    logs = list((project / ".pdm" / "logs").rglob("*.log"))
    assert logs, "the sweep wrote no trial log"
    assert _hits(project / ".pdm") == []  # trial logs, Tune's folders, Ray's logs, checkpoints
    artifacts = _hits(server.folder)  # the store and the runs' artifacts (their trial logs)
    assert artifacts == []
    assert list(server.folder.rglob("logs/*.log")), "no trial log reached the runs"


def test_the_rule_hides_a_uri_s_password_and_secret_variables_only(capsys):
    text = (
        "View run x at: http://alice:pw1@host:5000/#/experiments/1 "
        "MLFLOW_TRACKING_PASSWORD=pw2 RAY_AUTH_TOKEN: pw3 max_tokens=512 "
        'env {"HF_TOKEN": "pw4", "AWS_SECRET_ACCESS_KEY": "pw5"} sqlite:///a/b.db'
    )
    shown = redact(text)
    assert not any(f"pw{i}" in shown for i in range(1, 6)), shown
    assert "http://alice:***@host:5000" in shown and "max_tokens=512" in shown
    assert "sqlite:///a/b.db" in shown
    print_json({"env": {"MLFLOW_TRACKING_URI": "http://u:pw6@h:1", "RAY_AUTH_TOKEN": "pw7"}})
    out = capsys.readouterr().out
    assert "pw6" not in out and "pw7" not in out and json.loads(out)["env"]["RAY_AUTH_TOKEN"]
