"""A Ray address that does not parse or where nothing answers is refused before anything starts,
by the dry run as by the real run (issue: ``RAY_ADDRESS=foo`` passed the dry run and the real
run died late with a traceback; an address with nothing listening hung for minutes)."""

from __future__ import annotations

import socket
import time

import pytest

from pdmask.loopback import LOOPBACK
from pdmask.orchestration.cluster.address import CONNECT_TIMEOUT_S, address_problems

from .conftest import ONE_TRIAL, pdm, write_sweep

pytestmark = pytest.mark.processes


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]  # closed again when the test connects


@pytest.mark.parametrize(
    ("address", "jobs", "says"),
    [
        ("foo", False, "names no port"),
        ("foo:port", False, "port is not a number"),
        ("http://127.0.0.1:8265", False, "not a Ray address"),
        ("ray://127.0.0.1:1/x", False, "not a Ray address"),
        ("ray://127.0.0.1:6379", True, "not a Ray address"),
        ("auto", True, "not a Ray address"),
    ],
)
def test_malformed_addresses_say_which_forms_work(address, jobs, says):
    (problem,) = address_problems(address, jobs)
    assert says in problem.message and ("8265" if jobs else "6379") in problem.message
    assert problem.field == address


def test_an_address_with_nothing_listening_is_refused_within_seconds():
    port = _closed_port()
    for address, jobs in [(f"{LOOPBACK}:{port}", False), (f"http://{LOOPBACK}:{port}", True)]:
        started = time.monotonic()
        (problem,) = address_problems(address, jobs)
        assert time.monotonic() - started < CONNECT_TIMEOUT_S + 1
        assert "nothing answers" in problem.message


def test_a_listening_address_and_no_address_pass():
    with socket.socket() as server:
        server.bind((LOOPBACK, 0))
        server.listen()
        port = server.getsockname()[1]
        assert address_problems(f"{LOOPBACK}:{port}", False) == []
        assert address_problems(f"ray://{LOOPBACK}:{port}", False) == []
        assert address_problems(f"http://{LOOPBACK}:{port}", True) == []
    assert address_problems(None, False) == address_problems("auto", False) == []


@pytest.mark.parametrize("dry_run", [True, False])
def test_the_sweep_refuses_a_bad_address_before_creating_anything(project, dry_run):
    write_sweep(project, "one", ONE_TRIAL)
    for address in ("foo", f"{LOOPBACK}:{_closed_port()}"):
        args = ["sweep", "one", *(["--dry-run"] if dry_run else [])]
        out = pdm(project, *args, timeout=120, env={"RAY_ADDRESS": address})
        text = out.stdout + out.stderr
        assert out.returncode == 2, text
        assert f"--address / RAY_ADDRESS: {address}:" in text and "Traceback" not in text
    assert not (project / ".pdm" / "mlflow.db").exists()  # nothing created
