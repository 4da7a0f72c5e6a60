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
from pdmask.analysis.outcomes import ALPHA, POWER
from pdmask.analysis.quantities import KERNEL_FIT_TOKENS, PREDICTIVE
from pdmask.analysis.seed import TOPK_MASS_QUANTILES
from pdmask.analysis.summary import STEP_TESTS

TEST_LABELS = {
    "none": "keep all (no mask)",
    "ratio": "ratio test A(r-1) > 0",
    "agg": "Ddot_agg (aggregated tail)",
    "uni": "Ddot_uni (uniform tail)",
    "bucket": "Ddot_bucket (bucket estimator)",
    "2nd": "second order: t Ddot_agg + t²/2 var_v_agg > 0, t = 0.1 A",
    "exact": "exact full-vocabulary Ddot (oracle)",
    "gram": "gram_agg (output-embedding kernel term)",
    "kernel": "‖h‖² Ddot_agg + c gram_agg (c fitted)",  # no pipes: a table cell
    "own": "exact own-gradient prediction, SGD (oracle)",
    "own-adam": "exact own-gradient prediction, AdamW (oracle)",
}
ISOLATED_LABELS = {"all": "single-token SGD step", "output": "single-token output-layer step"}
Row = tuple[str, str, str, str, float | None, float | None]
DETECTABLE = "smallest detectable mean difference (paired t, alpha 0.05, power 0.8)"


def _pct(x: float | None) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f} %"


def _num(x: float | None, digits: int = 1) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:.{digits}f}" if isinstance(x, float) and not x.is_integer() else f"{int(x)}"


def table_rows(summary: dict[str, Any]) -> list[Row]:
    """The paper's table and this run's values, long format."""
    paper_diff = paper.UNSAFE_KEEP["divergence"] - paper.UNSAFE_KEEP["ratio"]
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
                    ("power", "mean per-seed difference vs ratio", opt, test, paper_diff if on_paper else None, cmp["mean_difference"]),
                    ("power", "sd of per-seed differences", opt, test, None, cmp["sd_difference"]),
                    ("power", "paired t-test p (two-sided)", opt, test, None, cmp["t_test_p"]),
                    ("power", DETECTABLE, opt, test, None, cmp["detectable_difference"]),
                    ("power", "sign test: favouring seeds needed for p <= 0.05", opt, test, None, cmp["sign_test_needed"]),
                    ("power", "sign test: favouring share detected with power 0.8", opt, test, None, cmp["sign_test_detectable_share"]),
                ]  # fmt: skip
        rows.append(("steps", "learning rate (mean over seeds)", opt, "", None, data["lr_mean"]))
        rounding = summary["rounding"][opt]
        rows += [
            ("precision", "max |float32 - float64| of the change of D_t", opt, "", None, rounding["max_abs"]),
            ("precision", "median |change of D_t|, out-of-region tokens", opt, "", None, rounding["median_change_oor"]),
            ("precision", "out-of-region tokens classified differently in float64", opt, "", None, float(rounding["oor_flipped"])),
        ]  # fmt: skip
    for q, value in zip(TOPK_MASS_QUANTILES, summary["topk_mass"], strict=True):
        rows.append(("behaviour", f"top-K mass of mu, quantile {q:g}", "", "", None, value))
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


