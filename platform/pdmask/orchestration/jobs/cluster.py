"""A Ray cluster as pdmask's job runner sees it, through the dashboard's HTTP address.

Ray Jobs gives submission, status and logs; the state API gives the nodes' GPUs; the dashboard's
cluster status gives the GPUs in use. Nothing here connects a Ray driver to the cluster, so the
submitting machine needs no Ray node and no open GCS port, only the dashboard's (8265).
"""

from __future__ import annotations

import json
import re
import urllib.request
from dataclasses import dataclass

from pdmask.backends.interface import JobSpec, parse_submission_id
from pdmask.errors import ConfigError
from pdmask.tracking.runs import (
    KIND_OF_EXCEPTION,
    LAST_EXCEPTION,
    FailureKind,
    exception_kind,
)

ACTIVE_STATES = frozenset({"PENDING", "RUNNING"})
TAIL_LINES = 40
TAIL_CHARS = 4000  # pdm.failure_reason is an MLflow tag: keep it well inside the tag limit


# A Python exception's summary line, as a traceback ends (``ValueError: ...``), also when Ray
# prefixes a worker's line with its actor, e.g. ``(TaskRunner pid=12) RuntimeError: ...``; the
# exceptions with a kind of their own are named whatever their names end with (``IncompleteRun``).
_EXCEPTION_NAMES = "|".join(["Error", "Exception", "Exit", *KIND_OF_EXCEPTION])
_EXCEPTION_LINE = re.compile(
    r"^(?:\(\S+ pid=\d+(?:, ip=\S+)?\)\s*)?"
    rf"([A-Za-z_][\w.]*(?:{_EXCEPTION_NAMES})\b(?:\(.*?\))?:.*)$"
)
EXCEPTION_CHARS = 300


def last_exception(log: str) -> str | None:
    """The last exception summary line in a job's log, or None."""
    for line in reversed(log.splitlines()):
        if match := _EXCEPTION_LINE.match(line.strip()):
            return match.group(1)[:EXCEPTION_CHARS]
    return None


class ClusterUnreachable(ConnectionError):
    """The cluster's job API did not answer (refused, timed out, or a dashboard error): the
    runner retries within its bound, then ends the sweep (``errors.ClusterLost``)."""


@dataclass(frozen=True)
class JobView:
    """One Ray job, reduced to what the runner decides on."""

    submission_id: str
    status: str  # PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED
    run_id: str | None  # the MLflow run the job logs into (its MLFLOW_RUN_ID)
    message: str
    exit_code: int | None
    error_type: str | None

    @property
    def active(self) -> bool:
        return self.status in ACTIVE_STATES

    @classmethod
    def of(cls, info) -> JobView:
        env = ((info.runtime_env or {}).get("env_vars") or {}) if info.runtime_env else {}
        return cls(
            submission_id=info.submission_id,
            status=str(getattr(info.status, "value", info.status)),
            run_id=env.get("MLFLOW_RUN_ID") or (info.metadata or {}).get("pdm.run_id"),
            message=info.message or "",
            exit_code=getattr(info, "driver_exit_code", None),
            error_type=str(info.error_type) if getattr(info, "error_type", None) else None,
        )


# What a job's own end says of its kind of failure, beyond its log's last exception.
SIGNAL_EXIT_CODES = range(129, 160)  # a shell's 128 + the signal: killed, not failed


def failure_kind(job: JobView, log: str | None) -> FailureKind:
    """The kind of a job's failure (``tracking.runs.FailureKind``): stopped from outside
    (preempted), its supervisor's node gone (lost node), killed by a signal, else what its log's
    last exception says (an import error, a refused configuration, an engine refusal: never
    retried), else a crash."""
    if job.status == "STOPPED":
        return FailureKind.PREEMPTED
    if job.error_type and "SUPERVISOR_ACTOR_DIED" in job.error_type:
        return FailureKind.LOST_NODE
    if job.exit_code is not None and (job.exit_code < 0 or job.exit_code in SIGNAL_EXIT_CODES):
        return FailureKind.SIGNAL
    error = last_exception(log or job.message)
    return exception_kind(error) if error else FailureKind.CRASH


