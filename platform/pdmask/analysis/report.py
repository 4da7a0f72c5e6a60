"""The analysis as a markdown report and a CSV table, the paper's figures side by side.

``table_rows`` is the single source of both: each row is (section, quantity, optimizer, test,
paper value, measured value), so the markdown and ``table.csv`` can never disagree.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

from pdmask.analysis import paper
from pdmask.analysis.quantities import PREDICTIVE
from pdmask.analysis.summary import STEP_TESTS

TEST_LABELS = {
    "none": "keep all (no mask)",
    "ratio": "ratio test A(r-1) > 0",
    "agg": "Ddot_agg (aggregated tail)",
    "uni": "Ddot_uni (uniform tail)",
    "bucket": "Ddot_bucket (bucket estimator)",
    "exact": "exact full-vocabulary Ddot (oracle)",
}
ISOLATED_LABELS = {"all": "single-token SGD step", "output": "single-token output-layer step"}
Row = tuple[str, str, str, str, float | None, float | None]


def _pct(x: float | None) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f} %"


def _num(x: float | None, digits: int = 1) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:.{digits}f}" if isinstance(x, float) and not x.is_integer() else f"{int(x)}"


def table_rows(summary: dict[str, Any]) -> list[Row]:
    """The paper's table and this run's values, long format."""
    rows: list[Row] = [
        (
            "counts",
            "out-of-region tokens per seed",
            "",
            "",
            paper.OUT_OF_REGION_PER_SEED,
            summary["out_of_region_per_seed"],
        ),
    ]
    for test in PREDICTIVE:
        rows.append(
            (
                "counts",
                "disagreeing tokens per seed",
                "",
                test,
                paper.DISAGREE_PER_SEED if test in ("agg", "uni") else None,
                summary["disagree_per_seed"][test],
            )
        )
    for opt, data in summary["optimizers"].items():
        tests = data["tests"]
        for test in STEP_TESTS:
            t = tests[test]
            paper_key = "ratio" if test == "ratio" else "divergence"
            on_paper = test in ("ratio", "agg", "uni")
            rows += [
                (
                    "steps",
                    "unsafe-keep rate (pooled)",
                    opt,
                    test,
                    paper.UNSAFE_KEEP[paper_key] if on_paper else None,
                    t["unsafe_keep"],
                ),
                (
                    "steps",
                    "unsafe-keep rate (seed mean)",
                    opt,
                    test,
                    None,
                    t["unsafe_keep_seed_mean"],
                ),
                (
                    "steps",
                    "shrink share of kept updates (pooled)",
                    opt,
                    test,
                    paper.SHRINK_SHARE[paper_key] if on_paper else None,
                    t["shrink_share"],
                ),
                ("steps", "masked out-of-region tokens", opt, test, None, float(t["masked"])),
                ("steps", "kept out-of-region tokens", opt, test, None, float(t["kept"])),
            ]
            if test != "none":
                rows.append(
                    (
                        "steps",
                        "sign accuracy under keep-all step",
                        opt,
                        test,
                        None,
                        t["sign_accuracy"],
                    )
                )
            if test in PREDICTIVE:
                rows.append(
                    (
                        "steps",
                        "sign accuracy on disagreeing tokens",
                        opt,
                        test,
                        None,
                        t["sign_accuracy_disagree"],
                    )
                )
            if test != "ratio":
                cmp = t["vs_ratio"]
                on_paper = test in ("agg", "uni")
                rows += [
                    (
                        "seeds",
                        "seeds favouring test over ratio",
                        opt,
                        test,
                        paper.SEEDS_FAVOURING_DIVERGENCE if on_paper else None,
                        float(cmp["seeds_favouring"]),
                    ),
                    (
                        "seeds",
                        "seeds favouring ratio over test",
                        opt,
                        test,
                        paper.SEEDS - paper.SEEDS_FAVOURING_DIVERGENCE if on_paper else None,
                        float(cmp["seeds_against"]),
                    ),
                    ("seeds", "seeds tied", opt, test, None, float(cmp["seeds_tied"])),
                    (
                        "seeds",
                        "paired sign-test p (two-sided)",
                        opt,
                        test,
                        paper.SIGN_TEST_P if on_paper else None,
                        cmp["sign_test_p"],
                    ),
                ]
        rows.append(("steps", "learning rate (mean over seeds)", opt, "", None, data["lr_mean"]))
    for layers, iso in summary["isolated"].items():
        label = ISOLATED_LABELS[layers]
        for test, acc in iso["accuracy"].items():
            rows.append(("isolated", f"sign accuracy, {label}", "sgd", test, None, acc))
        for test, acc in iso["accuracy_disagree"].items():
            quantity = f"sign accuracy on disagreeing tokens, {label}"
            rows.append(("isolated", quantity, "sgd", test, None, acc))
    return rows


def write_table_csv(rows: list[Row], path: Path) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["section", "quantity", "optimizer", "test", "paper", "measured"])
        for row in rows:
            writer.writerow(["" if v is None else v for v in row])


def paper_gap(summary: dict[str, Any], optimizer: str) -> float:
    """Mean absolute gap (percentage points) of the four headline rates to the paper's."""
    tests = summary["optimizers"][optimizer]["tests"]
    gaps = [
        tests["ratio"]["unsafe_keep"] - paper.UNSAFE_KEEP["ratio"],
        tests["agg"]["unsafe_keep"] - paper.UNSAFE_KEEP["divergence"],
        tests["ratio"]["shrink_share"] - paper.SHRINK_SHARE["ratio"],
        tests["agg"]["shrink_share"] - paper.SHRINK_SHARE["divergence"],
    ]
    gaps = [abs(g) for g in gaps if not math.isnan(g)]
    return 100 * sum(gaps) / len(gaps) if gaps else math.nan


