"""`pdm sweep NAME`: plan, run and resume a sweep; `--dry-run` prints the plan only.

The flags that shape the run have the names of ``SweepOptions``' fields and are passed on by name,
so a new run option is one field there plus one parameter here.
"""

from __future__ import annotations

from typing import Annotated

import typer

from pdmask.cli import _choices
from pdmask.cli._options import (
    OUTPUT,
    RUN,
    SERVICES,
    Insecure,
    Json,
    RayAddress,
    RayTokenFile,
    StateDir,
    TrackingUri,
)

COMMAND = "sweep"
GRID = "Trials"

app = typer.Typer(add_completion=False)


@app.command(rich_help_panel=RUN)
def sweep(
    ctx: typer.Context,
    name: Annotated[
        str,
        typer.Argument(
            metavar="NAME",
            help="Sweep name (`pdm sweeps list`).",
            autocompletion=_choices.complete_sweep,
        ),
    ],
    overrides: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="KEY=VALUE",
            help="Overrides, validated like the sweep file: an axis filter (`precision=bf16`, "
            "`method=pdm-agg`), the seeds (`seed=[0,1,2,3]`; `seed=1` keeps one), a "
            "setting (`profile=full`, `steps=100`). Values are YAML. Trials already FINISHED in "
            "any sweep are reused, not trained again.",
            show_default=False,
        ),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run", help="Print the plan; launch and write nothing.", rich_help_panel=OUTPUT
        ),
    ] = False,
    json: Json = False,
    backend: Annotated[
        _choices.Backend | None,
        typer.Option(help="Override the sweep's backend.", rich_help_panel=GRID),
    ] = None,
    profile: Annotated[
        _choices.Profile | None,
        typer.Option(help="Embedded-backend budget profile.", rich_help_panel=GRID),
    ] = None,
    cluster: Annotated[
        _choices.Cluster | None,
        typer.Option(help="Cluster profile for planning resources.", rich_help_panel=GRID),
    ] = None,
    max_concurrent: Annotated[
        int | None, typer.Option(min=1, help="Cap on trials running at once.", rich_help_panel=GRID)
    ] = None,
    max_trials: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Confirm a grid of up to this many trials, above the default cap (or the "
            "sweep's max_trials).",
            rich_help_panel=GRID,
        ),
    ] = None,
    figures: Annotated[
        bool,
        typer.Option(
            "--figures/--no-figures",
            help="Build the sweep's figures at the end.",
            rich_help_panel=OUTPUT,
        ),
    ] = True,
    address: RayAddress = None,
    tracking_uri: TrackingUri = None,
    state_dir: StateDir = None,
    ray_token_file: RayTokenFile = None,
    insecure: Insecure = False,
    skip_cluster_check: Annotated[
        bool,
        typer.Option(
            "--skip-cluster-check",
            help="VeRL jobs on an --address: submit without proving the nodes share storage "
            "(no refusal of a sqlite store or an unset checkpoint root, no `pdm cluster check`). "
            "Only for a cluster whose nodes are all this machine.",
            rich_help_panel=SERVICES,
        ),
    ] = False,
) -> None:
    """Run every unfinished trial of a sweep (or --dry-run to print the plan).

    Runs every trial of sweeps/NAME.yaml that has no FINISHED run yet, then builds its figures.
    A trial FINISHED in another sweep (the same trial hash) is linked into this one, not trained.
    KEY=VALUE overrides filter, reseed or reset the sweep, e.g.
    `pdm sweep main-figure precision=bf16 seed=[0,1,2,3]`.
    Interrupt with Ctrl-C at any time; running it again resumes.
    """
    from pdmask.orchestration.options import SweepOptions

    params = {**ctx.params, "overrides": tuple(overrides or ())}
    options = SweepOptions(**{k: v for k, v in params.items() if k in SweepOptions.model_fields})
    if dry_run:
        _print_plan(name, options, json)
        return
    from pdmask.api import run_sweep

    raise typer.Exit(run_sweep(name, options).exit_code)


