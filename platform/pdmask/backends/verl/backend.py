"""The VeRL backend's runtime (``registry.backends.VERL``): each trial is a Ray Job on a cluster.

Light to import: verl loads only where a job's config is built or a job runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pdmask.registry.backends import VERL
from pdmask.registry.plan import DEFAULT_VERL_STEPS

if TYPE_CHECKING:
    from pdmask.backends.interface import JobSpec
    from pdmask.registry import Registry, Sweep, Trial


class VerlBackend:
    spec = VERL

    def check(self, trial: Trial) -> list[str]:
        # A job is checked as the sweep's whole set (resources against the cluster, verl's own
        # config validation, the data files): ``job_batch`` before any submission.
        return []

    def planned_steps(self, trial: Trial) -> int | None:
        return trial.steps or DEFAULT_VERL_STEPS

    def eval_metrics(self, cluster: str) -> list[str]:
        from pdmask.backends.verl.jobs import eval_metrics

        return eval_metrics(cluster)

    def job_specs(
        self, reg: Registry, sweep: Sweep, trials: list[Trial], *, cluster: str, tracking_uri: str
    ) -> list[JobSpec]:
        from pdmask.backends.verl.job_spec import job_specs

        return job_specs(reg, sweep, trials, cluster=cluster, tracking_uri=tracking_uri)

    def job_batch(
        self, reg: Registry, sweep: Sweep, trials: list[Trial], *, cluster: str, tracking_uri: str
    ):
        from pdmask.backends.verl.job_batch import VerlJobBatch

        return VerlJobBatch(reg, sweep, trials, cluster=cluster, tracking_uri=tracking_uri)


BACKEND = VerlBackend()
