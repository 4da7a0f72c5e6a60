"""Pool the per-seed records into the table's figures (pooled over tokens, and seed by seed).

*Pooled* rates divide token counts summed over seeds (every kept token weighs the same); the
*seed mean* averages each seed's own rate (every seed weighs the same, seeds with nothing kept left
out). The paired comparison and the sign test use the per-seed rates.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from pdmask.analysis.isolated import LAYERS
from pdmask.analysis.outcomes import paired_comparison, rate
from pdmask.analysis.quantities import KEEP_ALL, PREDICTIVE, TESTS

STEP_TESTS = (KEEP_ALL, *TESTS)


def _mean_sd(values: list[float]) -> tuple[float, float]:
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def seed_rates(record: dict, optimizer: str, test: str) -> dict[str, float]:
    c = record["outcomes"][optimizer][test]
    return {
        "unsafe_keep": rate(c["grew"], c["kept"]),
        "shrink_share": rate(c["shrank"], c["kept"]),
    }


def _pooled_accuracy(records: list[dict], path: tuple[str, ...]) -> float:
    correct = total = 0
    for record in records:
        node: Any = record
        for key in path:
            node = node.get(key, {}) if isinstance(node, dict) else {}
        correct += node.get("correct", 0)
        total += node.get("total", 0)
    return rate(correct, total)


def summarize(records: list[dict]) -> dict[str, Any]:
    """Everything the report, the plot and MLflow show, from the per-seed records."""
    records = sorted(records, key=lambda r: r["seed"])
    out_mean, out_sd = _mean_sd([float(r["out_of_region"]) for r in records])
    summary: dict[str, Any] = {
        "seeds": len(records),
        "tokens_per_seed": _mean_sd([float(r["tokens"]) for r in records])[0],
        "out_of_region_per_seed": out_mean,
        "out_of_region_sd": out_sd,
        "out_of_region_total": sum(r["out_of_region"] for r in records),
        "disagree_per_seed": {
            t: _mean_sd([float(r["disagree"][t]) for r in records])[0] for t in PREDICTIVE
        },
        "disagree_total": {t: sum(r["disagree"][t] for r in records) for t in PREDICTIVE},
        "reward_mean": _mean_sd([r["reward_mean"] for r in records])[0],
        "wall_s_per_seed": _mean_sd([r["wall_s"] for r in records])[0],
        "kernel_scale": _mean_sd([r["kernel_scale"] for r in records]),
        "optimizers": {},
    }
    optimizers = [o for o in ("adamw", "sgd") if records and o in records[0]["outcomes"]]
    for opt in optimizers:
        per_test: dict[str, Any] = {}
        for test in STEP_TESTS:
            counts = {
                k: sum(r["outcomes"][opt][test][k] for r in records)
                for k in ("kept", "grew", "shrank", "masked")
            }
            rates = [seed_rates(r, opt, test) for r in records]
            per_test[test] = {
                **counts,
                "unsafe_keep": rate(counts["grew"], counts["kept"]),
                "shrink_share": rate(counts["shrank"], counts["kept"]),
                "unsafe_keep_seed_mean": _mean_sd([x["unsafe_keep"] for x in rates])[0],
                "shrink_share_seed_mean": _mean_sd([x["shrink_share"] for x in rates])[0],
                "per_seed_unsafe_keep": [x["unsafe_keep"] for x in rates],
                "sign_accuracy": _pooled_accuracy(records, ("sign_accuracy", opt, test, "all"))
                if test != KEEP_ALL
                else math.nan,
            }
            if test in PREDICTIVE:
                per_test[test]["sign_accuracy_disagree"] = _pooled_accuracy(
                    records, ("sign_accuracy", opt, test, "disagree")
                )
        baseline = per_test["ratio"]["per_seed_unsafe_keep"]
        for test in (KEEP_ALL, *PREDICTIVE):
            per_test[test]["vs_ratio"] = paired_comparison(
                baseline, per_test[test]["per_seed_unsafe_keep"]
            )
        lrs = [r["lr"][opt] for r in records]
        summary["optimizers"][opt] = {"lr_mean": statistics.fmean(lrs), "tests": per_test}
    summary["isolated"] = _isolated(records)
    summary["rounding"] = _rounding(records, optimizers)
    masses = [r["topk_mass"] for r in records]
    summary["topk_mass"] = [statistics.fmean(col) for col in zip(*masses, strict=True)]
    summary["analysed_minibatches"] = len(records[0]["analysed_positions"]) if records else 0
    return summary


def _rounding(records: list[dict], optimizers: list[str]) -> dict[str, Any]:
    """The float32 rounding of the measured changes of D_t, worst case over seeds."""
    out = {}
    for opt in optimizers:
        cells = [r["rounding"][opt] for r in records]
        out[opt] = {
            "tokens": sum(c["tokens"] for c in cells),
            "max_abs": max(c["max_abs"] for c in cells),
            "max_abs_oor": max(c["max_abs_oor"] for c in cells),
            "median_change_oor": statistics.median(c["median_change_oor"] for c in cells),
            "oor_decided": sum(c["oor_decided"] for c in cells),
            "oor_flipped": sum(c["oor_flipped"] for c in cells),
        }
    return out


def _isolated(records: list[dict]) -> dict[str, Any]:
    """Pooled sign accuracies of the single-token steps, per variant (whole network, output)."""
    out: dict[str, Any] = {}
    for layers in LAYERS:
        runs = [r["isolated"][layers] for r in records]
        sampled = sum(len(run["tokens"]) for run in runs)
        variant: dict[str, Any] = {"tokens": sampled, "accuracy": {}, "accuracy_disagree": {}}
        for test in TESTS:
            variant["accuracy"][test] = rate(
                sum(run["correct"].get(test, 0) for run in runs), sampled
            )
        variant["disagree_tokens"] = {}
        for test in PREDICTIVE:
            cells = [run["disagree"].get(test, {}) for run in runs]
            total = sum(c.get("total", 0) for c in cells)
            variant["accuracy_disagree"][test] = rate(
                sum(c.get("correct", 0) for c in cells), total
            )
            variant["disagree_tokens"][test] = total
        out[layers] = variant
    return out
