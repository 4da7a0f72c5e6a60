"""A sweep's VeRL trials as Ray jobs: the VeRL backend's ``JobBatch`` (``backends.interface``).

Built once per invocation, before anything is submitted: the site settings are read
(``JobSettings.from_env``) and every trial's verl overrides generated, which checks them against
verl's own config classes. What the job loop asks afterwards (resources, the settings a cluster's
nodes cannot share, what ``pdm cluster check`` must prove, the inputs built here, each attempt's
job spec) is answered from those, so that the checks and the jobs cannot disagree.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pdmask.backends.interface import JobResources
from pdmask.backends.verl.cpu_profile import STORE_DIR_ENV
from pdmask.backends.verl.job_spec import VerlJobSpec, job_spec
from pdmask.backends.verl.jobs import on_cpu, prepare_local_inputs, trial_resources
from pdmask.backends.verl.jobs_setup import JobSettings
from pdmask.errors import ConfigError, Problem, ValidationFailed
from pdmask.registry import Sweep, Trial


class VerlJobBatch:
    # The gloo rendezvous file of a job's training processes goes into the folder of the Ray
    # head pdm starts for a CPU sweep, and away with it (``cpu_platform.py``).
    scratch_env = STORE_DIR_ENV

    def __init__(
        self, reg, sweep: Sweep | None, trials: list[Trial], *, cluster: str, tracking_uri: str
    ):
        from pdmask.backends.verl.job_spec import require_verl
        from pdmask.backends.verl.jobs import trial_overrides

        if trials:  # their overrides are checked by verl's config classes
            require_verl()
        self.registry, self.sweep, self.trials = reg, sweep, trials
        self.cluster, self.tracking_uri = cluster, tracking_uri
        self.settings = JobSettings.from_env()  # ConfigError: a site setting is malformed
        self.overrides: dict[str, list[str]] = {}
        self.problems: list[Problem] = []
        for trial in trials:
            try:
                self.overrides[trial.trial_hash] = trial_overrides(
                    trial, sweep, cluster, self.settings, registry=reg
                )
            except ValidationFailed as err:
                self.problems.extend(err.problems)

    def resources(self, trial: Trial) -> JobResources:
        return JobResources(**trial_resources(trial, self.cluster))

    def unshared(self) -> list[Problem]:
        from pdmask.backends.verl.site_inputs import unshared_settings

        s = self.settings
        return unshared_settings(
            checkpoint_dir=str(s.checkpoint_dir) if s.checkpoint_dir else None,
            data_dir=str(s.data_dir) if s.data_dir else None,
            model_root=s.model_root,
            data_built_here=on_cpu(self.cluster),
        )

    def node_inputs(self) -> dict[str, Any]:
        from pdmask.backends.verl.site_inputs import shared_inputs

        # a batch of no trial (`pdm cluster check` alone): every model the profile runs
        inputs = shared_inputs(self.settings, self.cluster, self.trials or None)
        if self.trials and self.sweep is not None:
            # the sweep's peak need; what it wrote under its folder already counts toward it
            inputs["checkpoint_need_bytes"] = self._checkpoint_need_bytes()
            inputs["checkpoint_written"] = self.sweep.name
        return inputs

    def _checkpoint_need_bytes(self) -> int:
        """The sweep's checkpoint root at its peak (``registry.plan.disk_need``)."""
        from pdmask.backends.verl.jobs import workload
        from pdmask.registry.plan import disk_need, plan_rows

        loads = {t.trial_hash: workload(t, self.cluster) for t in self.trials}
        rows = plan_rows(self.trials, self.cluster, workloads=loads)
        return int(disk_need(rows, self.cluster).peak_gb * 1e9)

    def prepare(self, log: Callable[[str], None]) -> None:
        self._check_data()
        prepare_local_inputs(self.trials, log=log)

    def _check_data(self) -> None:
        """Without PDM_DATA_DIR the data must be where `pdm data prepare` wrote it, here."""
        if self.settings.data_dir is not None or on_cpu(self.cluster):
            return  # a path on the nodes (only they can check it), or the tiny task built here
        from pdmask.backends.verl.data import prepared_files

        files = prepared_files()
        missing = [str(files[k]) for k in ("train", "val") if not files[k].exists()]
        if missing:
            raise ConfigError(
                f"no prepared data at {', '.join(missing)}: run `pdm data prepare --dapo ... "
                "--aime24 ... --aime25 ...` first, or set PDM_DATA_DIR to the folder where the "
                "nodes find the files"
            )

    def spec(self, trial: Trial, *, run_id: str, attempt: int) -> VerlJobSpec:
        return job_spec(
            trial,
            self.sweep,
            cluster=self.cluster,
            tracking_uri=self.tracking_uri,
            run_id=run_id,
            attempt=attempt,
            settings=self.settings,
            overrides=self.overrides[trial.trial_hash],
            registry=self.registry,
        )
