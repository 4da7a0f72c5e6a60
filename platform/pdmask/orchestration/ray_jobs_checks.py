"""Checks a VeRL job sweep passes before anything is submitted (every problem at once)."""

from __future__ import annotations

import os

from pdmask.backends.verl.jobs import trial_overrides, trial_resources
from pdmask.backends.verl.jobs_setup import JobSettings
from pdmask.errors import ConfigError, Problem, ValidationFailed
from pdmask.registry import Trial

POLL_SECONDS = 15.0  # PDM_JOB_POLL_SECONDS overrides (tests poll faster)
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


def unreachable_seconds() -> float:
    return _seconds(UNREACHABLE_ENV, UNREACHABLE_SECONDS)


def build_all(
    sweep, trials: list[Trial], cluster_name: str, settings: JobSettings, registry=None
) -> dict[str, list[str]]:
    """Every trial's verl overrides by trial hash; raises with every trial's problems at once."""
    built, problems = {}, []
    for trial in trials:
        try:
            built[trial.trial_hash] = trial_overrides(
                trial, sweep, cluster_name, settings, registry=registry
            )
        except ValidationFailed as err:
            problems.extend(err.problems)
    if problems:
        raise ValidationFailed(problems)
    return built


def check_data(settings: JobSettings, cluster_name: str) -> None:
    """Without PDM_DATA_DIR the data must be where `pdm data prepare` wrote it, here."""
    from pdmask.backends.verl.jobs import on_cpu

    if settings.data_dir is not None or on_cpu(cluster_name):
        return  # a path on the nodes (only they can check it), or the tiny task built here
    from pdmask.backends.verl.data import prepared_files

    files = prepared_files()
    missing = [str(files[k]) for k in ("train", "val") if not files[k].exists()]
    if missing:
        raise ConfigError(
            f"no prepared data at {', '.join(missing)}: run `pdm data prepare --dapo ... --aime24 "
            "... --aime25 ...` first, or set PDM_DATA_DIR to the folder where the nodes find the files"
        )


def check_fit(trials: list[Trial], node_gpus: list[float], cluster_name: str) -> None:
    """Every trial must fit the cluster's nodes, or it would wait forever."""
    problems = []
    for trial in trials:
        res = trial_resources(trial, cluster_name)
        nodes_fitting = sum(1 for g in node_gpus if g >= res["gpus_per_node"])
        if nodes_fitting < res["nodes"]:
            problems.append(
                Problem(
                    f"trial {trial.run_name()} ({trial.trial_hash})",
                    "--cluster",
                    f"needs {res['nodes']} node(s) with {res['gpus_per_node']} GPUs ({cluster_name}); "
                    f"the cluster's alive nodes have GPUs {sorted(node_gpus, reverse=True) or 'none'}",
                )
            )
    if problems:
        raise ValidationFailed(problems)


def unshared_settings(uri: str, settings: JobSettings, cluster_name: str) -> list[Problem]:
    """The settings a cluster's nodes cannot share (``shared_storage``), for a remote address."""
    from pdmask.backends.verl.jobs import on_cpu
    from pdmask.orchestration.shared_storage import storage_problems

    return storage_problems(
        uri,
        checkpoint_dir=str(settings.checkpoint_dir) if settings.checkpoint_dir else None,
        data_dir=str(settings.data_dir) if settings.data_dir else None,
        model_root=settings.model_root,
        data_built_here=on_cpu(cluster_name),
    )


def require_cluster_check(address, uri, settings, cluster_name, trials, console) -> None:
    """``pdm cluster check`` against ``address`` for these trials' inputs; refuses (exit 2,
    every failed check named with its node) before anything is submitted."""
    from pdmask.backends.verl.site_inputs import shared_inputs
    from pdmask.orchestration.cluster_check import CheckSpec, render, run_check

    console.print(f"checking the cluster's nodes (pdm cluster check --address {address})...")
    spec = CheckSpec.of(uri, shared_inputs(settings, cluster_name, trials))
    report = run_check(address, spec)
    render(report, console)
    if not report.ok:
        console.print(
            "nothing was submitted; fix the settings above, or submit without this check "
            "with --skip-cluster-check"
        )
        raise ValidationFailed(report.problems())
