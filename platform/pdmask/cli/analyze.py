"""`pdm analyze tokens`: the paper's token-level mechanism table on the embedded backend.

    pdm analyze tokens                          # 61 seeds, AdamW and SGD steps, delta of the sweep
    pdm analyze tokens --seeds 8 --optimizer sgd --delta 0.05 --out results/tokens
    pdm analyze tokens --seeds 61 --jobs 2      # Ctrl-C at any time; rerun to resume

Heavy imports (torch, MLflow, matplotlib) happen inside the handler, so `pdm --help` stays fast.
"""

from __future__ import annotations

import argparse
import os

COMMAND = "analyze"


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        COMMAND, help="analyses beyond training curves (token-level mechanism table)"
    )
    sub = parser.add_subparsers(metavar="ANALYSIS", required=True)
    tokens = sub.add_parser(
        "tokens",
        help="ratio test vs predictive direction tests: one real step each, per seed",
        description="For each seed: train the sweep's setting a few steps, roll out, train the "
        "minibatches one by one; on the last one (or the last few), take one real optimizer step "
        "per direction test from the same saved state and measure every out-of-region token's "
        "change of D_t. States the power of the comparison and the float32 rounding. "
        "Writes a markdown report, CSV tables, a per-seed paired plot and an MLflow run. "
        "Finished seeds are cached: Ctrl-C and rerun resumes.",
    )
    tokens.add_argument("--seeds", type=int, help="number of seeds (default 61)")
    tokens.add_argument("--first-seed", type=int, help="first seed (default 0)")
    tokens.add_argument("--delta", type=float, help="analysis threshold (default: the sweep's)")
    tokens.add_argument(
        "--optimizer",
        default="both",
        help="adamw, sgd or both (default both): the optimizer of the measured step",
    )
    tokens.add_argument("--sweep", help="sweep giving the training setting (token-analysis)")
    tokens.add_argument("--profile", help="embedded-backend budget profile (default: the sweep's)")
    tokens.add_argument("--train-steps", type=int, help="RL steps before the analysed rollout (20)")
    tokens.add_argument("--prompts", type=int, help="prompts of the analysed rollout (1024)")
    tokens.add_argument("--minibatches", type=int, help="minibatches of the analysed rollout (8)")
    tokens.add_argument(
        "--analysed-minibatches",
        type=int,
        help="last minibatches analysed, each from its state (1)",
    )
    tokens.add_argument("--tie-tol", type=float, help="|change of D_t| counted as unchanged (2e-4)")
    tokens.add_argument(
        "--split", choices=["sequences", "groups"], help="minibatch split (default sequences)"
    )
    tokens.add_argument("--sgd-lr", type=float, help="SGD learning rate (default: matched)")
    tokens.add_argument(
        "--isolated-tokens", type=int, help="single-token SGD checks per seed (default 32)"
    )
    tokens.add_argument("--out", help="output folder (default <state>/analysis/tokens/<hash>)")
    tokens.add_argument(
        "--jobs", type=int, default=min(2, os.cpu_count() or 1), help="worker processes (2)"
    )
    tokens.add_argument(
        "--tracking-uri",
        default=os.environ.get("MLFLOW_TRACKING_URI"),
        help="MLflow store (default: $MLFLOW_TRACKING_URI, else sqlite in the state folder)",
    )
    tokens.add_argument("--no-mlflow", action="store_true", help="write files only")
    tokens.set_defaults(func=run_tokens)
    return parser


def run_tokens(args: argparse.Namespace) -> int:
    from pathlib import Path

    from pdmask.analysis import TokenAnalysisConfig, run_token_analysis
    from pdmask.analysis.config import parse_optimizers
    from pdmask.errors import ConfigError

    if args.jobs < 1:
        raise ConfigError(f"--jobs: must be at least 1, got {args.jobs}")
    cfg = TokenAnalysisConfig.from_flags(
        {
            "seeds": args.seeds,
            "first_seed": args.first_seed,
            "delta": args.delta,
            "optimizers": parse_optimizers(args.optimizer),
            "sweep": args.sweep,
            "profile": args.profile,
            "train_steps": args.train_steps,
            "prompts": args.prompts,
            "minibatches": args.minibatches,
            "analysed_minibatches": args.analysed_minibatches,
            "tie_tol": args.tie_tol,
            "split": args.split,
            "sgd_lr": args.sgd_lr,
            "isolated_tokens": args.isolated_tokens,
        }
    )
    result = run_token_analysis(
        cfg,
        out=Path(args.out) if args.out else None,
        tracking_uri=args.tracking_uri,
        jobs=args.jobs,
        track=not args.no_mlflow,
        progress=lambda line: print(line, flush=True),
    )
    print()
    print(result.paths["report"].read_text())
    for role, path in result.paths.items():
        print(f"{role:<10} {path}")
    if result.run_id:
        print(f"mlflow run {result.run_id} (experiment {cfg.sweep})")
    print(f"wall time {result.wall_s / 60:.1f} min")
    return 0
