"""Each attempt's Ray Job driver log in the trial's log, as the job runs and whole at its end.

A job's trainer prints its evaluation lines (step, headline, masked share, entropy, step time) to
its driver log on the cluster; copying that log only when the job ended left `pdm logs -f` of a
running VeRL trial silent for hours. So the job loop follows each running job: every
``PDM_JOB_LOG_SECONDS`` (30 s; the Jobs API returns the whole log, so not every poll) the part
of the log not yet copied is appended to ``<state>/logs/<sweep>/<run>.<hash>.log`` under the
attempt's header; when the job ends, the rest follows with a line naming how it ended, and the
file goes with the run as its artifact (``trial_logs``). Credentials are hidden on the whole log
before it is cut into parts, so a secret split across two fetches is still found.

An invocation that attaches to a job another one was following starts the attempt's log again
under a header of its own: the copy it cannot see is kept, never merged.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from pdmask.console import redact
from pdmask.orchestration import trial_logs
from pdmask.orchestration.jobs.checks import log_seconds
from pdmask.orchestration.jobs.cluster import JobCluster, JobView


@dataclass
class JobLogs:
    """The driver logs of one sweep's jobs, copied into their trials' logs."""

    cluster: JobCluster
    sweep: str
    every_s: float = field(default_factory=log_seconds)
    # submission id -> characters of its (redacted) driver log already in the trial's log
    _copied: dict[str, int] = field(default_factory=dict)
    _next: dict[str, float] = field(default_factory=dict)  # submission id -> when to fetch again

    def follow(self, trial, sid: str, run_id: str | None) -> None:
        """Copy the whole lines the running job ``sid`` printed since the last copy, when due.

        Raises:
            OSError: the trial's log cannot be written (the caller says so and goes on).
        """
        now = time.monotonic()
        if now < self._next.get(sid, 0.0):
            return
        self._next[sid] = now + self.every_s
        text = redact(self.cluster.driver_log(sid) or "")
        lines = text[: text.rfind("\n") + 1]  # a line still being printed waits for its end
        copied = self._copied.get(sid)
        if copied is None and lines:
            source = f"Ray job {sid} running, followed from {_now()}"
            trial_logs.append(self._path(trial), self._header(trial, sid, run_id, source), lines)
        elif copied is not None and len(lines) > copied:
            trial_logs.extend(self._path(trial), lines[copied:])
        else:
            return
        self._copied[sid] = len(lines)

    def finish(self, trial, view: JobView, run_id: str | None, text: str | None) -> Path | None:
        """The trial's log holding the ended job's driver log ``text`` (None: the cluster could
        not give it now), with what was not yet copied appended and a line naming how the job
        ended; None when nothing of the job's log was written.

        Raises:
            OSError: the trial's log cannot be written.
        """
        sid = view.submission_id
        self._next.pop(sid, None)
        copied = self._copied.pop(sid, None)
        if text is None:  # what was followed is still the trial's (and goes with its run)
            return None if copied is None else self._path(trial)
        path, ended = self._path(trial), f"Ray job {sid} {view.status}, fetched {_now()}"
        if copied is None:
            trial_logs.append(path, self._header(trial, sid, run_id, ended), redact(text))
        else:
            rest = redact(text)[copied:]
            trial_logs.extend(path, rest + ("" if rest.endswith("\n") or not rest else "\n"))
            trial_logs.extend(path, f"=== pdm: {ended} ===\n")
        return path

    def _path(self, trial) -> Path:
        return trial_logs.log_path(self.sweep, trial.run_name(), trial.trial_hash)

    @staticmethod
    def _header(trial, sid: str, run_id: str | None, source: str) -> str:
        attempt = sid.rsplit("-a", 1)[-1]
        return trial_logs.header(
            trial.run_name(), trial.trial_hash, run_id or "unknown", attempt, source
        )


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S")
