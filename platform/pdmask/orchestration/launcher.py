"""What a launch kind does for the runner: the ``Launcher`` contract, and each kind's, loaded lazily.

The runner (``runner.run_sweep``) does the head and the tail of every invocation once: it opens
the session, skips the finished trials, settles, sums up, draws and sets the exit code. Between
them a launcher runs the trials the backend's launch kind says (``BackendSpec.launch``):

- ``Launch.TUNE``: ``tune.launcher.TuneLauncher``, an embedded Ray (or ``--address``'s cluster)
  and Ray Tune, one CPU per trial, retries on crashes;
- ``Launch.RAY_JOBS``: ``jobs.launcher.JobsLauncher``, each trial a Ray job on a cluster (or on a
  head pdm starts here for a CPU profile), admitted by GPUs, polled, retried.

Each is imported only where a sweep of its kind runs, the way backends are (``load_launcher``):
`pdm validate` and the dry run never pay for Ray Tune.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from pdmask.registry.backends import Launch

if TYPE_CHECKING:
    from pdmask.orchestration.session import SweepSession, Todo


@dataclass(frozen=True)
class Launched:
    """What a launch leaves for the runner's tail beside the runs it settles."""

    # trial hashes whose Ray jobs run on after this invocation: their runs stay RUNNING
    detached: frozenset[str] = field(default_factory=frozenset)
    # trial hashes another copy of the sweep trained while this one waited on their claims (or
    # found finished when it came to them): FINISHED, but not by this invocation
    trained_elsewhere: frozenset[str] = field(default_factory=frozenset)
    lost_cluster: str | None = None  # why the launch ended early: its Ray cluster was lost
    resume_note: str | None = None  # what to say when interrupted (None: the runner's own)


@runtime_checkable
class Launcher(Protocol):
    def check(self, session: SweepSession) -> None:
        """Refuse, before skip-finished and before anything starts, what this launch kind cannot
        run (``ConfigError``; ``ValidationFailed`` with every problem at once)."""
        ...

    def launch(self, session: SweepSession, todo: Todo) -> Launched:
        """Run ``todo`` (never empty) until every trial ended or a stop was requested
        (``session.interrupts``); what must live until the runs are settled is held by the
        session (``SweepSession.hold``)."""
        ...


# The launcher of each launch kind, as ``module:class``, imported on first use.
LAUNCHERS = {
    Launch.TUNE: "pdmask.orchestration.tune.launcher:TuneLauncher",
    Launch.RAY_JOBS: "pdmask.orchestration.jobs.launcher:JobsLauncher",
}


def load_launcher(kind: Launch) -> Launcher:
    """A new launcher for ``kind`` (one per invocation: it keeps what its check found)."""
    module_name, _, attribute = LAUNCHERS[kind].partition(":")
    return getattr(importlib.import_module(module_name), attribute)()
