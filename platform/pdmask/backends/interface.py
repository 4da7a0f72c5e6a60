"""The runtime half of a training backend: what pdmask calls to check, plan and run its trials.

Its data half, ``pdmask.registry.backends.BackendSpec``, names the object implementing this by
import path (``runtime``); ``load_backend`` imports it in the process that needs it. Which of the
two launch protocols it implements follows from the spec's ``launch``:

- ``Launch.TUNE`` -> ``TrainsInProcess``: ``train`` runs one trial inside a Ray Tune worker
  (``orchestration/trainable.py``), resuming from ``workdir``.
- ``Launch.RAY_JOBS`` -> ``SubmitsJobs``: ``job_specs`` builds the Ray Jobs that
  ``orchestration/ray_jobs.py`` submits, one per trial.

A runtime module keeps heavy imports (torch, verl) inside its methods: the driver loads it to
check and plan a sweep.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pdmask.errors import BackendUnavailable
from pdmask.registry.backends import BackendSpec, Launch, backend_spec

if TYPE_CHECKING:
    from pdmask.registry import Recipe, Registry, Sweep, Trial

Reporter = Callable[[int, dict[str, float]], None]
"""``reporter(step, metrics)``: called at step 0 (the base model's evaluation) and per RL step."""


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
    ) -> dict[str, float]:
        """Train ``trial`` in this process with ``recipe`` (the trial's own, as planned),
        resuming from ``workdir``'s checkpoint; returns the final metrics. Raises ``ConfigError``
        for input it refuses (never retried), ``TrialFailed`` when training diverges."""
        ...


@runtime_checkable
class SubmitsJobs(Backend, Protocol):
    def job_specs(
        self, reg: Registry, sweep: Sweep, trials: list[Trial], *, cluster: str, tracking_uri: str
    ) -> list[dict[str, Any]]:
        """The Ray Job each trial would be submitted as (``pdm plan --json`` shows them)."""
        ...


_PROTOCOL = {Launch.TUNE: TrainsInProcess, Launch.RAY_JOBS: SubmitsJobs}
_LOADED: dict[str, Backend] = {}


def load_backend(backend: str | BackendSpec) -> Backend:
    """The runtime of ``backend`` (a registered name, or a spec carried from the driver)."""
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
