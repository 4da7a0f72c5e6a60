"""The MLflow store: where it is, and a check that it can be used before anything launches."""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
from pathlib import Path

from pdmask.errors import TrackingError
from pdmask.paths import default_artifact_root, default_tracking_uri


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


def _check_sqlite_file(uri: str) -> None:
    path = sqlite_path(uri)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        return
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


_CLIENTS: dict[str, object] = {}


def open_client(uri: str | None = None):
    """An ``MlflowClient`` on a store that was checked to be readable and compatible.

    Raises TrackingError (exit 2) with the reason: unreadable file, not an MLflow database, a schema
    from another MLflow version, an unreachable server.
    """
    import mlflow
    from mlflow.tracking import MlflowClient

    uri = resolve_tracking_uri(uri)
    if uri in _CLIENTS:  # checked once per process: reused Ray workers open it per trial
        return _CLIENTS[uri]
    if uri.startswith("sqlite:"):
        _check_sqlite_file(uri)
    elif uri.startswith("file:") or "://" not in uri:
        raise TrackingError(
            f"tracking store {uri}: MLflow 3 refuses the plain file store; use sqlite:///path.db "
            "or an http(s) tracking server"
        )
    mlflow.set_tracking_uri(uri)
    try:
        if uri.startswith("sqlite:"):
            # Creating a client creates and migrates the schema; two processes doing that at once
            # collide ("duplicate column"), so store initialisation is serialised by a file lock.
            with _file_lock(sqlite_path(uri).with_suffix(".init.lock")):
                client = MlflowClient(tracking_uri=uri)
                client.search_experiments(max_results=1)
        else:
            client = MlflowClient(tracking_uri=uri)
            client.search_experiments(max_results=1)
    except Exception as err:  # MLflow raises many types: schema mismatch, connection refused, ...
        msg = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise TrackingError(f"tracking store {uri} cannot be used: {msg}") from None
    _CLIENTS[uri] = client
    return client


# MLflow 3's UI opens an experiment in its GenAI (traces) view unless the experiment says it holds
# model training; these are the tag key and value its UI reads and writes (mlflow 3.17).
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
MODEL_TRAINING_KIND = "custom_model_development"
DESCRIPTION_TAG = "mlflow.note.content"  # the experiment's description in the UI


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
