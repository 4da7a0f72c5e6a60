"""Ray's worker-death lines during a sweep: to the driver log without colour codes, never the
piped console (the trial's own event line names the death: ``tune/deaths.py``).

In this process, with Ray's real printer: the error-message listener of a Ray driver hands what
the GCS publishes to ``ray._private.worker.print_to_stdstream`` by that name, whatever
``log_to_driver`` says; the line is the raylet's own words (in its binary) with the fields Ray
adds to a worker's death.
"""

from __future__ import annotations

import inspect

import pytest

from pdmask.orchestration import driver_logs

worker = pytest.importorskip("ray._private.worker")

DEATH = (
    "A worker died or was killed while executing a task by an unexpected system error. To "
    "troubleshoot the problem, check the logs for the dead worker. RayTask ID: "
    "ffffffffffffffff5a3e0e3d1a7f1b2c01000000 Worker ID: 9d0c1e2f Node ID: 3a4b5c6d Worker IP "
    "address: 127.0.0.1 Worker port: 40123 Worker PID: 4242 Worker exit type: SYSTEM_ERROR "
    "Worker exit detail: Worker unexpectedly exits with a connection error code 2. End of file."
)


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("PDM_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("PDM_DEBUG", raising=False)
    monkeypatch.delenv("RAY_COLOR_PREFIX", raising=False)
    return tmp_path / "state"


def test_ray_s_listener_prints_through_the_printer_pdmask_replaces():
    """The name the routing replaces is the one Ray's error listener calls (a newer Ray that
    prints otherwise fails here, not on a user's console)."""
    source = inspect.getsource(worker.listen_error_messages)
    assert f"{driver_logs.RAY_PRINTER}(" in source and f'"pid": "{driver_logs.RAYLET}"' in source


def test_a_raylet_death_line_goes_to_the_driver_log_without_colour_codes(state, capsys):
    original = worker.print_to_stdstream
    with driver_logs.routed("sweep") as path:
        # as listen_error_messages hands it over
        worker.print_to_stdstream({"lines": [DEATH], "pid": "raylet", "is_err": False}, False)
        # a worker's own line (log_to_driver): printed, without colour codes off a terminal
        worker.print_to_stdstream({"lines": ["hello"], "pid": 4242, "is_err": False}, False)
    out = capsys.readouterr()
    assert "A worker died" not in out.out + out.err
    assert "(pid=4242) hello" in out.out and "\x1b[" not in out.out, repr(out.out)
    logged = path.read_text()
    assert f"(raylet) {DEATH}" in logged and "\x1b[" not in logged
    assert worker.print_to_stdstream is original  # Ray's own again after the sweep
    worker.print_to_stdstream({"lines": ["after"], "pid": "raylet", "is_err": False}, False)
    assert "after" in capsys.readouterr().out


def test_with_pdm_debug_ray_prints_as_it_would(state, capsys, monkeypatch):
    monkeypatch.setenv("PDM_DEBUG", "1")
    with driver_logs.routed("sweep"):
        worker.print_to_stdstream({"lines": [DEATH], "pid": "raylet", "is_err": False}, False)
    assert "A worker died" in capsys.readouterr().out