def _status_lookup(tracking_uri, sweep_name, claims: bool):
    """done/failed/running/interrupted/todo per trial from the tracking store, when it can be
    read. ``claims``: the trials run under claims (Tune), so a RUNNING run whose claim no live
    process holds was killed with its sweep (SIGKILL leaves runs RUNNING): it is interrupted,
    and the next run resumes it."""
    try:
        from pdmask.tracking import TrialStatusIndex
    except ImportError:
        return None
    status_of = TrialStatusIndex.open(tracking_uri, sweep_name, create=False).status_of
    if not claims:
        return status_of
    from pdmask.orchestration.claims import claim_held

    def with_claims(trial) -> str:
        status = status_of(trial)
        if status == "running" and not claim_held(trial.trial_hash):
            return "interrupted"
        return status

    return with_claims


def _reusable(tracking_uri, sweep, trials, status_of, eval_metrics) -> dict:
    """The trials not done in this sweep that FINISHED in another one, by hash: the sweep links
    them instead of training them (``SweepSession.todo``). Read only: a dry run writes nothing."""
    from pdmask.orchestration.session import reusable
    from pdmask.tracking.store import open_client, resolve_tracking_uri, sqlite_path

    uri = resolve_tracking_uri(tracking_uri)
    if sweep.search is not None or status_of is None:
        return {}
    if uri.startswith("sqlite:") and not sqlite_path(uri).exists():
        return {}
    client = open_client(uri)
    exp = client.get_experiment_by_name(sweep.name)
    left = [t for t in trials if status_of(t) != "done"]
    return reusable(client, exp and exp.experiment_id, left, eval_metrics)


def _launch_order(sweep, trials, tracking_uri, eval_metrics, reused) -> list[tuple]:
    """The unfinished trials in launch order, each with whether it is its setting's canary
    (``orchestration/canary.py``), as the store says now, less those ``reused`` from other
    sweeps; empty for a search."""
    if sweep.search is not None:
        return []
    from pdmask.orchestration.canary import SettingGate
    from pdmask.tracking import TrialStatusIndex

    by_hash = TrialStatusIndex.open(tracking_uri, sweep.name, create=False).by_hash
    done = TrialStatusIndex(by_hash).finished_hashes() | set(reused)
    todo = [t for t in trials if t.trial_hash not in done]
    gate = SettingGate.of(trials, todo, by_hash, lambda: by_hash, eval_metrics, print)
    return [(t, gate.is_canary(t)) for t in gate.order]


