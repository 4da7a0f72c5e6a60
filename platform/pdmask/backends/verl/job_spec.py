"""A trial as one complete VeRL launch on a Ray cluster: its job spec.

A job spec (printed by ``pdm sweep NAME --backend verl --dry-run``) holds:

- ``entrypoint``: ``python3 -m verl.trainer.main_ppo <overrides>``, shell-quoted, the overrides
  planned by ``jobs.py``;
- ``runtime_env``: the Ray job's environment (it reaches every actor on every node): the pdmask
  plugin module, the MLflow tracking URI, once pdmask has pre-created the trial's run at
  submission ``MLFLOW_RUN_ID``, and the trial's recipe file itself, as planned (``file_recipes``:
  a new baseline is one file in ``recipes/``, on a cluster too);
- ``resources``: nodes, GPUs per node, GPUs, GPU kind (what admission control reserves);
- ``submission_id``: ``pdm-<sweep>-<trial hash>-a<attempt>`` (the dry run shows attempt 1);
- ``engine``: the vLLM rollout layout the engine rules derive from the model's shapes
  (``registry/engine_rules.py``: tensor and expert parallelism, replicas, why);
- ``training``: the actor's engine and, on Megatron, its parallel layout;
- ``workload``: what the trial computes and saves, in the cost model's terms
  (``registry/cost.py``), and ``checkpoints``: the save's bytes, what a running and a finished
  trial hold on the checkpoint root, and the collective timeout sized to a save.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass
from typing import Any

from pdmask.backends.interface import JobResources, JobSpec, submission_id
from pdmask.backends.verl.collectives import TIMEOUT_ENV as COLLECTIVE_TIMEOUT_ENV
from pdmask.backends.verl.jobs import (
    file_recipe_of,
    layout,
    megatron_layout,
    on_cpu,
    overrides_with_recipe,
    trial_resources,
    watchdog_bounds,
    workload,
)
from pdmask.backends.verl.jobs_setup import JobSettings
from pdmask.backends.verl.megatron_job import precision_description
from pdmask.errors import BackendUnavailable, ValidationFailed
from pdmask.registry import CLUSTERS, Sweep, Trial
from pdmask.registry.catalog import training_engine
from pdmask.registry.cost import Workload, collective_timeout, trial_cost


def job_env_vars(
    trial: Trial,
    *,
    tracking_uri: str,
    run_id: str | None,
    attempt: int,
    sid: str,
    cluster: str,
    settings: JobSettings,
    file_recipe=None,
) -> dict[str, str]:
    """The Ray job's environment: verl's plugin and MLflow run, the recipe file it carries (if
    any), the trial's identity, its watchdog's bounds, and on a CPU profile verl's CPU platform."""
    from pdmask.backends.verl.overrides import job_env
    from pdmask.watchdog import WATCHDOG_ENV

    env = job_env(tracking_uri=tracking_uri, run_id=run_id, file_recipe=file_recipe)
    if on_cpu(cluster):
        from pdmask.backends.verl.cpu_profile import CPU_ENV

        env.update(CPU_ENV)
    training = megatron_layout(trial, cluster)
    if training is not None and training.fp8:
        from pdmask.backends.verl.megatron_job import FP8_ENV

        env.update(FP8_ENV)
    env.update(
        {
            WATCHDOG_ENV: watchdog_bounds(trial, cluster, settings).to_env(),
            "PDM_TRIAL_HASH": trial.trial_hash,
            "PDM_ATTEMPT": str(attempt),
            "PDM_SUBMISSION_ID": sid,
            "PYTHONUNBUFFERED": "1",  # the log tail of a failed job ends where it failed
            "HYDRA_FULL_ERROR": "1",  # a config error shows its whole cause in the tail
            # verl 0.9.1 reads no `nccl_timeout`: the plugin passes this on (collectives.py)
            COLLECTIVE_TIMEOUT_ENV: str(
                collective_timeout(
                    trial.model,
                    CLUSTERS[cluster].finished_checkpoint == "hf-weights",
                    training_engine(trial.precision, cluster),
                )
            ),
        }
    )
    return env


