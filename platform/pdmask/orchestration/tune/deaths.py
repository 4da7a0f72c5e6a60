"""A trial whose worker process died: a failure with its cause, never an interrupt.

A recipe calling ``os._exit``, a segfault, the kernel's OOM killer or Ray's memory monitor end a
Tune trial's worker without a word to its run: the run stays RUNNING and, with no stop requested
on the sweep, was settled KILLED, "interrupted", exit 130. Tune's callbacks (``progress.
SweepProgress``) hand each failed attempt to ``DeathRecorder``, which records one that left no
failure of its own on its run: ``FailureKind.OUT_OF_MEMORY`` when Ray's reason says its memory
monitor killed it or the OOM kill counter of the sweep's memory cgroup rose, else
``FailureKind.WORKER_DIED``, with Ray's exit detail. The same death twice alike is REPEATED
(``tracking.runs.attempt_kind``): the next attempt gives up at once (``given_up``), its setting
is stopped (``canary.py``) and the sweep ends 1 with the death in its summary.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdmask.tracking.runs import (
    TIME_FORMAT,
    FailureKind,
    TrialRun,
    attempt_failure,
    attempt_kind,
    failures_of,
    find_trial_runs,
)

# Ray's words (its GCS's) for an actor whose own process died; a lost node, an owner that died
# or a ``ray.kill`` are said otherwise and are not the trial's death (``cluster/watch.py``).
WORKER_DIED = "its worker process has died"
# Ray's words when its own memory monitor ended a worker (not the list of "common causes"
# every worker death carries, which names the OOM killer whatever happened).
RAY_OOM = re.compile(r"OutOfMemoryError|memory monitor|running low on memory")
_EXIT_DETAIL = re.compile(
    r"Worker exit type: (\S+) Worker exit detail: (.*?)(?:\s+Some common causes|\s+There are "
    r"some potential|\n|$)"
)
_FAILURE_BLOCK = re.compile(r"^Failure # \d+ \(occurred at [^)]*\)\n", re.M)
# The config key with the wall-clock time the sweep's invocation launched its trials: a death
# recorded REPEATED since then is not retried again within it (a later invocation retries).
SINCE_KEY = "launched_at"


def oom_kills(proc: Path = Path("/proc/self"), root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """How many processes the kernel's OOM killer ended in this process's memory cgroup (cgroup
    v2 ``memory.events``, v1 ``memory.oom_control``); None where neither can be read."""
    try:
        lines = (proc / "cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        hierarchy, controllers, path = line.split(":", 2)
        if hierarchy == "0":
            base, name = root, "memory.events"
        elif "memory" in controllers.split(","):
            base, name = root / "memory", "memory.oom_control"
        else:
            continue
        # inside a container the mount's root is a folder of the host's hierarchy: the path's
        # tail names the cgroup under it
        parts = [p for p in path.split("/") if p]
        for folder in [base.joinpath(*parts[i:]) for i in range(len(parts) + 1)]:
            try:
                text = (folder / name).read_text()
            except OSError:
                continue
            found = re.search(r"^oom_kill (\d+)$", text, re.M)
            if found:
                return int(found.group(1))
    return None


def last_failure(error: str | None) -> str:
    """The last failure in Tune's error file of a trial (it appends one per failed attempt)."""
    return _FAILURE_BLOCK.split(error or "")[-1].strip()


def is_worker_death(text: str) -> bool:
    """Whether Ray's account of a failure (``last_failure``) is its worker process dying."""
    return WORKER_DIED in text or bool(RAY_OOM.search(text))


def death_of(error: str | None, oom_killed: bool) -> tuple[FailureKind, str]:
    """The kind and reason (first line: the cause) of a worker death from Tune's error text for
    the attempt (``error``) and whether the OOM kill counter rose (``oom_killed``)."""
    text = last_failure(error)
    found = _EXIT_DETAIL.search(text)
    detail = f"{found.group(1)}: {found.group(2).strip()}" if found else None
    headline = text.splitlines()[0] if text else "no error from Ray"
    said = detail or headline
    if RAY_OOM.search(text):
        return (
            FailureKind.OUT_OF_MEMORY,
            f"out of memory: Ray's memory monitor ended its worker ({said})\n{text}",
        )
    if oom_killed:
        return FailureKind.OUT_OF_MEMORY, (
            f"out of memory: the kernel's OOM killer ended its worker (the memory cgroup's "
            f"oom_kill count rose; Ray: {said})\n{text}"
        )
    return FailureKind.WORKER_DIED, (
        f"worker died: its process ended without a report and no stop was asked ({said})\n{text}"
    )


@dataclass
class DeathRecorder:
    """Records a Tune trial's failed attempt that its run has no failure for (its worker died)."""

    client: Any
    experiment_id: str
    stop_requested: Any  # () -> bool: a signal to the sweep (its trials' ends are interrupts)
    oom_before: int | None = field(default_factory=oom_kills)

    def record(self, trial_hash: str, error: str | None, final: bool) -> tuple[str | None, bool]:
        """``(line, given_up)``: the death's line for the progress display, once recorded on the
        trial's RUNNING run (``final``: Tune will not retry it), and whether it is REPEATED (not
        retried again); ``(None, False)`` when there is nothing to record."""
        if self.stop_requested() or not is_worker_death(last_failure(error)):
            return None, False
        runs = find_trial_runs(self.client, self.experiment_id, trial_hash)
        if not runs or runs[0].info.status != "RUNNING" or attempt_failure(runs[0]):
            return None, False
        now = oom_kills()
        oom = now is not None and self.oom_before is not None and now > self.oom_before
        self.oom_before = now if now is not None else self.oom_before
        kind, reason = death_of(error, oom)
        line = reason.splitlines()[0]
        repeated = attempt_kind(kind, line, failures_of(runs[0])) is FailureKind.REPEATED
        # FAILED when Tune retries no more or the next attempt gives up at once (``given_up``)
        TrialRun(self.client, runs[0].info.run_id, -1, 0, True).fail(
            reason, final=final or repeated, kind=kind
        )
        if repeated:
            return f"{line}: the same death as an earlier attempt's", True
        return line, False


def error_text(trial) -> str | None:
    """What Tune wrote of a trial's failures (its error file, beside the driver: a copy in the
    trial's storage comes later), or None."""
    path = trial.error_file
    try:
        return Path(path).read_text(errors="replace") if path else None
    except OSError:
        return None


def given_up(run, since: str) -> str | None:
    """The reason ``run``'s attempts end at once: its last failure, recorded at or after
    ``since`` (this invocation's launch, ``TIME_FORMAT``), was a death alike an earlier one."""
    failures = failures_of(run)
    last = failures[-1] if failures else {}
    if last.get("kind") != FailureKind.REPEATED or last.get("time", "") < since:
        return None
    return (last.get("reason") or "").splitlines()[0] or None


def launched_at() -> str:
    return time.strftime(TIME_FORMAT)