def _print_plan(name: str, options, as_json: bool) -> None:
    from pdmask.api import plan
    from pdmask.console import console, print_json, table
    from pdmask.registry import CLUSTERS, load_registry, plan_rows
    from pdmask.registry.cli_overrides import OVERRIDES_TAG, overrides_tag, with_overrides
    from pdmask.registry.plan import TABLE_ROWS, concurrent_trials, disk_need, grouped_rows
    from pdmask.tracking.store import redact

    reg = with_overrides(load_registry(), name, options.overrides)
    trials = plan(reg, name, options)
    sweep = reg.sweep(name)
    cluster = options.cluster or sweep.cluster
    from pdmask.backends.interface import SubmitsJobs, load_backend

    backend = load_backend(options.backend or sweep.backend)
    status_of = _status_lookup(
        options.tracking_uri, sweep.name, claims=not isinstance(backend, SubmitsJobs)
    )
    specs = None
    if isinstance(backend, SubmitsJobs):  # the cluster job each trial would be submitted as
        specs = [  # as the dry run shows them (--json too): a backend's spec adds fields
            spec.to_json()
            for spec in backend.job_specs(
                reg, sweep, trials, cluster=cluster, tracking_uri=options.tracking_uri
            )
        ]
    from pdmask.orchestration.trial_prices import costs_of

    workloads, measured = costs_of(specs, trials, options.tracking_uri)
    metrics = backend.eval_metrics(cluster)
    reused = _reusable(options.tracking_uri, sweep, trials, status_of, metrics)
    if reused:  # the plan says where each comes from: "reuse <sweep>/<run>"

        def status_of(trial, own=status_of):
            source = reused.get(trial.trial_hash)
            return own(trial) if source is None else f"reuse {source.label}"

    rows = plan_rows(trials, cluster, status_of, workloads, measured)
    disk = disk_need(rows, cluster)
    left_out = reg.left_out(name, backend=options.backend)
    order = _launch_order(sweep, trials, options.tracking_uri, metrics, reused)
    overrides = overrides_tag(options.overrides).get(OVERRIDES_TAG)
    if as_json:
        data = {"sweep": sweep.name, "cluster": cluster, "trials": [r.model_dump() for r in rows]}
        data["overrides"] = overrides or ""
        data["reused"] = {
            h: {"sweep": source.sweep, "run_id": source.run.info.run_id, "label": source.label}
            for h, source in reused.items()
        }
        data["disk"] = disk.model_dump()
        data["cost_basis"] = COST_BASIS
        data["left_out"] = [
            {"reason": reason, "trials": lo.trials, "methods": lo.methods}
            for reason, lo in left_out.items()
        ]
        for t, row in zip(trials, data["trials"], strict=True):
            row["config"] = t.model_dump(mode="json")
            row["tags"] = t.tags()
        if specs is not None:
            for row, spec in zip(data["trials"], specs, strict=True):
                row["job"] = spec
        if sweep.search is not None:
            data["search"] = sweep.search.model_dump()
        data["launch_order"] = [
            {"trial_hash": t.trial_hash, "run_name": t.run_name(), "canary": c} for t, c in order
        ]
        print_json(data)
        return
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
        "s/step",
        "status",
    ]
    body = [  # built only for a plan short enough to list trial by trial
        [
            r.trial_hash[:10],
            r.label,
            r.model.removeprefix("qwen3-").removesuffix("-base"),
            r.precision,
            "-" if r.delta is None else f"{r.delta:g}",
            r.seed,
            r.resources,
            f"{r.est_gpu_hours:g}",
            _step_cell(r),
            r.status,
        ]
        for r in rows[: TABLE_ROWS + 1]
    ]
    backend = rows[0].backend if rows else sweep.backend
    if len(rows) > TABLE_ROWS:  # one line per setting (`--json` lists every trial)
        cols = ["method", "model", "precision", "delta", "trials", "seeds", "GPU-h", "status"]
        # a setting's reused trials are one line per source sweep, not one per source run
        body = grouped_rows([r.model_copy(update={"status": _by_sweep(r.status)}) for r in rows])
    given = f" ({overrides})" if overrides else ""
    out.print(
        table(
            f"sweep {sweep.name}{given}: {len(rows)} trials on backend {backend} "
            f"(GPU-h: estimate on {cluster})",
            cols,
            body,
        ),
    )
    if reused:
        done = sum(r.status == "done" for r in rows)
        out.print(
            f"{len(reused)} trial(s) reused from other sweeps (linked, not trained), {done} "
            f"already finished here, {len(rows) - len(reused) - done} to train"
        )
    total = sum(r.est_gpu_hours for r in rows)
    fit = concurrent_trials(rows, cluster)
    out.print(
        f"on cluster {cluster} ({CLUSTERS[cluster].gpus} GPUs): about {total:,.0f} GPU-hours, "
        f"{fit} trial(s) fit at once (estimates)"
    )
    _print_basis(out, rows, disk, specs, trials)
    for reason, lo in left_out.items():
        methods = f" (method {', '.join(lo.methods)})" if lo.methods else ""
        out.print(f"left out on backend {backend}: {lo.trials} trial(s), {reason}{methods}")
    _print_canaries(out, order)
    if sweep.search is not None:
        out.print(
            f"search: {sweep.search.budget} trials optimising {sweep.search.metric} ({sweep.search.mode}) "
            f"over {sorted(sweep.search.space)}; the row above is the space's midpoint"
        )
    if specs is not None:
        for t, spec in zip(trials, specs, strict=True):
            out.print(f"\n[bold]{t.run_name()}[/bold] ({t.trial_hash})")
            # no markup: rich would read `[console,mlflow]` as a tag and print `trainer.logger=`
            out.print(f"  entrypoint: {spec['entrypoint']}", markup=False)
            out.print(f"  runtime_env: {redact(str(spec['runtime_env']))}")  # no passwords
            out.print(f"  resources: {spec['resources']}", markup=False)
            for part in ("engine", "training", "checkpoints"):  # what a backend's spec adds
                if part in spec:
                    out.print(f"  {part}: {spec[part]}", markup=False)