@dataclass(frozen=True, kw_only=True)
class VerlJobSpec(JobSpec):
    """A VeRL trial's job, with what the dry run shows besides: its run name, verl's overrides
    (the entrypoint's arguments), its engines' layouts, workload and checkpoint plan, what verl
    runs for its precision, and its MLflow run."""

    run_name: str
    overrides: list[str]
    engine: dict[str, Any]  # the rollout's vLLM layout (``registry.engine_rules``)
    training: dict[str, Any]  # the actor's engine and its parallel layout (``training_layout``)
    workload: dict[str, Any]  # what it computes and saves (``registry.cost.Workload``)
    checkpoints: dict[str, Any]  # save sizes, disk while running and once finished, timeout
    precision: str
    mlflow: dict[str, Any]


def job_spec(
    trial: Trial,
    sweep: Sweep,
    *,
    cluster: str,
    tracking_uri: str,
    run_id: str | None = None,
    attempt: int = 1,
    settings: JobSettings | None = None,
    overrides: list[str] | None = None,
    registry=None,
) -> VerlJobSpec:
    """One trial's complete Ray job: entrypoint, runtime env, resources, submission id."""
    settings = settings or JobSettings.from_env()
    file_recipe, problems = file_recipe_of(trial, registry)  # the recipe file is read once
    if overrides is None:
        overrides = overrides_with_recipe(
            trial, sweep, cluster, settings, None, file_recipe, problems
        )
    elif problems:
        raise ValidationFailed(problems)
    sid = submission_id(sweep.name, trial.trial_hash, attempt)
    load = workload(trial, cluster)
    env = job_env_vars(
        trial,
        tracking_uri=tracking_uri,
        run_id=run_id,
        attempt=attempt,
        sid=sid,
        cluster=cluster,
        settings=settings,
        file_recipe=file_recipe,
    )
    return VerlJobSpec(
        trial_hash=trial.trial_hash,
        run_name=trial.run_name(),
        submission_id=sid,
        attempt=attempt,
        entrypoint=f"{settings.entrypoint} {shlex.join(overrides)}",
        overrides=overrides,
        runtime_env={"env_vars": env},
        resources=JobResources(**trial_resources(trial, cluster)),
        engine=layout(trial, cluster).as_dict(),
        training=_training_plan(trial, cluster),
        workload=load.model_dump(),
        checkpoints=_checkpoint_plan(trial, cluster, load),
        precision=precision_description(trial.precision, megatron_layout(trial, cluster)),
        mlflow={
            "tracking_uri": tracking_uri,
            "experiment": sweep.name,
            "run": run_id or "pre-created with the trial's tags at submission (MLFLOW_RUN_ID)",
            # the label of the engine that trains it: the job sets it on its run at start-up
            "tags": {
                **trial.tags(),
                "pdm.precision_label": trial.precision_label(
                    training_engine(trial.precision, cluster)
                ),
            },
        },
    )


def _training_plan(trial: Trial, cluster: str) -> dict[str, Any]:
    """The actor's engine and, on Megatron, its parallel layout (``training_layout``)."""
    training = megatron_layout(trial, cluster)
    return {"engine": "fsdp"} if training is None else training.as_dict()


def _checkpoint_plan(trial: Trial, cluster: str, load: Workload) -> dict[str, Any]:
    cost = trial_cost(trial.model, cluster, load)
    return {
        "save_gb": cost.save_gb,
        "saves": math.ceil(load.steps / load.save_freq),
        "running_gb": cost.running_disk_gb,
        "finished_keeps": cost.finished_keeps,
        "finished_gb": cost.finished_disk_gb,
        "collective_timeout_s": cost.collective_timeout_s,
    }


def require_verl() -> None:
    """``BackendUnavailable`` unless verl's config classes import (the job builder needs them)."""
    try:
        import pdmask.backends.verl.overrides  # noqa: F401
    except ImportError as err:
        raise BackendUnavailable(
            f"the VeRL job builder needs the verl extra: pip install 'pdmask[verl]' ({err})"
        ) from None


def job_specs(
    reg, sweep: Sweep, trials: list[Trial], *, cluster: str, tracking_uri: str | None
) -> list[VerlJobSpec]:
    """Job specs of every trial (attempt 1, no run yet); every problem of every trial at once."""
    require_verl()
    from pdmask.tracking.store import resolve_tracking_uri

    uri = resolve_tracking_uri(tracking_uri)
    settings = JobSettings.from_env()
    specs, problems = [], []
    for trial in trials:
        try:
            specs.append(
                job_spec(
                    trial,
                    sweep,
                    cluster=cluster,
                    tracking_uri=uri,
                    settings=settings,
                    registry=reg,
                )
            )
        except ValidationFailed as err:
            problems.extend(err.problems)
    if problems:
        raise ValidationFailed(problems)
    return specs
