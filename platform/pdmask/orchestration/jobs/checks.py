"""Checks a job sweep passes before anything is submitted (every problem at once), and the
bounds of its polling."""

from __future__ import annotations

import os

from pdmask.backends.interface import JobBatch, load_backend
from pdmask.errors import ConfigError, Problem, ValidationFailed
from pdmask.registry import BACKENDS, Launch, Registry, Sweep, Trial

POLL_SECONDS = 15.0  # PDM_JOB_POLL_SECONDS overrides (tests poll faster)
# How often a running job's driver log is copied into its trial's log (PDM_JOB_LOG_SECONDS): the
# Jobs API returns a log whole, so not at every poll.
LOG_SECONDS = 30.0
# How long the job API may not answer before the sweep ends (ClusterLost, exit 1): a dashboard
# restart or a network blip passes well within it; a lost head does not come back by waiting.
UNREACHABLE_ENV = "PDM_CLUSTER_UNREACHABLE_SECONDS"
UNREACHABLE_SECONDS = 180.0


def _seconds(env: str, default: float) -> float:
    raw = os.environ.get(env, str(default))
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise ConfigError(f"{env} must be a positive number of seconds, got {raw!r}")
    return value


def poll_seconds() -> float:
    return _seconds("PDM_JOB_POLL_SECONDS", POLL_SECONDS)


def log_seconds() -> float:
    return _seconds("PDM_JOB_LOG_SECONDS", LOG_SECONDS)


def unreachable_seconds() -> float:
    return _seconds(UNREACHABLE_ENV, UNREACHABLE_SECONDS)


def check_fit(
    trials: list[Trial], batch: JobBatch, node_gpus: list[float], cluster_name: str
) -> None:
    """Every trial must fit the cluster's nodes, or it would wait forever."""
    problems = []
    for trial in trials:
        res = batch.resources(trial)
        nodes_fitting = sum(1 for g in node_gpus if g >= res.gpus_per_node)
        if nodes_fitting < res.nodes:
            problems.append(
                Problem(
                    f"trial {trial.run_name()} ({trial.trial_hash})",
                    "--cluster",
                    f"needs {res.nodes} node(s) with {res.gpus_per_node} GPUs ({cluster_name}); "
                    f"the cluster's alive nodes have GPUs {sorted(node_gpus, reverse=True) or 'none'}",
                )
            )
    if problems:
        raise ValidationFailed(problems)


def unshared(uri: str, batch: JobBatch) -> list[Problem]:
    """What a cluster's nodes cannot share, for an address pdm did not start: the tracking store
    (the job loop's own rule, ``shared_storage``) and the backend's paths (``batch.unshared``)."""
    from pdmask.orchestration.cluster.shared_storage import tracking_problems

    return tracking_problems(uri) + batch.unshared()


def require_cluster_check(address, uri, batch: JobBatch, console) -> None:
    """``pdm cluster check`` against ``address`` for the batch's inputs; refuses (exit 2,
    every failed check named with its node) before anything is submitted."""
    from pdmask.orchestration.cluster.check import CheckSpec, render, run_check

    console.print(f"checking the cluster's nodes (pdm cluster check --address {address})...")
    report = run_check(address, CheckSpec.of(uri, batch.node_inputs()))
    render(report, console)
    if not report.ok:
        console.print(
            "nothing was submitted; fix the settings above, or submit without this check "
            "with --skip-cluster-check"
        )
        raise ValidationFailed(report.problems())


def check_batch(reg: Registry, tracking_uri: str, cluster: str | None = None) -> JobBatch:
    """What `pdm cluster check` proves a cluster for: the jobs of the job-submitting backend on
    ``cluster`` (default: a sweep's default profile), of no sweep and no trial (what every node
    must share whatever it trains: tracking, checkpoints, data). ``ConfigError`` when a site
    setting is malformed, or when several backends submit jobs."""
    submitting = sorted(name for name, spec in BACKENDS.items() if spec.launch is Launch.RAY_JOBS)
    if len(submitting) != 1:
        raise ConfigError(f"backends that submit Ray jobs: {submitting}; the check needs one")
    profile = cluster or Sweep.model_fields["cluster"].default
    backend = load_backend(submitting[0])
    return backend.job_batch(reg, None, [], cluster=profile, tracking_uri=tracking_uri)
