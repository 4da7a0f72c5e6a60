"""The MLflow store: where it is, and a check that it can be used before anything launches.

A sqlite store must be an intact MLflow database: an empty (0-byte) file is a lost or truncated
store, not a new one (a new store is a file that does not exist yet), and a file whose pages are
corrupt (``PRAGMA integrity_check``) is refused rather than written into. A tracking server must
answer within seconds: MLflow's own client retries a refused connection for about four minutes.
URIs are shown with their password replaced (``redact``) wherever pdmask prints one.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import socket
import sqlite3
from pathlib import Path
from urllib.parse import urlsplit

from pdmask.console import QUIET_MLFLOW, redact
from pdmask.errors import TrackingError, environment_error
from pdmask.paths import default_artifact_root, default_tracking_uri

# How long a tracking server may take to accept a connection and answer the store check.
SERVER_TIMEOUT_SECONDS = 5


@contextlib.contextmanager
def _file_lock(path: Path):
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def resolve_tracking_uri(uri: str | None = None) -> str:
    """``uri``, else ``$MLFLOW_TRACKING_URI``, else the sqlite store in the state folder."""
    return uri or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri()


def sqlite_path(uri: str) -> Path:
    """The database file of a ``sqlite:///relative`` or ``sqlite:////absolute`` URI."""
    return Path(uri.removeprefix("sqlite:///"))


def _check_sqlite_file(uri: str, integrity: bool) -> None:
    path = sqlite_path(uri)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        return
    if path.is_file() and path.stat().st_size == 0:
        raise TrackingError(
            f"tracking store {uri}: an empty (0-byte) file, not an MLflow store: a lost or "
            "truncated store? Restore it, or remove the file to start a new store"
        )
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as con:
            tables = {
                r[0] for r in con.execute("select name from sqlite_master where type='table'")
            }
    except sqlite3.DatabaseError as err:
        raise TrackingError(
            f"tracking store {uri}: not a readable sqlite database ({err})"
        ) from None
    if tables and "experiments" not in tables:
        raise TrackingError(
            f"tracking store {uri}: a sqlite database, but not an MLflow store "
            f"(tables: {', '.join(sorted(tables)[:5])})"
        )
    if not integrity:
        return
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as con:
            verdict = [r[0] for r in con.execute("PRAGMA integrity_check(5)")]
    except sqlite3.DatabaseError as err:  # pages too damaged to even list the damage
        verdict = [str(err)]
    if verdict != ["ok"]:
        raise TrackingError(
            f"tracking store {uri}: the database is corrupt (integrity check: "
            f"{'; '.join(verdict)}); restore it from a backup, or move it away to start a new one"
        )


def _check_server(uri: str) -> None:
    """A tracking server must accept a connection within SERVER_TIMEOUT_SECONDS."""
    parts = urlsplit(uri)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname or "", port), SERVER_TIMEOUT_SECONDS):
            pass
    except OSError as err:
        reason = "no answer" if isinstance(err, TimeoutError) else (err.strerror or str(err))
        raise TrackingError(
            f"tracking server {redact(uri)} cannot be reached ({reason} within "
            f"{SERVER_TIMEOUT_SECONDS} s): start it, or pass another --tracking-uri"
        ) from None


@contextlib.contextmanager
def _patient_for(seconds: int):
    """MLflow's HTTP client for the store check: one retry, a short timeout (it would retry
    failures with exponential backoff for minutes)."""
    saved = {
        k: os.environ.get(k)
        for k in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT")
    }
    os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "1"
    os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(seconds)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def sqlite_client(uri: str):
    """An ``MlflowClient`` on the sqlite store ``uri``, its schema created or migrated.

    A client's first call creates and migrates the schema; two processes doing that at once
    collide ("table ... already exists", "duplicate column"), so every process that may be the
    first to open a store (a sweep, ``pdm ui``, a test watching a sweep) opens it through here,
    under one file lock next to the database.
    """
    from mlflow.tracking import MlflowClient

    if not os.environ.get("PDM_DEBUG"):
        # MLflow's sqlite layer logs every database error with its traceback, then raises it: the
        # caller reports it (a full disk or a deleted store: one line, errors.environment_error).
        # Its "Creating initial MLflow database tables..." lines go with it.
        logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
    path = sqlite_path(uri)
    with _file_lock(path.with_suffix(".init.lock")):
        new = not path.exists()
        try:
            client = MlflowClient(tracking_uri=uri)
            client.search_experiments(max_results=1)
        except BaseException:
            if new:  # a store this call failed to create (a full disk): leave no empty file
                for leftover in (path, *(Path(f"{path}{s}") for s in ("-journal", "-wal", "-shm"))):
                    leftover.unlink(missing_ok=True)
            raise
    return client


