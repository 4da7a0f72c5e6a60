"""`pdm cluster check --address URL`: what a cluster's jobs need, checked from every node.

Runs one small Ray job on the cluster whose tasks, one pinned to each alive node, check from that
node: the tracking server answers, the checkpoint root can be written and read back and is the
same folder on every node, the data files exist, the profile's model folders are complete (or
the Hub answers), pdmask is the submitter's source and verl the pinned version; and on the nodes
with GPUs: the driver runs the wheels' CUDA, the GPUs match the profile, the jobs' attention
imports, vLLM, torch and flash-attn are the pinned versions, and an all-reduce across those nodes
works (``orchestration/cluster/check.py``). Prints a row per node.

Exit codes: 0 every check passed on every node; 1 some check failed (each named with its node);
2 the check could not run (no address, an address that does not answer, an unauthenticated job
API without --insecure, a missing or refused token).
"""

from __future__ import annotations

from typing import Annotated

import typer

from pdmask.cli import _choices
from pdmask.cli._options import (
    RUN,
    Insecure,
    Json,
    RayAddress,
    RayTokenFile,
    StateDir,
    TrackingUri,
)

COMMAND = "cluster"

app = typer.Typer(
    help="Check a Ray cluster from every node before submitting to it.",
    rich_help_panel=RUN,
    add_completion=False,
)


@app.callback(invoke_without_command=True)
def _group(ctx: typer.Context) -> None:
    if ctx.invoked_subcommand is None:  # `pdm cluster` alone: what it can do
        typer.echo(ctx.get_help())
        raise typer.Exit()


@app.command("check")
def check(
    address: RayAddress = None,
    tracking_uri: TrackingUri = None,
    cluster: Annotated[
        _choices.Cluster | None,
        typer.Option(
            help="Cluster profile whose jobs' needs are checked: its models, GPUs per node and "
            "memory (the CPU profile reads the tiny task pdm builds). Default: a sweep's default "
            "profile."
        ),
    ] = None,
    ray_token_file: RayTokenFile = None,
    insecure: Insecure = False,
    json: Json = False,
    state_dir: StateDir = None,
) -> None:
    """Check, from every alive node, the tracking server, the checkpoint root, data, models,
    versions and, on GPU nodes, driver, GPUs, attention and an all-reduce (exit 1 naming node,
    check and fix when one fails; exit 2 when the check cannot run: no address, or a job API
    without authentication and no --insecure).

    Reads the same settings as `pdm sweep --backend verl`: PDM_VERL_CHECKPOINT_DIR, PDM_DATA_DIR,
    PDM_MODEL_ROOT, and the tracking URI.
    """
    from pdmask.console import console, print_json
    from pdmask.errors import ConfigError, Problem, ValidationFailed
    from pdmask.orchestration.cluster.address import WHERE, address_problems
    from pdmask.orchestration.cluster.auth import auth_problems
    from pdmask.orchestration.cluster.check import CheckSpec, render, run_check
    from pdmask.orchestration.jobs.checks import check_batch
    from pdmask.registry import load_registry
    from pdmask.tracking.store import resolve_tracking_uri

    if not address:
        raise ValidationFailed(
            [Problem(WHERE, "(unset)", "give the cluster's job API, e.g. http://HEAD:8265")]
        )
    problems = address_problems(address, jobs=True)
    problems = problems or auth_problems(address, insecure)
    uri = resolve_tracking_uri(tracking_uri)
    try:  # the backend's jobs say what their nodes must share
        batch = check_batch(load_registry(), uri, cluster)
    except ConfigError as err:
        problems.append(Problem("environment", "site settings", str(err)))
    if problems:
        raise ValidationFailed(problems)
    report = run_check(address, CheckSpec.of(uri, batch.node_inputs()))
    if json:
        print_json(report.to_json())
    else:
        render(report, console())
    raise typer.Exit(0 if report.ok else 1)
