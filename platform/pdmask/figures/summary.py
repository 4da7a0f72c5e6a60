"""The summary table: final and best value per method and setting, and paired differences.

Statistics use each seed's *raw* curve (mean over datasets, no smoothing): ``final`` is the value at
the seed's last evaluated step (for a run that stopped early, where it stopped), ``best`` its
maximum. Across seeds we report the mean ± the half-width of a Student-t confidence interval.
The paired difference of a method against the baseline is taken seed by seed (same ``pdm.seed``
tag in the same setting), so seed-to-seed variation shared by both methods cancels.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from pdmask.figures.panels import honest_title
from pdmask.figures.runs import RunRecord
from pdmask.figures.series import Curve
from pdmask.figures.spec import BEYOND_PAPER_MARK, FigureSpec


@dataclass(frozen=True)
class Estimate:
    """Mean over seeds with a t-interval half-width (NaN below two seeds)."""

    mean: float
    half_width: float
    n: int

    def text(self, digits: int = 3) -> str:
        if self.n == 0:
            return "–"
        if math.isnan(self.half_width):
            return f"{self.mean:.{digits}f} (n={self.n})"
        return f"{self.mean:.{digits}f} ± {self.half_width:.{digits}f} (n={self.n})"


def estimate(values: Sequence[float], level: float) -> Estimate:
    values = np.asarray(values, dtype=np.float64)
    n = int(values.size)
    if n == 0:
        return Estimate(math.nan, math.nan, 0)
    mean = float(values.mean())
    if n < 2:
        return Estimate(mean, math.nan, n)
    sem = float(values.std(ddof=1)) / math.sqrt(n)
    return Estimate(mean, sem * float(stats.t.ppf((1 + level) / 2, n - 1)), n)


@dataclass(frozen=True)
class Endpoints:
    final_step: int
    final: float
    best: float


def endpoints(curve: Curve) -> Endpoints | None:
    if len(curve) == 0:
        return None
    return Endpoints(int(curve.steps[-1]), float(curve.values[-1]), float(np.max(curve.values)))


CellRuns = Mapping[tuple[str, str], Sequence[tuple[RunRecord, Curve]]]


def summary_rows(spec: FigureSpec, cells: CellRuns) -> list[dict]:
    """Long-format rows: one per (setting, method), then one per (setting, paired method)."""
    level = spec.paired.level if spec.paired else 0.95
    rows: list[dict] = []
    per_seed: dict[tuple[str, str], dict[str, Endpoints]] = {}
    for panel in spec.panels:
        for method in spec.all_methods:
            ends = {
                run.seed or run.run_id: e
                for run, curve in cells.get((panel.key, method), [])
                if (e := endpoints(curve)) is not None
            }
            per_seed[(panel.key, method)] = ends
            final = estimate([e.final for e in ends.values()], level)
            best = estimate([e.best for e in ends.values()], level)
            steps = sorted({e.final_step for e in ends.values()})
            rows.append(
                {
                    "kind": "method",
                    "setting": panel.key,
                    "method": method,
                    "baseline": "",
                    "n": final.n,
                    "final_mean": final.mean,
                    "final_ci": final.half_width,
                    "best_mean": best.mean,
                    "best_ci": best.half_width,
                    "final_steps": " ".join(map(str, steps)),
                    "wins_final": "",
                    "seeds": " ".join(sorted(ends)),
                }
            )
    if spec.paired is None:
        return rows
    for panel in spec.panels:
        base = per_seed[(panel.key, spec.paired.baseline)]
        for method in spec.paired.methods:
            mine = per_seed[(panel.key, method)]
            seeds = sorted(set(base) & set(mine))
            d_final = [mine[s].final - base[s].final for s in seeds]
            d_best = [mine[s].best - base[s].best for s in seeds]
            final = estimate(d_final, level)
            best = estimate(d_best, level)
            rows.append(
                {
                    "kind": "paired",
                    "setting": panel.key,
                    "method": method,
                    "baseline": spec.paired.baseline,
                    "n": final.n,
                    "final_mean": final.mean,
                    "final_ci": final.half_width,
                    "best_mean": best.mean,
                    "best_ci": best.half_width,
                    "final_steps": "",
                    "wins_final": f"{sum(d > 0 for d in d_final)}/{len(d_final)}",
                    "seeds": " ".join(seeds),
                }
            )
    return rows


def summary_markdown(
    spec: FigureSpec, rows: list[dict], metric_label: str, titles: dict[str, str] | None = None
) -> str:
    """The summary as Markdown tables (what the CLI prints and the paper draft pastes).
    ``titles``: each setting's title as its panel shows it (default: as a panel without runs
    shows it)."""
    level = spec.paired.level if spec.paired else 0.95
    titles = titles or {p.key: honest_title(p, set()) for p in spec.panels}
    titles = {key: " ".join(title.split()) for key, title in titles.items()}  # one line per cell

    def cell(mean: float, ci: float, n: int) -> str:
        return Estimate(mean, ci, n).text()

    def shown(method: str) -> str:
        return f"{method} {BEYOND_PAPER_MARK}" if method in spec.beyond_paper else method

    lines = [
        f"## {spec.name}: {metric_label}",
        "",
        f"Mean ± {level:.0%} t-interval over seeds; final = value at each seed's last evaluated "
        "step, best = each seed's maximum (raw, unsmoothed).",
        "",
        "| setting | method | final | best |",
        "|---|---|---|---|",
    ]
    for r in rows:
        if r["kind"] == "method" and r["n"] > 0:
            lines.append(
                f"| {titles[r['setting']]} | {shown(r['method'])} | "
                f"{cell(r['final_mean'], r['final_ci'], r['n'])} | "
                f"{cell(r['best_mean'], r['best_ci'], r['n'])} |"
            )
    paired = [r for r in rows if r["kind"] == "paired" and r["n"] > 0]
    if paired:
        lines += [
            "",
            f"Paired difference (method − {spec.paired.baseline}), paired by seed within a "
            f"setting; mean ± {level:.0%} t-interval; wins = seeds where the method's final "
            "value is higher.",
            "",
            "| setting | method | Δ final | Δ best | wins (final) |",
            "|---|---|---|---|---|",
        ]
        for r in paired:
            lines.append(
                f"| {titles[r['setting']]} | {shown(r['method'])} | "
                f"{cell(r['final_mean'], r['final_ci'], r['n'])} | "
                f"{cell(r['best_mean'], r['best_ci'], r['n'])} | {r['wins_final']} |"
            )
    missing: dict[str, list[str]] = {}
    for r in rows:
        if r["kind"] == "method" and r["n"] == 0:
            missing.setdefault(titles[r["setting"]], []).append(shown(r["method"]))
    if missing:
        parts = [
            f"{title}: {'all methods' if len(ms) == len(spec.all_methods) else ', '.join(ms)}"
            for title, ms in missing.items()
        ]
        lines += ["", "No data (left out above): " + "; ".join(parts) + "."]
    return "\n".join(lines) + "\n"