_CLIENTS: dict[str, object] = {}


def open_client(uri: str | None = None, *, integrity: bool = True):
    """An ``MlflowClient`` on a store that was checked to be readable and compatible.
    ``integrity``: run sqlite's page-level check (once per process and store; a trial's worker
    skips it, the sweep checked the store before it started).

    Raises:
        TrackingError: the reason (exit 2): an unreadable, empty or corrupt file, not an MLflow
            database, a schema from another MLflow version, an unreachable server.
    """
    import mlflow
    from mlflow.tracking import MlflowClient

    # MLflow's "View run" lines would print the URI's password: off here and in every process
    # started from here (the sweep's embedded Ray and its workers)
    os.environ.update(QUIET_MLFLOW)
    uri = resolve_tracking_uri(uri)
    if uri in _CLIENTS:  # checked once per process: reused Ray workers open it per trial
        return _CLIENTS[uri]
    shown = redact(uri)
    if uri.startswith("sqlite:"):
        _check_sqlite_file(uri, integrity)
    elif uri.startswith("file:") or "://" not in uri:
        raise TrackingError(
            f"tracking store {shown}: MLflow 3 refuses the plain file store; use sqlite:///path.db "
            "or an http(s) tracking server"
        )
    else:
        _check_server(uri)
    mlflow.set_tracking_uri(uri)
    try:
        if uri.startswith("sqlite:"):
            client = sqlite_client(uri)
        else:
            with _patient_for(2 * SERVER_TIMEOUT_SECONDS):
                client = MlflowClient(tracking_uri=uri)
                client.search_experiments(max_results=1)
    except Exception as err:  # MLflow raises many types: schema mismatch, connection refused, ...
        machine = environment_error(err)  # a full disk, a read-only folder: what to do
        if machine is not None:
            raise TrackingError(f"tracking store {shown}: {machine}") from None
        msg = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise TrackingError(f"tracking store {shown} cannot be used: {redact(msg)}") from None
    _CLIENTS[uri] = client
    return client


# MLflow 3's UI opens an experiment in its GenAI (traces) view unless the experiment says it holds
# model training; these are the tag key and value its UI reads and writes (mlflow 3.17).
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
MODEL_TRAINING_KIND = "custom_model_development"
DESCRIPTION_TAG = "mlflow.note.content"  # an experiment's or a run's description in the UI


def ensure_experiment(client, name: str, description: str | None = None) -> str:
    """The experiment id for a sweep, created with an explicit artifact folder when new.

    The experiment is tagged as model training (so the UI lands on its runs table) and carries
    ``description``; both are set on existing experiments too, so older stores are fixed on the
    next invocation.
    """
    tags = {EXPERIMENT_KIND_TAG: MODEL_TRAINING_KIND}
    if description:
        tags[DESCRIPTION_TAG] = description
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        if exp.lifecycle_stage == "deleted":
            client.restore_experiment(exp.experiment_id)
        for key, value in tags.items():
            if exp.tags.get(key) != value:
                client.set_experiment_tag(exp.experiment_id, key, value)
        return exp.experiment_id
    artifacts = None
    if client.tracking_uri.startswith("sqlite:"):
        artifacts = (default_artifact_root() / name).as_uri()
    try:
        return client.create_experiment(name, artifact_location=artifacts, tags=tags)
    except Exception:
        exp = client.get_experiment_by_name(name)  # created concurrently by another invocation
        if exp is None:
            raise
        return exp.experiment_id