def _by_sweep(status: str) -> str:
    """``reuse <sweep>/<run>`` as ``reuse <sweep>``; any other status as it is."""
    return status.rpartition("/")[0] if status.startswith("reuse ") else status


COST_BASIS = (
    "GPU-hours = GPUs x (steps x step + validations + start-up + saves) / 3600. Step (estimate): "
    "8 x N_active x training tokens + 2 x N_active x generated tokens over GPU peak x MFU, "
    "calibrated on verl's published H20 step times (registry/cost.py); (measured): the median "
    "`timing_s/step` of runs of the same model, precision and resources; (catalog): hand-set. "
    "Retries are not included."
)


def _step_cell(row) -> str:
    return "-" if row.step_seconds is None else f"{row.step_seconds:,.0f} ({row.cost_basis})"


def _print_basis(out, rows, disk, specs, trials) -> None:
    """How the cost was reached, what the checkpoint root needs, each setting's engine layout."""
    from collections import Counter

    bases = Counter(r.cost_basis for r in rows)
    out.print(
        "step time per trial: " + ", ".join(f"{n} {basis}" for basis, n in sorted(bases.items()))
    )
    out.print(f"cost basis: {COST_BASIS}", markup=False, soft_wrap=True)
    if not specs or "checkpoints" not in specs[0]:
        return
    out.print(
        f"checkpoint root: {_tb(disk.peak_gb)} at the peak (every trial finished and cleaned, "
        f"the largest set running at once holding its saves), {_tb(disk.finished_gb)} once all "
        f"finished and `pdm clean` ran, {_tb(disk.uncleaned_gb)} if nothing is cleaned",
        soft_wrap=True,
    )
    seen = set()
    for trial, spec in zip(trials, specs, strict=True):
        cell = (trial.model, trial.precision)
        if cell in seen:
            continue
        seen.add(cell)
        e, c = spec["engine"], spec["checkpoints"]
        ep = " + expert parallel" if e["expert_parallel"] else ""
        out.print(
            f"{trial.model} {trial.precision}: {_training_line(spec['training'])}; vLLM TP "
            f"{e['tensor_parallel']}{ep} x "
            f"{e['replicas']} replicas ({e['why']}); save {c['save_gb']:,.0f} GB x {c['saves']}, "
            f"{c['running_gb']:,.0f} GB while running, keeps {c['finished_keeps']} "
            f"({c['finished_gb']:,.0f} GB); collective timeout {c['collective_timeout_s']} s",
            markup=False,
            soft_wrap=True,
        )


def _training_line(t: dict) -> str:
    """How the actor trains: FSDP, or Megatron with its layout (``training_layout``)."""
    if t["engine"] != "megatron":
        return "trains on FSDP"
    fp8 = " in FP8 (Transformer Engine, block-wise)" if t["fp8_training"] else ""
    return (
        f"trains on Megatron{fp8}, TP {t['tensor_parallel']} PP {t['pipeline_parallel']} "
        f"EP {t['expert_parallel']} ETP {t['expert_tensor_parallel']} "
        f"(~{t['state_gib_per_gpu']} GiB of state per GPU, {t['why']})"
    )


def _tb(gb: float) -> str:
    return f"{gb / 1000:,.1f} TB" if gb >= 1000 else f"{gb:,.0f} GB"


def _print_canaries(out, order: list[tuple]) -> None:
    """The canaries in launch order, by trial hash (the table's first column; ``--json``'s
    ``launch_order`` names them), and what waits for them."""
    canaries = [t.trial_hash[:10] for t, canary in order if canary]
    if canaries:
        out.print(
            f"canaries, launched first (the first trial of each setting not yet proven; its other "
            f"{len(order) - len(canaries)} trial(s) start once it reported its first training "
            f"step and a validation, none after a deterministic failure): {', '.join(canaries)}"
        )
