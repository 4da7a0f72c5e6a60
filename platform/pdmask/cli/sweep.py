"""`pdm sweep NAME`: plan, run and resume a sweep; `--dry-run` prints the plan only."""

from __future__ import annotations

import argparse
import os

from pdmask.cli._output import console, print_json, table
from pdmask.registry import CLUSTERS, load_registry, plan_rows
from pdmask.registry.plan import TABLE_ROWS, concurrent_trials, grouped_rows

COMMAND = "sweep"


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        COMMAND,
        help="run every unfinished trial of a sweep (or --dry-run to print the plan)",
        description="Run every trial of sweeps/NAME.yaml that has no FINISHED run yet, then build its figures. "
        "Interrupt with Ctrl-C at any time; running it again resumes.",
    )
    parser.add_argument("name", help="sweep name (see `pdm sweeps list`)")
    parser.add_argument(
        "--dry-run", action="store_true", help="print the plan; launch and write nothing"
    )
    parser.add_argument("--json", action="store_true", help="with --dry-run: the plan as JSON")
    parser.add_argument(
        "--backend", choices=["sim", "verl"], default=None, help="override the sweep's backend"
    )
    parser.add_argument(
        "--profile",
        default=None,
        help="embedded-backend budget profile (smoke/default/full/stress)",
    )
    parser.add_argument(
        "--cluster", default=None, help=f"cluster profile for planning: {sorted(CLUSTERS)}"
    )
    parser.add_argument(
        "--address",
        default=os.environ.get("RAY_ADDRESS"),
        help="Ray cluster to use (default: $RAY_ADDRESS, else a local embedded Ray)",
    )
    parser.add_argument(
        "--tracking-uri",
        default=os.environ.get("MLFLOW_TRACKING_URI"),
        help="MLflow store (default: $MLFLOW_TRACKING_URI, else sqlite in the state folder)",
    )
    parser.add_argument(
        "--max-concurrent", type=int, default=None, help="cap on trials running at once"
    )
    parser.add_argument(
        "--no-figures", action="store_true", help="do not build the sweep's figures at the end"
    )
    parser.add_argument(
        "--max-trials",
        type=int,
        default=None,
        help="confirm a grid larger than the default cap (or the sweep's max_trials)",
    )
    parser.set_defaults(func=run)
    return parser


def _status_lookup(args, sweep_name):
    """done/failed/running/todo per trial from the tracking store, when it can be read."""
    try:
        from pdmask.tracking import TrialStatusIndex
    except ImportError:
        return None
    return TrialStatusIndex.open(args.tracking_uri, sweep_name, create=False).status_of


def run(args: argparse.Namespace) -> int:
    reg = load_registry()
    trials = reg.expand(
        args.name,
        backend=args.backend,
        profile=args.profile,
        cluster=args.cluster,
        max_trials=args.max_trials,
    )
    sweep = reg.sweep(args.name)
    cluster = args.cluster or sweep.cluster
    if args.dry_run:
        return _print_plan(args, reg, sweep, trials, cluster)
    from pdmask.orchestration import run_sweep

    return run_sweep(reg, sweep, trials, args)


def _print_plan(args, reg, sweep, trials, cluster) -> int:
    from pdmask.tracking.store import redact

    status_of = _status_lookup(args, sweep.name)
    rows = plan_rows(trials, cluster, status_of)
    if args.backend == "verl" or (args.backend is None and sweep.backend == "verl"):
        from pdmask.backends.verl.jobs import job_specs  # the cluster job builder

        specs = job_specs(reg, sweep, trials, cluster=cluster, tracking_uri=args.tracking_uri)
    else:
        specs = None
    if args.json:
        data = {"sweep": sweep.name, "cluster": cluster, "trials": [r.model_dump() for r in rows]}
        for t, row in zip(trials, data["trials"], strict=True):
            row["config"] = t.model_dump(mode="json")
            row["tags"] = t.tags()
        if specs is not None:
            for row, spec in zip(data["trials"], specs, strict=True):
                row["job"] = spec
        if sweep.search is not None:
            data["search"] = sweep.search.model_dump()
        print_json(data)
        return 0
    out = console()
    cols = [
        "trial",
        "method",
        "model",
        "precision",
        "delta",
        "seed",
        "resources",
        "GPU-h",
        "status",
    ]
    body = [  # built only for a plan short enough to list trial by trial
        [
            r.trial_hash[:10],
            r.method,
            r.model.removeprefix("qwen3-").removesuffix("-base"),
            r.precision,
            "-" if r.delta is None else f"{r.delta:g}",
            r.seed,
            r.resources,
            f"{r.est_gpu_hours:g}",
            r.status,
        ]
        for r in rows[: TABLE_ROWS + 1]
    ]
    backend = rows[0].backend if rows else sweep.backend
    if len(rows) > TABLE_ROWS:  # one line per setting (`--json` lists every trial)
        cols = ["method", "model", "precision", "delta", "trials", "seeds", "GPU-h", "status"]
        body = grouped_rows(rows)
    out.print(
        table(
            f"sweep {sweep.name}: {len(rows)} trials on backend {backend} "
            f"(GPU-h: estimate on {cluster})",
            cols,
            body,
        )
    )
    total = sum(r.est_gpu_hours for r in rows)
    fit = concurrent_trials(rows, cluster)
    out.print(
        f"on cluster {cluster} ({CLUSTERS[cluster].gpus} GPUs): about {total:,.0f} GPU-hours, "
        f"{fit} trial(s) fit at once (estimates)"
    )
    if sweep.search is not None:
        out.print(
            f"search: {sweep.search.budget} trials optimising {sweep.search.metric} ({sweep.search.mode}) "
            f"over {sorted(sweep.search.space)}; the row above is the space's midpoint"
        )
    if specs is not None:
        for t, spec in zip(trials, specs, strict=True):
            out.print(f"\n[bold]{t.run_name()}[/bold] ({t.trial_hash})")
            out.print(f"  entrypoint: {spec['entrypoint']}")
            out.print(f"  runtime_env: {redact(str(spec['runtime_env']))}")  # no passwords
            out.print(f"  resources: {spec['resources']}")
    return 0