def describe_failure(job: JobView, log: str) -> str:
    """Why a job failed: its status, exit code, Ray's message and the log's last exception on
    the first line (what the console shows), then the log's last lines."""
    head = f"Ray job {job.submission_id} {job.status}"
    if job.exit_code is not None:
        head += f" (exit code {job.exit_code})"
    message = job.message.partition("last available logs")[0]
    head += f": {message.strip().rstrip(',')}"
    if error := last_exception(log):
        head += f"{LAST_EXCEPTION}{error}"
    head = head[: TAIL_CHARS // 4] + "\n--- log tail ---\n"
    tail = "\n".join(log.rstrip().splitlines()[-TAIL_LINES:])
    room = TAIL_CHARS - len(head)  # the end of a traceback is the informative part
    return head + (tail if len(tail) <= room else "..." + tail[-(room - 3) :])


class JobCluster:
    """Ray Jobs on one cluster: submit-or-attach, job views, failure tails, GPU capacity."""

    def __init__(self, address: str):
        from ray.job_submission import JobSubmissionClient

        from pdmask.orchestration.cluster.auth import headers_for, scrub

        self.headers = headers_for(address)  # the token, when the job API asks for one
        try:
            self.client = JobSubmissionClient(address, headers=self.headers)
        except Exception as err:  # connection refused, bad address, version mismatch, ...
            raise ConfigError(
                f"--address {address}: cannot reach the Ray cluster's job API ({scrub(str(err))}); "
                "give the head's dashboard address, e.g. http://HEAD:8265"
            ) from None
        self.address = self.client.get_address()

    # ---------------------------------------------------------------- jobs
    def pdm_jobs(self, sweep: str) -> dict[str, dict[int, JobView]]:
        """This sweep's jobs on the cluster: trial hash -> attempt -> job."""
        out: dict[str, dict[int, JobView]] = {}
        for info in self.client.list_jobs():
            parsed = parse_submission_id(info.submission_id or "")
            if parsed and parsed[0] == sweep:
                out.setdefault(parsed[1], {})[parsed[2]] = JobView.of(info)
        return out

    def submit(self, spec: JobSpec, metadata: dict[str, str]) -> bool:
        """Submit a job spec; True when its id already existed (someone submitted it: attach)."""
        try:
            self.client.submit_job(
                entrypoint=spec.entrypoint,
                submission_id=spec.submission_id,
                runtime_env=spec.runtime_env,
                metadata=metadata,
            )
        except RuntimeError as err:
            if "already exists" in str(err):
                return True
            raise
        return False

    def view(self, submission_id: str) -> JobView | None:
        """The job, or None when the cluster no longer knows it (``ray job delete``)."""
        try:
            return JobView.of(self.client.get_job_info(submission_id))
        except OSError as err:  # requests' errors are OSErrors: refused, reset, timed out
            raise ClusterUnreachable(f"{type(err).__name__}: {err}") from err
        except RuntimeError as err:  # Ray's client: an HTTP error status
            if "does not exist" in str(err):
                return None
            raise ClusterUnreachable(str(err)[:300]) from err

    def driver_log(self, submission_id: str) -> str | None:
        """The job's driver log (its entrypoint's stdout and stderr), or None when the cluster
        cannot give it now: it is a copy, its absence never fails a trial."""
        try:
            return self.client.get_job_logs(submission_id)
        except Exception:
            return None

    def failure_reason(self, job: JobView, log: str | None = None) -> str:
        """``describe_failure`` of the job; ``log`` is its driver log when the caller has it:
        Ray's message holds only a truncated copy of the log's end."""
        copy = job.message.partition("last available logs")[2]
        if log is None and copy:
            log = copy.partition("\n")[2]
        if log is None:
            log = self.driver_log(job.submission_id) or "(log unavailable)"
        return describe_failure(job, log)

    # ---------------------------------------------------------------- GPUs
    def node_gpus(self) -> list[float]:
        """GPUs of every alive node."""
        from ray.util.state import StateApiClient
        from ray.util.state.common import ListApiOptions, StateResource

        headers = {"Content-Type": "application/json", **self.headers}
        try:
            nodes = StateApiClient(self.address, headers=headers).list(
                StateResource.NODES,
                options=ListApiOptions(detail=True),
                raise_on_missing_output=False,
            )
        except Exception as err:  # Ray's state API raises its own types for network trouble
            raise ClusterUnreachable(f"cannot list the nodes of {self.address}: {err}") from err
        return [
            float((n.resources_total or {}).get("GPU", 0.0)) for n in nodes if n.state == "ALIVE"
        ]

    def gpus_in_use(self) -> float:
        """GPUs held right now by anything on the cluster (0 if the dashboard does not say)."""
        try:
            url = urllib.request.Request(f"{self.address}/api/cluster_status", headers=self.headers)
            with urllib.request.urlopen(url, timeout=10) as r:
                data = json.load(r)
            usage = data["data"]["clusterStatus"]["loadMetricsReport"]["usage"]
            return float(usage.get("GPU", [0.0, 0.0])[0])
        except Exception:  # an older/newer dashboard: count only our own reservations
            return 0.0
