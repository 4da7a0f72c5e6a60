"""The collective timeout of a VeRL job's training processes, as the job builder sized it.

verl 0.9.1 declares ``actor_rollout_ref.nccl_timeout`` (default 600 s) but reads it nowhere: its
engine workers create the process group with ``initialize_global_process_group_ray(
timeout_second=None)`` (``workers/engine_workers.py``), which leaves torch's default for the
mixed ``cpu:gloo,cuda:nccl`` backend, 30 minutes (``torch.distributed.constants
.default_pg_timeout``). A save ends in a barrier, and the ranks that finish first wait there
for the slowest, so the timeout must outlast a save on the share (``registry/cost.py``).

The job builder puts the sized timeout in ``PDM_COLLECTIVE_TIMEOUT_S`` (and in verl's own key, for
a verl that reads it); the plugin runs ``apply`` right after ``verl.workers.engine_workers`` is
imported, in every process of the job, so the process group gets it. Imports nothing of verl
but that module, and only inside ``apply``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

TIMEOUT_ENV = "PDM_COLLECTIVE_TIMEOUT_S"


def timeout_seconds(env: Mapping[str, str] = os.environ) -> float | None:
    """The job's sized timeout; None outside a job that has one (torch's default stays)."""
    raw = env.get(TIMEOUT_ENV)
    return float(raw) if raw else None


def apply() -> None:
    """Give verl's engine workers' process group the job's timeout where verl passes none."""
    import verl.workers.engine_workers as workers

    original = workers.initialize_global_process_group_ray
    if getattr(original, "pdm_sized", False):
        return

    def initialize(timeout_second=None, backend=None):
        if timeout_second is None:
            timeout_second = timeout_seconds()
        return original(timeout_second=timeout_second, backend=backend)

    initialize.pdm_sized = True
    workers.initialize_global_process_group_ray = initialize