def _headline(summary: dict[str, Any]) -> list[str]:
    opts = list(summary["optimizers"])
    head = "| | paper | " + " | ".join(f"this run, {o}" for o in opts) + " |"
    lines = [head, "|---|---:|" + "---:|" * len(opts)]

    def row(label: str, paper_value: str, values: list[str]) -> None:
        lines.append(f"| {label} | {paper_value} | " + " | ".join(values) + " |")

    t = {o: summary["optimizers"][o]["tests"] for o in opts}
    row(
        "unsafe-keep rate, ratio test",
        _pct(paper.UNSAFE_KEEP["ratio"]),
        [_pct(t[o]["ratio"]["unsafe_keep"]) for o in opts],
    )
    for est in ("agg", "uni"):
        row(
            f"unsafe-keep rate, divergence test ({est})",
            _pct(paper.UNSAFE_KEEP["divergence"]),
            [_pct(t[o][est]["unsafe_keep"]) for o in opts],
        )
    paper_diff = 100 * (paper.UNSAFE_KEEP["divergence"] - paper.UNSAFE_KEEP["ratio"])
    row(
        "difference agg − ratio (pp)",
        f"{paper_diff:+.1f}",
        [f"{100 * (t[o]['agg']['unsafe_keep'] - t[o]['ratio']['unsafe_keep']):+.1f}" for o in opts],
    )
    row(
        "seeds favouring the divergence test (agg)",
        f"{paper.SEEDS_FAVOURING_DIVERGENCE} of {paper.SEEDS}",
        [
            f"{t[o]['agg']['vs_ratio']['seeds_favouring']} of "
            f"{t[o]['agg']['vs_ratio']['seeds_compared']} compared "
            f"({t[o]['agg']['vs_ratio']['seeds_tied']} tied)"
            for o in opts
        ],
    )
    row(
        "paired sign-test p (agg vs ratio)",
        f"{paper.SIGN_TEST_P:.3f}",
        [f"{t[o]['agg']['vs_ratio']['sign_test_p']:.3g}" for o in opts],
    )
    row(
        "shrink share of kept updates, ratio",
        _pct(paper.SHRINK_SHARE["ratio"]),
        [_pct(t[o]["ratio"]["shrink_share"]) for o in opts],
    )
    row(
        "shrink share of kept updates, divergence (agg)",
        _pct(paper.SHRINK_SHARE["divergence"]),
        [_pct(t[o]["agg"]["shrink_share"]) for o in opts],
    )
    row(
        "mean gap to the paper's four rates (pp)",
        "0",
        [f"{paper_gap(summary, o):.1f}" for o in opts],
    )
    return lines


