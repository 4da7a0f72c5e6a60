"""A store that cannot be trusted stops a sweep before Ray starts: exit 2, a clear message, no
password shown, nothing launched; and an unreachable server is found in seconds, not minutes."""

from __future__ import annotations

import socket
import sqlite3

import pytest

from .conftest import nothing_launched, pdm

pytestmark = [pytest.mark.slow, pytest.mark.processes]

PASSWORD = "hunter2-s3cret"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # free once closed: a connection is refused at once


@pytest.mark.parametrize("dry_run", [True, False])
def test_an_unreachable_server_fails_fast_and_never_shows_its_password(project, dry_run):
    uri = f"http://alice:{PASSWORD}@127.0.0.1:{_closed_port()}"
    args = ["sweep", "smoke", "--tracking-uri", uri] + (["--dry-run"] if dry_run else [])
    done, seconds = pdm(project, *args)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "cannot be reached" in done.stderr and "alice:***@127.0.0.1" in done.stderr
    assert PASSWORD not in done.stdout + done.stderr
    # MLflow's client alone retried a refused connection for ~253 s; the check gives up in
    # seconds (the bound is loose: start-up under load, not the check, dominates it).
    assert seconds < 60, seconds
    assert nothing_launched(project)


def test_an_empty_store_file_is_refused_not_taken_as_new(project):
    store = project / ".pdm" / "mlflow.db"
    store.touch()
    for args in (("sweep", "smoke"), ("sweep", "smoke", "--dry-run")):
        done, _ = pdm(project, *args)
        assert done.returncode == 2, done.stdout + done.stderr
        assert "empty (0-byte) file" in done.stderr and str(store) in done.stderr
    assert store.stat().st_size == 0  # not silently turned into a new store
    assert nothing_launched(project)


def _corrupt(path) -> None:
    """Overwrite the last page (metric rows written last): sqlite still opens the file (the
    header and the schema page are intact), only a full check sees the damage. Which table a
    page holds depends on the sqlite and MLflow versions, so nothing more is assumed."""
    with sqlite3.connect(path) as con:
        page = con.execute("PRAGMA page_size").fetchone()[0]
        pages = con.execute("PRAGMA page_count").fetchone()[0]
    with open(path, "r+b") as handle:
        handle.seek(page * (pages - 1))
        handle.write(b"\xa5" * page)


def test_a_corrupt_store_is_refused_before_ray_starts(project):
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    store = project / ".pdm" / "mlflow.db"
    client = MlflowClient(f"sqlite:///{store}")
    exp = client.create_experiment("smoke", artifact_location=(project / "art").as_uri())
    for i in range(4):  # enough rows for several pages of data and indexes
        run = client.create_run(exp, tags={"pdm.trial_hash": f"{i:016x}"})
        points = [Metric("critic/score/mean", s / 200, 0, s) for s in range(200)]
        client.log_batch(run.info.run_id, metrics=points)
    _corrupt(store)
    with sqlite3.connect(store) as con:
        assert con.execute("select count(*) from sqlite_master").fetchone()[0] > 0  # still opens
        try:
            report = con.execute("PRAGMA integrity_check").fetchall()
        except sqlite3.DatabaseError as err:
            report = [(str(err),)]
        assert report != [("ok",)]
    done, _ = pdm(project, "sweep", "smoke")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "the database is corrupt" in done.stderr and str(store) in done.stderr
    assert nothing_launched(project)
