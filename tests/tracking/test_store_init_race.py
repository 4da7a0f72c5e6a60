"""Processes that open a new sqlite store at the same moment all get a usable store.

MLflow creates and migrates the schema on a client's first call; without a lock, the second
process to start that migration fails with "table ... already exists" (seen in CI: a test
watching a sweep opened the store while the sweep was migrating it). The processes here are
released together from one barrier so that their migrations overlap.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.processes]

OPENERS = 3

_OPEN = """
import sys, time
from pathlib import Path
import mlflow.tracking  # imported before the barrier, so that only the migrations overlap
from pdmask.tracking.store import sqlite_client
uri, ready, go = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
ready.touch()
while not go.exists():
    time.sleep(0.005)
print(sqlite_client(uri).search_experiments(max_results=5)[0].name)
"""


def test_processes_opening_a_new_store_together_all_succeed(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    go = tmp_path / "go"
    ready = [tmp_path / f"ready-{i}" for i in range(OPENERS)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _OPEN, uri, str(flag), str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for flag in ready
    ]
    deadline = time.monotonic() + 120
    while not all(f.exists() for f in ready) and time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            break  # one died before the barrier: its error is reported below
        time.sleep(0.02)
    go.touch()
    results = [p.communicate(timeout=120) for p in procs]
    failed = [err for p, (_, err) in zip(procs, results, strict=True) if p.returncode != 0]
    assert not failed, failed[0][-3000:]
    assert [out.strip() for out, _ in results] == ["Default"] * OPENERS
