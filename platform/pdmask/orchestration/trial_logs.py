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

Each evaluation adds a line of training progress (``tracking/evaluation_line.py``: step,
headline metric, masked share, entropy, step time), so that ``pdm logs -f`` shows it train: a Tune
trial prints it as it reports, a VeRL job's trainer as verl logs a validation step.

Each attempt's part of the file is capped (``max_attempt_bytes``, ``PDM_TRIAL_LOG_MAX_BYTES``):
past the cap its first quarter and its last three quarters are kept and a line between them says
how much was cut, so a recipe printing 100 MB leaves a log (and an artifact) of a few MB whose
end, where a crash is told, is whole. An attempt is cut when it ends; one whose process was
killed is cut when the next attempt starts.

``pdm logs`` finds a log by run name or trial-hash prefix (``find``) and reads the run id of its
latest attempt from the header (``run_id``).
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from pdmask.console import redact
from pdmask.paths import logs_dir

ARTIFACT_DIR = "logs"  # the run's artifact: logs/<run name>.<hash>.log
HEADER = "=== pdm trial log"
MAX_BYTES_ENV = "PDM_TRIAL_LOG_MAX_BYTES"
DEFAULT_MAX_BYTES = 8 * 2**20  # per attempt: a crash's traceback and far more fit
_CUT_CHUNK = 2**20  # how much of the kept tail is moved at once
_MIN_CUT = 4096  # a cut smaller than this is not made (the line saying so would not fit)
_CUT_LINE = re.compile(rb"\n=== pdm: ([\d,]+) bytes of this attempt's output cut here [^\n]*\n")


def max_attempt_bytes() -> int:
    """How much of an attempt's output its log keeps (``PDM_TRIAL_LOG_MAX_BYTES``, else 8 MiB)."""
    value = os.environ.get(MAX_BYTES_ENV, "")
    return int(value) if value.isdigit() and int(value) > 0 else DEFAULT_MAX_BYTES


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
        _cap(path, _last_attempt_start(path))  # a killed attempt's part was never cut
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        start = os.fstat(target).st_size
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
        _cap(path, start)
        os.write(target, f"=== attempt ended: {ending} ===\n".encode())
        os.close(target)


def _flush() -> None:
    # What Python buffered so far belongs to the file it was printed for.
    for stream in (sys.stdout, sys.stderr):
        with suppress(AttributeError, OSError, ValueError):
            stream.flush()


def append(path: Path, first_line: str, text: str) -> Path:
    """An attempt's log fetched whole (a Ray Job's driver log), after its header line, its
    credentials hidden (``console.redact``)."""
    text = redact(text)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as log:
        start = log.seek(0, os.SEEK_END)
        log.write(first_line + text + ("" if text.endswith("\n") or not text else "\n"))
    _cap(path, start)
    return path


def extend(path: Path, text: str) -> Path:
    """More of the attempt ``path`` ends with (a running Ray Job's driver log as it grows: see
    ``jobs/job_logs.py``), its credentials hidden; the attempt's cap covers all its parts."""
    with path.open("a") as log:
        log.write(redact(text))
    _cap(path, _last_attempt_start(path))
    return path


def _last_attempt_start(path: Path) -> int:
    """Where the file's last attempt begins (its header line's offset; 0 for none), read in
    blocks: a killed attempt may have left gigabytes without a line break."""
    marker = b"\n" + HEADER.encode()
    start, offset, carry = 0, 0, b""
    try:
        with path.open("rb") as log:
            while block := log.read(_CUT_CHUNK):
                data = carry + block
                if (found := data.rfind(marker)) >= 0:
                    start = offset - len(carry) + found + 1
                carry = data[-len(marker) :]
                offset += len(block)
    except OSError:
        pass
    return start


def offset_after_cut(path: Path, offset: int) -> int:
    """Where a reader that had read ``offset`` bytes of ``path`` goes on once a cut shrank it
    (``pdm logs -f``): the same byte in the cut file, or the cut line when it was inside the part
    cut out (the kept tail follows it)."""
    data = path.read_bytes()
    cuts = list(_CUT_LINE.finditer(data))
    if not cuts:
        return min(offset, len(data))
    cut = cuts[-1]
    removed = int(cut[1].replace(b",", b""))
    if offset <= cut.start():
        return offset
    if offset <= cut.start() + removed:
        return cut.start()
    return min(offset - removed + len(cut[0]), len(data))


def _cap(path: Path, start: int) -> None:
    """Cut the part of ``path`` from ``start`` on to ``max_attempt_bytes``: its first quarter
    and last three quarters stay, with a line between saying what was cut. Best effort: a log
    that cannot be cut stays whole. (Its own descriptor: Linux's pwrite ignores the offset of
    one opened to append.)"""
    limit = max_attempt_bytes()
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return  # no log yet, or none that can be written: nothing to cut
    try:
        size = os.fstat(fd).st_size
        if size - start <= limit + _MIN_CUT:
            return
        head_end = start + limit // 4
        tail_start = size - (limit - limit // 4)
        cut = (
            f"\n=== pdm: {tail_start - head_end:,} bytes of this attempt's output cut here "
            f"(its first {limit // 4:,} and last {limit - limit // 4:,} bytes kept; "
            f"{MAX_BYTES_ENV}) ===\n"
        ).encode()
        # The tail moves forward in chunks, each read before anything after it is written.
        write_at = head_end + len(cut)
        os.pwrite(fd, cut, head_end)
        for offset in range(tail_start, size, _CUT_CHUNK):
            chunk = os.pread(fd, min(_CUT_CHUNK, size - offset), offset)
            os.pwrite(fd, chunk, write_at)
            write_at += len(chunk)
        os.ftruncate(fd, write_at)
    except OSError as err:
        print(f"pdmask: could not cut the trial log to {limit} bytes: {err}", file=sys.stderr)
    finally:
        os.close(fd)


def upload(client, run_id: str, path: Path) -> bool:
    """Log ``path`` as the run's artifact ``logs/<file name>``, its last attempt cut first (the
    watchdog uploads a stalled attempt's log before its process ends) and its credentials hidden
    (what a process printed into it: ``console.redact``). Best effort: a log that cannot be
    uploaded never fails its trial (one line on stderr says why)."""
    _cap(path, _last_attempt_start(path))
    try:
        with tempfile.TemporaryDirectory() as scratch:
            copy = Path(scratch) / path.name
            copy.write_text(redact(path.read_text(errors="replace")))
            client.log_artifact(run_id, str(copy), artifact_path=ARTIFACT_DIR)
        return True
    except Exception as err:
        print(f"pdmask: could not log {path.name} to run {run_id}: {err}", file=sys.stderr)
        return False


def sweeps() -> list[str]:
    """The sweeps that have a folder of trial logs."""
    root = logs_dir()
    return sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []


def all_logs(sweep: str | None = None) -> list[Path]:
    """Every trial log in the state folder (of ``sweep`` only, if given). ``sweep`` is compared
    with the folders' names, never made a path: ``..`` or a glob finds nothing."""
    chosen = [s for s in sweeps() if sweep is None or s == sweep]
    return sorted(log for s in chosen for log in (logs_dir() / s).glob("*.log"))


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
