"""Checks a VeRL job sweep passes before anything is submitted (every problem at once)."""

from __future__ import annotations

import os
from urllib.parse import urlparse

from pdmask.backends.verl.jobs import trial_overrides, trial_resources
from pdmask.backends.verl.jobs_setup import JobSettings
from pdmask.errors import ConfigError, Problem, ValidationFailed
from pdmask.loopback import LOOPBACK_HOSTS
from pdmask.registry import Trial

POLL_SECONDS = 15.0  # PDM_JOB_POLL_SECONDS overrides (tests poll faster)


def poll_seconds() -> float:
    raw = os.environ.get("PDM_JOB_POLL_SECONDS", str(POLL_SECONDS))
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise ConfigError(f"PDM_JOB_POLL_SECONDS must be a positive number of seconds, got {raw!r}")
    return value


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


def warn_about_store(uri: str, address: str, console) -> None:
    host = urlparse(address if "://" in address else f"http://{address}").hostname or ""
    if uri.startswith("sqlite:") and host not in LOOPBACK_HOSTS:
        console.print(
            f"[yellow]tracking store {uri} is a local file: the nodes must see it at the same path "
            "(shared filesystem); otherwise start an MLflow server the nodes can reach and pass "
            "--tracking-uri http://HOST:5000[/yellow]"
        )