def _per_test(summary: dict[str, Any], opt: str) -> list[str]:
    data = summary["optimizers"][opt]
    lines = [
        f"### {opt} (learning rate {data['lr_mean']:.3g}{' mean, matched per seed' if opt == 'sgd' else ''})",
        "",
        "| direction test | masked | kept | unsafe-keep (pooled / seed mean) | shrink share | "
        "seeds better / worse / tied vs ratio | sign-test p | sign accuracy (all / disagreeing) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for test in STEP_TESTS:
        t = data["tests"][test]
        cmp = t.get("vs_ratio")
        seeds = (
            f"{cmp['seeds_favouring']} / {cmp['seeds_against']} / {cmp['seeds_tied']}"
            if cmp
            else "–"
        )
        p = f"{cmp['sign_test_p']:.3g}" if cmp else "–"
        accuracy = _pct(t["sign_accuracy"]) if test != "none" else "–"
        if test in PREDICTIVE:
            accuracy += f" / {_pct(t['sign_accuracy_disagree'])}"
        lines.append(
            f"| {TEST_LABELS[test]} | {t['masked']} | {t['kept']} | "
            f"{_pct(t['unsafe_keep'])} / {_pct(t['unsafe_keep_seed_mean'])} | "
            f"{_pct(t['shrink_share'])} | {seeds} | {p} | {accuracy} |"
        )
    return lines


def markdown_report(summary: dict[str, Any], meta: dict[str, Any]) -> str:
    opts = list(summary["optimizers"])
    lines = [
        "# Token-level mechanism analysis",
        "",
        f"Training setting: `{meta['train_method']}` on `{meta['model']}` (sim stand-in), precision "
        f"`{meta['precision']}`, delta {meta['delta']:g}; {summary['seeds']} seeds; "
        f"{meta['train_steps']} RL steps, then a {meta['prompts']}-prompt rollout in "
        f"{meta['minibatches']} minibatches ({meta['split']}), the last one analysed. "
        f"Config hash `{meta['config_hash']}`.",
        "",
        "## The paper's table next to this run",
        "",
        "| | paper | this run |",
        "|---|---:|---:|",
        f"| out-of-region tokens per seed | {paper.OUT_OF_REGION_PER_SEED} | "
        f"{summary['out_of_region_per_seed']:.1f} ± {summary['out_of_region_sd']:.1f} "
        f"(of {summary['tokens_per_seed']:.0f} response tokens) |",
    ]
    for test in PREDICTIVE:
        paper_value = paper.DISAGREE_PER_SEED if test in ("agg", "uni") else "–"
        lines.append(
            f"| disagreeing tokens per seed, ratio vs {test} | {paper_value} | "
            f"{summary['disagree_per_seed'][test]:.1f} |"
        )
    lines += ["", *_headline(summary), ""]
    if len(opts) > 1:
        closest = min(opts, key=lambda o: paper_gap(summary, o))
        lines += [f"Closer to the paper's rates: **{closest}**.", ""]
    lines += [
        "Unsafe keep: an out-of-region token (D_t > delta, A_t != 0) the test did not mask whose "
        "D_t grew after that test's step. Shrink share: kept out-of-region tokens whose D_t "
        "shrank. Changes within the tie tolerance count as neither. Each test's step starts from "
        "the same saved parameters and optimizer state.",
        "",
        "## Every direction test",
        "",
    ]
    for opt in opts:
        lines += [*_per_test(summary, opt), ""]
    iso = summary["isolated"]
    lines += [
        "## Isolated single-token steps (the derivative without cross-token effects)",
        "",
        f"{iso['all']['tokens']} sampled out-of-region tokens; for each, one small SGD step on that "
        "token's loss alone, from the saved state: how often each test predicted the sign of the "
        "change of D_t. Whole network: the logits move along the network's kernel applied to "
        "v = e_k - pi. Output layer only: they move exactly along v, the step Ddot describes "
        "(Ddot_bucket is the exact derivative of the measured D_t there).",
        "",
        "| direction test | whole network | disagreeing (n) | output layer only | disagreeing (n) |",
        "|---|---:|---:|---:|---:|",
    ]
    for test in iso["all"]["accuracy"]:
        cells = []
        for layers in ("all", "output"):
            variant = iso[layers]
            cells.append(_pct(variant["accuracy"][test]))
            cells.append(
                f"{_pct(variant['accuracy_disagree'][test])} ({variant['disagree_tokens'][test]})"
                if test in variant["accuracy_disagree"]
                else "–"
            )
        lines.append(f"| {TEST_LABELS[test]} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Mean reward of the analysed rollouts {summary['reward_mean']:.3f}; "
        f"{summary['wall_s_per_seed']:.1f} s per seed on one core.",
        "",
    ]
    return "\n".join(lines)
