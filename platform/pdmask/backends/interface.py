"""The runtime half of a training backend: what pdmask calls to check, plan and run its trials.

Its data half, ``pdmask.registry.backends.BackendSpec``, names the object implementing this by
import path (``runtime``); ``load_backend`` imports it in the process that needs it. Which of the
two launch protocols it implements follows from the spec's ``launch``:

- ``Launch.TUNE`` -> ``TrainsInProcess``: ``train`` runs one trial inside a Ray Tune worker
  (``orchestration/tune/trainable.py``), resuming from ``workdir``.
- ``Launch.RAY_JOBS`` -> ``SubmitsJobs``: ``job_batch`` checks and builds a sweep's trials as
  Ray Jobs (a ``JobBatch``), which ``orchestration/jobs/`` admits, submits, polls, retries and
  settles, one job per trial attempt, under the submission ids ``submission_id`` gives.

A runtime module keeps heavy imports (torch, verl) inside its methods: the driver loads it to
check and plan a sweep.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pdmask.errors import BackendUnavailable, ConfigError, Problem
from pdmask.registry.backends import BackendSpec, Launch, backend_spec

if TYPE_CHECKING:
    from pdmask.registry import Recipe, Registry, Sweep, Trial

Reporter = Callable[[int, dict[str, float]], None]
"""``reporter(step, metrics)``: called at step 0 (the base model's evaluation, ``eval_metrics``)
and per RL step, whose metrics include ``critic/score/mean`` (verl's mean reward): a setting's
canary has proven it once its run holds both (``orchestration/canary.py``). A job logs the same
into its run."""


@runtime_checkable
class Backend(Protocol):
    spec: BackendSpec

    def check(self, trial: Trial) -> list[str]:
        """Why ``trial`` cannot run here (empty: it can), found before anything launches."""
        ...

    def planned_steps(self, trial: Trial) -> int | None:
        """How many RL steps the trial will report (progress and ETA; None: unknown)."""
        ...

    def eval_metrics(self, cluster: str) -> list[str]:
        """The evaluation metrics its trials log on ``cluster``, as MLflow stores them."""
        ...


@runtime_checkable
class TrainsInProcess(Backend, Protocol):
    def train(
        self,
        trial: Trial,
        recipe: Recipe,
        *,
        reporter: Reporter,
        workdir: Path,
        should_stop: Callable[[], bool],
        note: Callable[[str], None],
    ) -> dict[str, float]:
        """Train ``trial`` in this process with ``recipe`` (the trial's own, as planned),
        resuming from ``workdir``'s checkpoint; returns the final metrics. ``note(line)``: what
        happened to the trial besides training (a checkpoint found unreadable and moved aside,
        where it resumed from), printed to the trial's log and kept in its run's ``pdm.notes``.
        Raises ``ConfigError`` for input it refuses (never retried), ``TrialFailed`` when
        training diverges."""
        ...


# A trial attempt's Ray job id: ``pdm-<sweep>-<trial hash>-a<attempt>``, the same on every
# machine, so that a second submission of one attempt is refused by Ray and means "already
# submitted" (two invocations of one sweep never run a trial twice).
SUBMISSION_PREFIX = "pdm-"


def submission_id(sweep: str, trial_hash: str, attempt: int) -> str:
    """The Ray job id of a trial's attempt (see ``SUBMISSION_PREFIX``)."""
    return f"{SUBMISSION_PREFIX}{sweep}-{trial_hash}-a{attempt}"


def parse_submission_id(sid: str) -> tuple[str, str, int] | None:
    """``(sweep, trial hash, attempt)`` of a pdmask submission id, None for any other job."""
    if not sid or not sid.startswith(SUBMISSION_PREFIX):
        return None
    body, _, attempt = sid[len(SUBMISSION_PREFIX) :].rpartition("-a")
    sweep, _, trial_hash = body.rpartition("-")
    if not (sweep and len(trial_hash) == 16 and attempt.isdigit()):
        return None
    if any(c not in "0123456789abcdef" for c in trial_hash):
        return None
    return sweep, trial_hash, int(attempt)


@dataclass(frozen=True)
class JobResources:
    """What one trial's job occupies: what must fit the cluster's nodes, and what admission
    reserves of the cluster's free GPUs."""

    nodes: int
    gpus_per_node: int
    gpus: int
    gpu_kind: str  # the GPU kind of the cluster profile (CPU for a job that takes none)

    def __str__(self) -> str:
        return f"{self.nodes}x{self.gpus_per_node} {self.gpu_kind}"


@dataclass(frozen=True)
class JobSpec:
    """One trial attempt as a Ray job: what the job loop submits. A backend's own spec may add
    fields (a subclass), which the dry run shows with these (``to_json``)."""

    trial_hash: str
    submission_id: str  # ``submission_id(sweep, trial hash, attempt)``
    attempt: int
    entrypoint: str  # the job's shell command
    runtime_env: dict[str, Any]  # Ray's: ``env_vars`` reach every process of the job
    resources: JobResources

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@runtime_checkable
class JobBatch(Protocol):
    """One sweep's trials as Ray jobs, as a job-submitting backend checked and built them
    (``SubmitsJobs.job_batch``): all the job loop asks of the backend, from the check before
    anything is submitted to the last attempt's spec."""

    problems: list[Problem]
    """Every problem of every trial's job (empty: all of them can be submitted)."""
    scratch_env: str | None
    """The environment variable through which the jobs find a folder that lives and dies with a
    Ray head pdm starts on this machine for them (None: they need none)."""

    def resources(self, trial: Trial) -> JobResources:
        """What the trial's job occupies."""
        ...

    def unshared(self) -> list[Problem]:
        """The settings the jobs read that the nodes of a cluster cannot share (paths only the
        submitter has), each naming its setting and the fix: refused before a cluster pdm did
        not start is sent a job. The tracking URI is the job loop's own check."""
        ...

    def node_inputs(self) -> dict[str, Any]:
        """What every node must reach, as ``pdm cluster check`` checks it from each node:
        ``checkpoint_root``, ``data_files``, ``model_root``, ``model_paths``,
        ``data_built_here``; optionally ``hub_models``, ``checkpoint_need_bytes``, ``versions``
        (package -> pinned version, on every node) and ``training`` (what a node running the
        jobs' workers must have: ``orchestration/cluster/check.py`` ``CheckSpec``)."""
        ...

    def prepare(self, log: Callable[[str], None]) -> None:
        """Make what the jobs read that this machine provides, and check the rest is there,
        before the first submission (``ConfigError`` names what is missing)."""
        ...

    def spec(self, trial: Trial, *, run_id: str, attempt: int) -> JobSpec:
        """The trial's job for this attempt, logging into MLflow run ``run_id``."""
        ...


@runtime_checkable
class SubmitsJobs(Backend, Protocol):
    def job_specs(
        self, reg: Registry, sweep: Sweep, trials: list[Trial], *, cluster: str, tracking_uri: str
    ) -> list[JobSpec]:
        """The Ray Job each trial would be submitted as (attempt 1, no run yet: the dry run
        shows them)."""
        ...

    def job_batch(
        self,
        reg: Registry,
        sweep: Sweep | None,
        trials: list[Trial],
        *,
        cluster: str,
        tracking_uri: str,
    ) -> JobBatch:
        """``trials`` (of ``sweep``, on cluster profile ``cluster``) checked and built as jobs
        that log into ``tracking_uri``; their problems are the batch's, never raised, so that the
        job loop reports them with its own, all at once. Nothing is prepared or submitted. No
        sweep and no trials: what every node must share whatever it trains (`pdm cluster
        check`'s ``node_inputs``). Raises ``ConfigError`` for a malformed site setting."""
        ...


_PROTOCOL = {Launch.TUNE: TrainsInProcess, Launch.RAY_JOBS: SubmitsJobs}
_LOADED: dict[str, Backend] = {}


def load_backend(backend: str | BackendSpec) -> Backend:
    """The runtime of ``backend`` (a registered name, or a spec carried from the driver).

    Raises:
        BackendUnavailable: its runtime cannot be imported (an optional dependency missing) or is
            not the launch protocol its spec names.
    """
    spec = backend if isinstance(backend, BackendSpec) else backend_spec(backend)
    if spec.runtime not in _LOADED:
        module_name, _, attribute = spec.runtime.partition(":")
        try:
            runtime = getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError) as err:
            raise BackendUnavailable(
                f"backend {spec.name!r}: cannot load its runtime {spec.runtime!r} ({err})"
            ) from err
        protocol = _PROTOCOL[spec.launch]
        if not isinstance(runtime, protocol) or runtime.spec != spec:
            raise BackendUnavailable(
                f"backend {spec.name!r}: {spec.runtime} is not a {protocol.__name__} for this spec"
            )
        _LOADED[spec.runtime] = runtime
    return _LOADED[spec.runtime]


def planned_steps(trial: Trial, backend: str | BackendSpec | None = None) -> int | None:
    """The RL steps ``trial`` trains on ``backend`` (default: its own; a spec carried from the
    driver where the backend is registered there only): ``Backend.planned_steps``, or None when
    the backend cannot say, because it refuses the trial's config or cannot be loaded here (the
    trial's own attempt meets why and fails with it; the others go on)."""
    try:
        return load_backend(backend or trial.backend).planned_steps(trial)
    except (ConfigError, BackendUnavailable):
        return None
