"""Per-seed and per-token CSV exports (the raw material behind the table and the plot)."""

from __future__ import annotations

import csv
from pathlib import Path

from pdmask.analysis.isolated import LAYERS
from pdmask.analysis.summary import STEP_TESTS, seed_rates

SEED_COLUMNS = [
    "seed", "optimizer", "test", "tokens", "out_of_region", "disagree_agg", "disagree_uni",
    "masked", "kept", "grew", "shrank", "unsafe_keep", "shrink_share", "lr", "reward_mean",
]  # fmt: skip
TOKEN_VALUES = [
    "minibatch", "kl_topk", "kl_full", "ratio", "advantage", "ddot_agg", "ddot_uni", "ddot_bucket",
    "ddot_exact",
]  # fmt: skip


def write_per_seed_csv(records: list[dict], path: Path) -> None:
    """One row per seed, optimizer and test."""
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=SEED_COLUMNS)
        writer.writeheader()
        for r in sorted(records, key=lambda r: r["seed"]):
            for opt, per_test in r["outcomes"].items():
                for test in STEP_TESTS:
                    c = per_test[test]
                    writer.writerow(
                        {
                            "seed": r["seed"],
                            "optimizer": opt,
                            "test": test,
                            "tokens": r["tokens"],
                            "out_of_region": r["out_of_region"],
                            "disagree_agg": r["disagree"]["agg"],
                            "disagree_uni": r["disagree"]["uni"],
                            **{k: c[k] for k in ("masked", "kept", "grew", "shrank")},
                            **seed_rates(r, opt, test),
                            "lr": r["lr"][opt],
                            "reward_mean": r["reward_mean"],
                        }
                    )


def write_tokens_csv(records: list[dict], path: Path) -> None:
    """One row per out-of-region token: its quantities and its change of D_t under every step."""
    records = sorted(records, key=lambda r: r["seed"])
    steps = [
        (opt, test) for opt in (records[0]["outcomes"] if records else {}) for test in STEP_TESTS
    ]
    header = ["seed", "token", *TOKEN_VALUES]
    header += [f"d_kl_{opt}_{test}" for opt, test in steps]
    header += [f"d_kl_isolated_{layers}" for layers in LAYERS]
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        for r in records:
            tokens = r["tokens_oor"]
            isolated = {
                layers: dict(zip(run["tokens"], run["d_kl"], strict=True))
                for layers, run in r["isolated"].items()
            }
            for i in range(len(tokens["kl_topk"])):
                row = [r["seed"], i, *(tokens[k][i] for k in TOKEN_VALUES)]
                row += [tokens["d_kl"][opt][test][i] for opt, test in steps]
                row += [isolated[layers].get(i, "") for layers in LAYERS]
                writer.writerow(row)
