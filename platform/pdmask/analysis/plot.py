"""The per-seed paired plot: each seed's unsafe-keep rate under the ratio test and under ``agg``.

One row per optimizer. Left: a slope graph, one line per seed from its ratio-test rate to its
divergence-test rate (green when the divergence test is lower, i.e. the seed favours it), pooled
rates as black markers, the paper's pooled rates as grey stars. Right: the per-seed differences,
sorted, so the 38-of-61 style count can be read off directly; the title adds the paired t-test
and the smallest mean difference the run could detect.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from pdmask.analysis import paper

FAVOURS, AGAINST, TIED = "#1a9850", "#d73027", "#999999"


def paired_plot(summary: dict[str, Any], path: Path, *, estimator: str = "agg") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    opts = list(summary["optimizers"])
    fig, axes = plt.subplots(len(opts), 2, figsize=(10, 4.2 * len(opts)), squeeze=False)
    for row, opt in zip(axes, opts, strict=True):
        tests = summary["optimizers"][opt]["tests"]
        base = tests["ratio"]["per_seed_unsafe_keep"]
        cand = tests[estimator]["per_seed_unsafe_keep"]
        pairs = [(b, c) for b, c in zip(base, cand, strict=True) if not (math.isnan(b + c))]
        left, right = row
        for b, c in pairs:
            colour = FAVOURS if c < b else AGAINST if c > b else TIED
            left.plot([0, 1], [100 * b, 100 * c], color=colour, alpha=0.5, lw=1)
        left.plot(
            [0, 1],
            [100 * tests["ratio"]["unsafe_keep"], 100 * tests[estimator]["unsafe_keep"]],
            "k-o",
            lw=2.5,
            label="this run, pooled",
        )
        left.plot(
            [0, 1],
            [100 * paper.UNSAFE_KEEP["ratio"], 100 * paper.UNSAFE_KEEP["divergence"]],
            "*--",
            color="grey",
            ms=12,
            label="paper, pooled",
        )
        left.set_xticks([0, 1], ["ratio test", f"divergence test ({estimator})"])
        left.set_xlim(-0.25, 1.25)
        left.set_ylabel("unsafe-keep rate (%)")
        left.set_title(f"{opt}: unsafe-keep rate per seed")
        left.legend(loc="best", fontsize=8)

        diffs = sorted(100 * (c - b) for b, c in pairs)
        colours = [FAVOURS if d < 0 else AGAINST if d > 0 else TIED for d in diffs]
        right.bar(range(len(diffs)), diffs, color=colours)
        right.axhline(0, color="black", lw=0.8)
        cmp = tests[estimator]["vs_ratio"]
        right.set_title(
            f"{opt}: {estimator} − ratio per seed\n{cmp['seeds_favouring']} of "
            f"{cmp['seeds_compared']} seeds favour {estimator}, {cmp['seeds_tied']} tied; "
            f"sign test p = {cmp['sign_test_p']:.3g}\nmean {100 * cmp['mean_difference']:+.2f} pp, "
            f"paired t p = {cmp['t_test_p']:.3g}; detectable: "
            f"{100 * cmp['detectable_difference']:.2f} pp (power 0.8)",
            fontsize=9,
        )
        right.set_xlabel("seeds, sorted")
        right.set_ylabel("difference (pp)")
    fig.suptitle(
        f"Paper: {paper.SEEDS_FAVOURING_DIVERGENCE} of {paper.SEEDS} seeds favour the divergence "
        f"test; unsafe keeps {100 * paper.UNSAFE_KEEP['ratio']:.1f} % → "
        f"{100 * paper.UNSAFE_KEEP['divergence']:.1f} %",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
