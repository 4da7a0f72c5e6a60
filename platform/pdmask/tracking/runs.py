"""One MLflow run per trial: find it by trial hash, start or resume it, log steps, end it.

A trial's identity is its hash (tag ``pdm.trial_hash``), never its run name. A trial with a
FINISHED run is done; any other run of it (RUNNING after a crash, KILLED after Ctrl-C, FAILED
after its retries) is resumed into, so each trial has exactly one run. Steps already logged are
never logged again: a resumed trial that repeats steps after its last checkpoint keeps the first
values, so the metric history has no duplicate or backward steps.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

from pdmask.console import redact
from pdmask.registry import Trial
from pdmask.tracking.metric_names import sanitize_metric
from pdmask.tracking.store import DESCRIPTION_TAG

T = TypeVar("T")
FAILURE_KIND_TAG = "pdm.failure_kind"
FAILURES_TAG = "pdm.failures"  # every attempt's failure: attempt, reason, kind, fingerprint, time
TIME_FORMAT = "%Y-%m-%dT%H:%M:%S"  # a failure's or a note's time (local, sortable as text)


class FailureKind(StrEnum):
    """Why an attempt failed (the run's ``pdm.failure_kind``). The deterministic kinds fail the
    same way on every attempt: never retried, and they stop their setting's queued trials
    (``orchestration/canary.py``); the others are faults that can pass, retried."""

    CRASH = "crash"  # an exception or a non-zero exit: retried (twice alike: REPEATED)
    STALL = "stall"  # no step within the watchdog's bound (``watchdog.py``): retried
    LOST_NODE = "lost-node"  # its node, raylet or Ray job went away: retried
    PREEMPTED = "preempted"  # stopped from outside (the cluster, an operator): retried
    SIGNAL = "signal"  # its process was killed by a signal (OOM killer, SIGKILL): retried
    CONFIG = "config"  # its configuration was refused (``errors.ConfigError``, Hydra's)
    RECIPE = "recipe"  # its recipe's own code raised (``errors.RecipeError``)
    IMPORT = "import"  # a module it needs is missing (ImportError): the install's fault
    ENGINE = "engine"  # the inference engine refused to start with its settings
    INCOMPLETE = "incomplete"  # ended without its planned steps or validations: retried
    WORKER_DIED = "worker-died"  # its process exited with no report and no signal to the sweep
    OUT_OF_MEMORY = "out-of-memory"  # its process was killed for memory (OOM killer, Ray's)
    REPEATED = "repeated"  # a crash with the same fingerprint as an earlier attempt's

    @property
    def deterministic(self) -> bool:
        return self in DETERMINISTIC


DETERMINISTIC = frozenset(
    {
        FailureKind.CONFIG,
        FailureKind.RECIPE,
        FailureKind.IMPORT,
        FailureKind.ENGINE,
        FailureKind.REPEATED,
    }
)
# The kinds that fail the same way again once seen twice alike: the second is REPEATED.
REPEATABLE = frozenset(
    {
        FailureKind.CRASH,
        FailureKind.INCOMPLETE,
        FailureKind.WORKER_DIED,
        FailureKind.OUT_OF_MEMORY,
    }
)
# An exception's type, as a failure's line names it (``ValueError: ...``, ``ray.exceptions.
# RayTaskError(ImportError): ...``): the dotted name and the one in parentheses.
_EXCEPTION_TYPE = re.compile(r"^\s*([A-Za-z_][\w.]*)(?:\(([A-Za-z_][\w.]*)\))?:")
KIND_OF_EXCEPTION = {
    "ImportError": FailureKind.IMPORT,
    "ModuleNotFoundError": FailureKind.IMPORT,
    "ConfigError": FailureKind.CONFIG,
    "ValidationFailed": FailureKind.CONFIG,
    "ConfigAttributeError": FailureKind.CONFIG,  # omegaconf: a key verl's config lacks
    "ConfigCompositionException": FailureKind.CONFIG,  # hydra: overrides that do not compose
    "ConfigKeyError": FailureKind.CONFIG,
    "RecipeError": FailureKind.RECIPE,
    "IncompleteRun": FailureKind.INCOMPLETE,
}
# vLLM's words when its engine core did not start (its cause is printed above them).
ENGINE_REFUSAL = "Engine core initialization failed"
# What an error's fingerprint leaves out: what differs between two attempts failing alike.
_VOLATILE = [
    (re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2})?(?:\.\d+)?"), "<time>"),
    (re.compile(r"\b\d{1,2}:\d{2}:\d{2}(?:\.\d+)?\b"), "<time>"),
    (re.compile(r"(?:[A-Za-z]:)?(?:[\\/][\w.\-@~+]+)+[\\/]?"), "<path>"),
    (re.compile(r"\b(?:0x[0-9a-fA-F]+|[0-9a-fA-F]{8,})\b"), "<id>"),
    (re.compile(r"\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"), "<n>"),
]


def exception_kind(line: str) -> FailureKind:
    """The kind of a failure from its exception line (``Type: message``): deterministic for the
    types of ``KIND_OF_EXCEPTION`` and vLLM's engine refusal, else a crash."""
    if ENGINE_REFUSAL in line:
        return FailureKind.ENGINE
    match = _EXCEPTION_TYPE.match(line)
    names = [n.rpartition(".")[2] for n in (match.groups() if match else ()) if n]
    return next(
        (KIND_OF_EXCEPTION[n] for n in reversed(names) if n in KIND_OF_EXCEPTION), FailureKind.CRASH
    )


def fingerprint(line: str) -> str:
    """An error's identity across attempts: its exception type and message with the times,
    paths, hex ids and numbers that differ between attempts replaced, spaces collapsed."""
    text = line.strip()
    for pattern, placeholder in _VOLATILE:
        text = pattern.sub(placeholder, text)
    return " ".join(text.split())[:300]


def attempt_kind(kind: FailureKind, line: str, earlier: list[dict[str, Any]]) -> FailureKind:
    """The kind an attempt's failure is recorded as: ``kind``, but REPEATED for a failure of a
    ``REPEATABLE`` kind whose fingerprint an earlier attempt of the run already failed with, as
    that kind (``earlier``: the run's ``pdm.failures``): it would fail the same way again."""
    if kind not in REPEATABLE:
        return kind
    alike = (kind, FailureKind.REPEATED)
    seen = {
        f.get("fingerprint") or fingerprint(failure_headline(f.get("reason", "")))
        for f in earlier
        if f.get("kind", FailureKind.CRASH) in alike  # an older pdm recorded no kind: a crash
    }
    return FailureKind.REPEATED if fingerprint(line) in seen else kind


# Where a failure's first line names its exception after saying what failed (a Ray job's
# status, then the last exception its log shows: ``jobs/cluster.describe_failure``).
LAST_EXCEPTION = "; last exception: "


def failure_headline(reason: str) -> str:
    """The one line of a failure reason that names the error: the exception a job's first line
    ends with (``LAST_EXCEPTION``), else the first line (a watchdog's finding, ...)."""
    first = _first_line(reason)
    _, found, exception = first.partition(LAST_EXCEPTION)
    return exception if found else first


def failures_of(run) -> list[dict[str, Any]]:
    """The run's recorded failures, every attempt's (``pdm.failures``)."""
    return json.loads(run.data.tags.get(FAILURES_TAG, "[]"))


def with_retry(fn: Callable[[], T], attempts: int = 8) -> T:
    """Retry a store call that lost a sqlite write lock to a concurrent process."""
    for i in range(attempts):
        try:
            return fn()
        except Exception as err:
            if "database is locked" not in str(err) or i == attempts - 1:
                raise
            time.sleep(0.05 * 2**i)
    raise AssertionError("unreachable")


def _flat(values: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Params as plain values: a nested mapping becomes dotted keys (``recipe_source.hash``), so
    the UI shows (and parallel coordinates offers) values, never a dict's repr."""
    flat = {}
    for key, value in values.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = "" if value is None else str(value)
    return flat


def run_params(trial: Trial, steps: int | None = None) -> dict[str, str]:
    """A trial's MLflow params: its identity as plain values, the recipe's parameters as
    ``params.<name>``, and ``steps`` as trained (``steps``: the backend's count, where the trial
    leaves it to the backend), so that a run never shows a value it did not train with."""
    params = _flat({k: v for k, v in trial.identity().items() if k != "params"})
    params.update(_flat(trial.params, "params."))
    if steps is not None:
        params["steps"] = str(steps)
    return params


def find_trial_runs(client, experiment_id: str, trial_hash: str) -> list:
    return with_retry(
        lambda: client.search_runs(
            [experiment_id],
            filter_string=f"tags.`pdm.trial_hash` = '{trial_hash}'",
            max_results=100,
            order_by=["attributes.start_time DESC"],
        )
    )


def runs_by_hash(client, experiment_id: str) -> dict[str, list]:
    """Every run of an experiment grouped by trial hash (one query, paged)."""
    out: dict[str, list] = {}
    token = None
    while True:
        page = with_retry(
            lambda t=token: client.search_runs([experiment_id], max_results=1000, page_token=t)
        )
        for run in page:
            h = run.data.tags.get("pdm.trial_hash")
            if h:
                out.setdefault(h, []).append(run)
        token = page.token
        if not token:
            return out


def summarize_status(runs: list) -> str:
    """done / failed / running / interrupted / todo from a trial's runs."""
    statuses = {r.info.status for r in runs}
    if "FINISHED" in statuses:
        return "done"
    if "RUNNING" in statuses:
        return "running"
    if "FAILED" in statuses:
        return "failed"
    if statuses:
        return "interrupted"
    return "todo"


def last_logged_step(client, run) -> int:
    """The last step a run holds: its ``pdm.last_step`` tag, or a later step among its metrics.
    The store writes a batch's metrics and its tags in two transactions, so a process killed
    between them leaves the tag a step behind; resuming from the tag alone logged that step twice
    (seen: a SIGKILLed sweep's validation at steps 0, 0, 2, 4)."""
    last = int(run.data.tags.get("pdm.last_step", "-1"))
    for key in run.data.metrics:
        history = with_retry(lambda key=key: client.get_metric_history(run.info.run_id, key))
        last = max([last, *(m.step for m in history)])
    return last


@dataclass
class TrialRun:
    """The open MLflow run of a trial, as seen by the process that trains it."""

    client: Any
    run_id: str
    last_step: int
    attempt: int
    resumed: bool

    @classmethod
    def start_or_resume(
        cls,
        client,
        experiment_id: str,
        trial: Trial,
        tags: dict[str, str],
        log_params: bool = True,
        steps: int | None = None,
    ) -> TrialRun | None:
        """Open the trial's run (None if it already FINISHED). A new run's params are the
        values it trains with (``run_params``; ``steps``: what its backend trains,
        ``Backend.planned_steps``)."""
        runs = find_trial_runs(client, experiment_id, trial.trial_hash)
        if any(r.info.status == "FINISHED" for r in runs):
            return None
        if runs:
            run = runs[0]
            attempt = int(run.data.tags.get("pdm.attempts", "0")) + 1
            if run.info.status == "RUNNING" and attempt_failure(run) is None:
                # Our process holds the trial's claim, so nobody else is in it: the last attempt
                # died, and nobody recorded how (the sweep records a death it saw: tune/deaths.py)
                _append_failure(
                    client,
                    run,
                    "attempt ended without a report (process killed or out of memory)",
                    FailureKind.SIGNAL,
                )
            with_retry(lambda: client.update_run(run.info.run_id, status="RUNNING"))
            if FAILURE_KIND_TAG in run.data.tags:  # a new attempt: its own outcome decides
                with_retry(lambda: client.delete_tag(run.info.run_id, FAILURE_KIND_TAG))
            with_retry(lambda: client.set_tag(run.info.run_id, "pdm.attempts", str(attempt)))
            return cls(client, run.info.run_id, last_logged_step(client, run), attempt, True)
        all_tags = {
            **trial.tags(),
            **tags,
            "pdm.attempts": "1",
            "pdm.last_step": "-1",
            "mlflow.runName": trial.run_name(),
            DESCRIPTION_TAG: trial.description(),
        }
        run = with_retry(
            lambda: client.create_run(experiment_id, run_name=trial.run_name(), tags=all_tags)
        )
        run_id = run.info.run_id
        if log_params:
            from mlflow.entities import Param

            params = run_params(trial, steps)
            with_retry(
                lambda: client.log_batch(run_id, params=[Param(k, v) for k, v in params.items()])
            )
        with_retry(lambda: client.log_dict(run_id, trial.model_dump(mode="json"), "trial.json"))
        # The recipe's code as it trained this run (its hash is the tag pdm.recipe_hash).
        source = trial.recipe_source
        with_retry(lambda: client.log_text(run_id, source.text, f"recipe/{source.file}"))
        return cls(client, run_id, -1, 1, resumed=False)

    def log(self, step: int, metrics: dict[str, float]) -> bool:
        """Log one step's metrics; steps at or below the last logged one are skipped (False)."""
        if step <= self.last_step:
            return False
        from mlflow.entities import Metric, RunTag

        now = int(time.time() * 1000)
        batch = [
            Metric(sanitize_metric(k), float(v), now, step)
            for k, v in metrics.items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        ]
        with_retry(
            lambda: self.client.log_batch(
                self.run_id, metrics=batch, tags=[RunTag("pdm.last_step", str(step))]
            )
        )
        self.last_step = step
        return True

    def finish(self, summary: dict[str, Any] | None = None) -> None:
        """FINISHED, with the backend's summary. Only a complete run may finish: the caller
        asks ``completeness.require_complete`` first."""
        if summary:
            with_retry(lambda: self.client.log_dict(self.run_id, summary, "summary.json"))
        with_retry(lambda: self.client.set_terminated(self.run_id, status="FINISHED"))

    def fail(
        self, reason: str, final: bool = True, kind: FailureKind = FailureKind.CRASH
    ) -> FailureKind:
        """Record a failure (``reason``: its first line names it) and its kind (tag
        ``pdm.failure_kind``), a crash alike an earlier attempt's as REPEATED (``attempt_kind``);
        ``final`` marks the run FAILED (no retry left). Returns the kind recorded: a
        deterministic one is never retried. No credential is kept (``console.redact``)."""
        reason = redact(reason)
        run = with_retry(lambda: self.client.get_run(self.run_id))
        kind = attempt_kind(FailureKind(kind), failure_headline(reason), failures_of(run))
        _append_failure(self.client, run, reason, kind)
        with_retry(lambda: self.client.set_tag(self.run_id, "pdm.failure_reason", reason[:4000]))
        with_retry(lambda: self.client.set_tag(self.run_id, FAILURE_KIND_TAG, kind.value))
        with_retry(
            lambda: self.client.set_terminated(self.run_id, status="FAILED" if final else "RUNNING")
        )
        return kind

    def note(self, text: str) -> None:
        """Add a line to the run's ``pdm.notes`` tag (what happened to it besides training)."""
        run = with_retry(lambda: self.client.get_run(self.run_id))
        notes = json.loads(run.data.tags.get("pdm.notes", "[]"))
        notes.append({"time": time.strftime(TIME_FORMAT), "note": text[:300]})
        with_retry(lambda: self.client.set_tag(self.run_id, "pdm.notes", json.dumps(notes[-20:])))

    def interrupted(self) -> None:
        with_retry(lambda: self.client.set_terminated(self.run_id, status="KILLED"))


def _first_line(reason: str) -> str:
    lines = reason.strip().splitlines()
    return lines[0] if lines else ""


def _append_failure(client, run, reason: str, kind: FailureKind = FailureKind.CRASH) -> None:
    failures = failures_of(run)
    failures.append(
        {
            "attempt": int(run.data.tags.get("pdm.attempts", "1")),
            "reason": reason[:500],
            "kind": kind.value,
            "fingerprint": fingerprint(failure_headline(reason)),
            "time": time.strftime(TIME_FORMAT),
        }
    )
    text = json.dumps(failures[-20:])
    with_retry(lambda: client.set_tag(run.info.run_id, FAILURES_TAG, text))


def take_watchdog_reason(client, run_id: str | None) -> str | None:
    """Why the attempt's watchdog ended it (``pdmask/watchdog.py``), or None; read once: the tag
    is removed so that a later attempt of the run does not carry it. Best effort: the caller
    still has its own account of the failure."""
    from pdmask.watchdog import WATCHDOG_TAG

    if run_id is None:
        return None
    try:
        run = with_retry(lambda: client.get_run(run_id))
        reason = run.data.tags.get(WATCHDOG_TAG)
        if reason:
            with_retry(lambda: client.delete_tag(run_id, WATCHDOG_TAG))
    except Exception:
        return None
    return reason or None


def attempt_failure(run) -> str | None:
    """The first line of the failure its current attempt recorded on ``run``, or None (an
    attempt that was killed records nothing: the next one notes it)."""
    attempt = run.data.tags.get("pdm.attempts")
    failures = failures_of(run)
    own = [f for f in failures if str(f.get("attempt")) == attempt and f.get("reason")]
    return own[-1]["reason"].strip().splitlines()[0] if own else None