def headline_table(summary: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The paper-vs-run table as text cells: (column headers, rows), each row a quantity, the
    paper's value, then this run's per optimizer. The report's first table and what
    `pdm analyze tokens` prints."""
    opts = list(summary["optimizers"])
    columns = ["", "paper", *(f"this run, {o}" for o in opts)]
    rows: list[list[str]] = []

    def row(label: str, paper_value: str, values: list[str]) -> None:
        rows.append([label, paper_value, *values])

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
    return columns, rows


def _headline(summary: dict[str, Any]) -> list[str]:
    columns, rows = headline_table(summary)
    lines = ["| | " + " | ".join(columns[1:]) + " |", "|---|" + "---:|" * (len(columns) - 1)]
    return lines + ["| " + " | ".join(cells) + " |" for cells in rows]


def _per_test(summary: dict[str, Any], opt: str) -> list[str]:
    data = summary["optimizers"][opt]
    lines = [
        f"### {opt} (learning rate {data['lr_mean']:.3g}{' mean, matched per seed' if opt == 'sgd' else ''})",
        "",
        "| direction test | masked | kept | unsafe-keep (pooled / seed mean) | shrink share | "
        "− ratio (pp, per seed ± sd; paired t p) | seeds better / worse / tied vs ratio | "
        "sign-test p | sign accuracy (all / disagreeing) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
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
        difference = (
            f"{100 * cmp['mean_difference']:+.2f} ± {100 * cmp['sd_difference']:.2f}; "
            f"{cmp['t_test_p']:.2g}"
            if cmp and not math.isnan(cmp["mean_difference"])
            else "–"
        )
        accuracy = _pct(t["sign_accuracy"]) if test != "none" else "–"
        if test in PREDICTIVE:
            accuracy += f" / {_pct(t['sign_accuracy_disagree'])}"
        lines.append(
            f"| {TEST_LABELS[test]} | {t['masked']} | {t['kept']} | "
            f"{_pct(t['unsafe_keep'])} / {_pct(t['unsafe_keep_seed_mean'])} | "
            f"{_pct(t['shrink_share'])} | {difference} | {seeds} | {p} | {accuracy} |"
        )
    return lines


def _analysed(count: int) -> str:
    return "the last minibatch" if count == 1 else f"the last {count} minibatches"


def _power(summary: dict[str, Any], meta: dict[str, Any]) -> list[str]:
    """What this run could have detected: paired t and sign-test power of agg vs ratio."""
    opts = list(summary["optimizers"])
    lines = [
        "## Power and resolution (divergence test agg vs the ratio test)",
        "",
        "| | " + " | ".join(opts) + " |",
        "|---|" + "---:|" * len(opts),
    ]
    cmp = {o: summary["optimizers"][o]["tests"]["agg"]["vs_ratio"] for o in opts}
    kept = {o: summary["optimizers"][o]["tests"]["ratio"]["kept"] for o in opts}

    def row(label: str, cells: list[str]) -> None:
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    def pp(x: float) -> str:
        return "–" if x != x else f"{100 * x:+.2f}"

    row("seeds compared", [f"{cmp[o]['seeds_compared']}" for o in opts])
    row(
        "mean per-seed difference agg − ratio (pp) ± sd",
        [f"{pp(cmp[o]['mean_difference'])} ± {100 * cmp[o]['sd_difference']:.2f}" for o in opts],
    )
    row("paired t-test p (two-sided)", [f"{cmp[o]['t_test_p']:.3g}" for o in opts])
    row(
        f"smallest detectable mean difference (pp; paired t, α = {ALPHA:g} two-sided, power "
        f"{POWER:g}, observed sd)",
        [f"{100 * cmp[o]['detectable_difference']:.2f}" for o in opts],
    )
    row(
        "sign test: seeds of the non-tied that must favour one side for p ≤ 0.05",
        [f"{_num(cmp[o]['sign_test_needed'])} of {cmp[o]['seeds_favouring'] + cmp[o]['seeds_against']}" for o in opts],
    )  # fmt: skip
    row(
        f"sign test: share of favouring seeds detected with power {POWER:g}",
        [f"{cmp[o]['sign_test_detectable_share']:.2f}" for o in opts],
    )
    row(
        "resolution of the pooled rate (one kept token of the ratio test, pp)",
        [f"{100 / kept[o]:.3f}" if kept[o] else "–" for o in opts],
    )
    lines += [
        "",
        "The paper's effect is −2.7 pp (38 of 61 seeds, sign-test p 0.072). An effect is "
        "detectable here when it is larger than the smallest detectable mean difference.",
    ]
    return lines


def _precision(summary: dict[str, Any], meta: dict[str, Any]) -> list[str]:
    lines = ["## Precision and the behaviour's top-K view", ""]
    for opt, r in summary["rounding"].items():
        lines.append(
            f"- {opt}: the keep-all step's change of D_t recomputed in float64 differs from the "
            f"float32 one by at most {r['max_abs']:.2g} ({r['max_abs_oor']:.2g} on out-of-region "
            f"tokens; {r['tokens']} tokens); the median |change| of out-of-region tokens is "
            f"{r['median_change_oor']:.2g}; {r['oor_flipped']} out-of-region tokens are "
            f"classified differently (grew / shrank / unchanged). Tie tolerance {meta['tie_tol']:g}"
            + (" (above the rounding)." if meta["tie_tol"] > r["max_abs"] else
               " (**below the measured rounding: raise --tie-tol**).")
        )  # fmt: skip
    quantiles = ", ".join(
        f"p{100 * q:g} {_pct(v)}" for q, v in zip(TOPK_MASS_QUANTILES, summary["topk_mass"], strict=True)
    )  # fmt: skip
    lines.append(f"- mu's top-K mass over the analysed tokens (mean over seeds): {quantiles}.")
    return lines


def markdown_report(summary: dict[str, Any], meta: dict[str, Any]) -> str:
    opts = list(summary["optimizers"])
    lines = [
        "# Token-level mechanism analysis",
        "",
        f"Training setting: `{meta['train_method']}` on `{meta['model']}` (sim stand-in), precision "
        f"`{meta['precision']}`, delta {meta['delta']:g}, task regime `{meta['task']}`, profile "
        f"`{meta['profile']}`; {summary['seeds']} seeds; {meta['train_steps']} RL steps, then a "
        f"{meta['prompts']}-prompt rollout in {meta['minibatches']} minibatches ({meta['split']}), "
        f"{_analysed(meta['analysed_minibatches'])} each analysed from its own state. "
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
    lines += [
        "",
        *_headline(summary),
        "",
        *_power(summary, meta),
        "",
        *_precision(summary, meta),
        "",
    ]
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
    c_mean, c_sd = summary["kernel_scale"]
    lines += [
        f"The kernel test's fitted scale c: {c_mean:.3g} ± {c_sd:.3g} over seeds (least squares "
        f"on {KERNEL_FIT_TOKENS} tokens' exact predictions per minibatch).",
        "",
    ]
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
