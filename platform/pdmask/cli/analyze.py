"""`pdm analyze tokens`: the paper's token-level mechanism table on the embedded backend.

    pdm analyze tokens                          # 61 seeds, AdamW and SGD steps, delta of the sweep
    pdm analyze tokens --seeds 8 --optimizer sgd --delta 0.05 --out results/tokens
    pdm analyze tokens --seeds 61 --jobs 2      # Ctrl-C at any time; rerun to resume

The analysis' own flags take their help and defaults from ``TokenAnalysisConfig`` (their one
home): a flag left out is left out of the config, whose default then applies. Heavy imports
(torch, MLflow, matplotlib) happen inside the command, so `pdm --help` stays fast.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer

from pdmask.cli import _choices
from pdmask.cli._options import OUTPUT, RESULTS, StateDir, TrackingUri, out_dir

COMMAND = "analyze"
SETTING = "Training setting"
STEP = "Analysed step"

app = typer.Typer(
    help="Analyses beyond training curves (the token-level mechanism table).",
    rich_help_panel=RESULTS,
    add_completion=False,
)


@app.callback()
def _group() -> None:
    pass


def _config_field(name: str):
    from pdmask.analysis.config import TokenAnalysisConfig

    return TokenAnalysisConfig.model_fields[name]


def _shown(default: Any) -> str | bool:
    if default is None:
        return False  # the description says what None means
    if isinstance(default, tuple):
        return ",".join(map(str, default))
    return str(default)


def _flag(field: str, flag: str | None = None, **option: Any):
    """An option documented by, and defaulting to, the config field of that name."""
    info = _config_field(field)
    return typer.Option(
        flag or f"--{field.replace('_', '-')}",
        help=info.description,
        show_default=_shown(info.default),
        **option,
    )


def _config_type(field: str):
    return _config_field(field).annotation


@app.command("tokens")
def tokens(
    seeds: Annotated[int | None, _flag("seeds")] = None,
    first_seed: Annotated[int | None, _flag("first_seed")] = None,
    delta: Annotated[float | None, _flag("delta")] = None,
    optimizer: Annotated[
        str | None,
        _flag("optimizers", "--optimizer", metavar="adamw|sgd|both", rich_help_panel=STEP),
    ] = None,
    sweep: Annotated[
        str | None,
        _flag("sweep", autocompletion=_choices.complete_sweep, rich_help_panel=SETTING),
    ] = None,
    profile: Annotated[_choices.Profile | None, _flag("profile", rich_help_panel=SETTING)] = None,
    train_steps: Annotated[int | None, _flag("train_steps", rich_help_panel=SETTING)] = None,
    prompts: Annotated[int | None, _flag("prompts", rich_help_panel=STEP)] = None,
    minibatches: Annotated[int | None, _flag("minibatches", rich_help_panel=STEP)] = None,
    analysed_minibatches: Annotated[
        int | None, _flag("analysed_minibatches", rich_help_panel=STEP)
    ] = None,
    tie_tol: Annotated[float | None, _flag("tie_tol", rich_help_panel=STEP)] = None,
    split: Annotated[_config_type("split") | None, _flag("split", rich_help_panel=STEP)] = None,
    sgd_lr: Annotated[float | None, _flag("sgd_lr", rich_help_panel=STEP)] = None,
    isolated_tokens: Annotated[int | None, _flag("isolated_tokens", rich_help_panel=STEP)] = None,
    out: Annotated[Path | None, out_dir("<state>/analysis/tokens/<config hash>")] = None,
    jobs: Annotated[int, typer.Option(min=1, help="Worker processes.")] = min(
        2, os.cpu_count() or 1
    ),
    no_mlflow: Annotated[
        bool,
        typer.Option(
            "--no-mlflow", help="Write files only, no MLflow run.", rich_help_panel=OUTPUT
        ),
    ] = False,
    tracking_uri: TrackingUri = None,
    state_dir: StateDir = None,
) -> None:
    """Ratio test vs predictive direction tests: one real step each, per seed.

    For each seed: train the sweep's setting a few steps, roll out, train the minibatches one by
    one; on the last one (or the last few), take one real optimizer step per direction test from
    the same saved state and measure every out-of-region token's change of D_t. States the power
    of the comparison and the float32 rounding. Writes a markdown report, CSV tables, a per-seed
    paired plot and an MLflow run. Finished seeds are cached: Ctrl-C and rerun resumes.
    """
    from pdmask.analysis import TokenAnalysisConfig, run_token_analysis
    from pdmask.analysis.config import parse_optimizers

    cfg = TokenAnalysisConfig.from_flags(
        {
            "seeds": seeds,
            "first_seed": first_seed,
            "delta": delta,
            "optimizers": None if optimizer is None else parse_optimizers(optimizer),
            "sweep": sweep,
            "profile": profile,
            "train_steps": train_steps,
            "prompts": prompts,
            "minibatches": minibatches,
            "analysed_minibatches": analysed_minibatches,
            "tie_tol": tie_tol,
            "split": split,
            "sgd_lr": sgd_lr,
            "isolated_tokens": isolated_tokens,
        }
    )
    result = run_token_analysis(
        cfg,
        out=out,
        tracking_uri=tracking_uri,
        jobs=jobs,
        track=not no_mlflow,
        progress=lambda line: print(line, flush=True),
    )
    from pdmask.analysis.report import headline_table
    from pdmask.console import console, table

    columns, rows = headline_table(result.summary)
    out_console = console()
    out_console.print()
    out_console.print(table("The paper's token-level table and this run", columns, rows))
    # the whole report (power, float32 resolution, every direction test) is the markdown file
    out_console.print(f"report: {result.paths['report']}", soft_wrap=True)
    for role, path in result.paths.items():
        if role != "report":
            print(f"{role:<10} {path}")
    if result.run_id:
        print(f"mlflow run {result.run_id} (experiment {cfg.sweep})")
    print(f"wall time {result.wall_s / 60:.1f} min")
