"""Every trial's log, in the state folder: ``<state>/logs/<sweep>/<run name>.<hash>.log``.

The file name carries the first ``HASH_CHARS`` characters of the trial's hash: two trials of one
run name (cells that differ only where the name does not look, such as ``mu_source``, or a recipe
edited between two invocations) never share a file, and ``pdm logs <hash>`` prints one trial's.

A Tune trial's attempt writes its stdout and stderr there (``captured``): the process's file
descriptors 1 and 2 point at the file for the attempt's duration, so what C code, Ray's logging
and subprocesses print lands there too. The file is opened in append mode: each attempt adds a
header line (``HEADER``, naming the run, its trial hash and run id) and, unless its process was
killed, an end line. At the end of an attempt the file is logged as the run's artifact
``logs/<file name>`` (``upload``), best effort. A VeRL Ray Job's driver log, fetched from the
Jobs API when the job ends, is appended to the same file after its own header (``append``).

``pdm logs`` finds a log by run name or trial-hash prefix (``find``) and reads the run id of its
latest attempt from the header (``run_id``).
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from pdmask.paths import logs_dir

ARTIFACT_DIR = "logs"  # the run's artifact: logs/<run name>.<hash>.log
HEADER = "=== pdm trial log"
_HEADER_FIELDS = re.compile(r"trial (?P<trial_hash>\w+), run (?P<run_id>\w+)")


HASH_CHARS = 8  # of the trial hash, in the log's file name
_HASH_SUFFIX = re.compile(rf"\.(?P<prefix>[0-9a-f]{{{HASH_CHARS}}})$")


def log_path(sweep: str, run_name: str, trial_hash: str) -> Path:
    """Where the trial ``trial_hash`` (named ``run_name``) of ``sweep`` logs (a ``/`` in a name
    cannot make a folder)."""
    stem = f"{run_name.replace(os.sep, '_')}.{trial_hash[:HASH_CHARS]}"
    return logs_folder(sweep) / f"{stem}.log"


def logs_folder(sweep: str) -> Path:
    """The folder of ``sweep``'s trial logs."""
    return logs_dir() / sweep.replace(os.sep, "_")


def run_name_of(path: Path) -> str:
    """The run name a log's file name holds (its stem without the trial-hash suffix)."""
    return _HASH_SUFFIX.sub("", path.stem)


def header(
    run_name: str, trial_hash: str, run_id: str, attempt: int | str, source: str = ""
) -> str:
    """An attempt's first line; ``source``: where its text came from (default: this process)."""
    when = time.strftime("%Y-%m-%dT%H:%M:%S")
    source = source or f"started {when}, pid {os.getpid()}"
    return (
        f"{HEADER}: {run_name} attempt {attempt} (trial {trial_hash}, run {run_id}) {source} ===\n"
    )


@contextmanager
def captured(path: Path, first_line: str) -> Iterator[Path]:
    """This process's stdout and stderr (the file descriptors, not only ``sys.stdout``) appended
    to ``path`` while the block runs, after ``first_line``; restored afterwards. The end line says
    how the block ended; a process ended inside it (the watchdog's ``os._exit``) writes none. A
    log that cannot be opened is one line on stderr, never the trial's failure."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.write(target, first_line.encode())
    except OSError as err:  # the trial's own writes will say what is wrong with the disk
        print(f"pdmask: cannot write the trial log {path}: {err}", file=sys.stderr)
        yield path
        return
    _flush()
    saved = os.dup(1), os.dup(2)
    os.dup2(target, 1)
    os.dup2(target, 2)
    ending = "finished"
    try:
        yield path
    except BaseException as err:
        ending = f"{type(err).__name__}: {err}".strip().splitlines()[0][:300]
        raise
    finally:
        _flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)
        os.write(target, f"=== attempt ended: {ending} ===\n".encode())
        os.close(target)


def _flush() -> None:
    # What Python buffered so far belongs to the file it was printed for.
    for stream in (sys.stdout, sys.stderr):
        with suppress(AttributeError, OSError, ValueError):
            stream.flush()


def append(path: Path, first_line: str, text: str) -> Path:
    """An attempt's log fetched whole (a Ray Job's driver log), after its header line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as log:
        log.write(first_line + text + ("" if text.endswith("\n") or not text else "\n"))
    return path


def upload(client, run_id: str, path: Path) -> bool:
    """Log ``path`` as the run's artifact ``logs/<file name>``. Best effort: a log that cannot be
    uploaded never fails its trial (one line on stderr says why)."""
    try:
        client.log_artifact(run_id, str(path), artifact_path=ARTIFACT_DIR)
        return True
    except Exception as err:
        print(f"pdmask: could not log {path.name} to run {run_id}: {err}", file=sys.stderr)
        return False


def all_logs(sweep: str | None = None) -> list[Path]:
    """Every trial log in the state folder (of ``sweep`` only, if given)."""
    root = logs_dir()
    pattern = f"{sweep}/*.log" if sweep else "*/*.log"
    return sorted(root.glob(pattern)) if root.is_dir() else []


def find(name: str, sweep: str | None = None) -> list[Path]:
    """The logs of run ``name`` (one per trial of that name; its file name with the hash suffix
    names one), else those whose trial hash starts with it."""
    logs = all_logs(sweep)
    named = [p for p in logs if name in (p.stem, run_name_of(p))]
    if named or len(name) < 4:  # a hash prefix shorter than 4 would match by accident
        return named
    return [p for p in logs if any(h.startswith(name) for h, _ in _attempts(p))]


def run_id(path: Path) -> str | None:
    """The MLflow run id of the log's latest attempt."""
    attempts = _attempts(path)
    return attempts[-1][1] if attempts else None


def _attempts(path: Path) -> list[tuple[str, str]]:
    """``(trial hash, run id)`` of each attempt's header line."""
    found = []
    try:
        with path.open(errors="replace") as lines:
            for line in lines:
                if line.startswith(HEADER) and (match := _HEADER_FIELDS.search(line)):
                    found.append((match["trial_hash"], match["run_id"]))
    except OSError:
        pass
    return found
