"""Judging the decisions: unsafe keeps, shrinking updates, and the paired sign test over seeds.

- A *kept* token is out of region and not masked by the test, so the step updated it.
- *Unsafe keep*: a kept token whose ``D_t`` grew (by more than ``tol``) after the step.
- *Shrink share*: kept tokens whose ``D_t`` shrank (by more than ``tol``). Changes within ``tol``
  count as neither, so the two shares add up to at most 1.
- A seed *favours* the predictive test when its unsafe-keep rate is lower than the ratio test's
  on that seed; the paired two-sided sign test asks whether the split of non-tied seeds could be
  a fair coin's.
- *Power*: the paired t-test of the per-seed differences, and the smallest mean difference this
  many seeds could detect at ``ALPHA`` (two-sided) with power ``POWER`` given the observed sd of
  the differences (exact, through the noncentral t distribution); for the sign test, how many of
  the compared seeds must favour one side for p <= ``ALPHA`` and the share of favouring seeds it
  detects with power ``POWER``.
"""

from __future__ import annotations

import math
import statistics

import torch
from scipy import optimize, stats

ALPHA = 0.05  # two-sided significance level of the power statements
POWER = 0.8


def count_outcomes(d_kl: torch.Tensor, kept: torch.Tensor, tol: float) -> dict[str, int]:
    """Counts of kept tokens, of those whose ``D_t`` grew and of those whose ``D_t`` shrank."""
    kept = kept.bool()
    return {
        "kept": int(kept.sum()),
        "grew": int((kept & (d_kl > tol)).sum()),
        "shrank": int((kept & (d_kl < -tol)).sum()),
    }


def rate(numerator: float, denominator: float) -> float:
    """``numerator / denominator``, NaN when there is nothing to divide."""
    return numerator / denominator if denominator else math.nan


def sign_test_p(wins: int, losses: int) -> float:
    """Exact two-sided binomial sign test of ``wins`` vs ``losses`` (ties already dropped)."""
    n = wins + losses
    if n == 0:
        return 1.0
    k = max(wins, losses)
    tail = sum(math.comb(n, i) for i in range(k, n + 1)) / 2**n
    return min(1.0, 2 * tail)


def paired_comparison(baseline: list[float], candidate: list[float]) -> dict[str, float]:
    """Seeds where ``candidate``'s rate is lower (favours it), higher, tied; the sign test.

    Seeds where either rate is NaN (nothing kept) are left out of the comparison.
    """
    pairs = [(b, c) for b, c in zip(baseline, candidate, strict=True) if not (b != b or c != c)]
    favour = sum(c < b for b, c in pairs)
    against = sum(c > b for b, c in pairs)
    return {
        "seeds_compared": len(pairs),
        "seeds_favouring": favour,
        "seeds_against": against,
        "seeds_tied": len(pairs) - favour - against,
        "sign_test_p": sign_test_p(favour, against),
        **paired_t(pairs),
        **sign_test_power(favour + against),
    }


def paired_t(pairs: list[tuple[float, float]]) -> dict[str, float]:
    """Paired t-test of ``candidate - baseline`` and its minimal detectable difference."""
    diffs = [c - b for b, c in pairs]
    n = len(diffs)
    if n < 2:
        return {"mean_difference": math.nan, "sd_difference": math.nan, "t_test_p": math.nan,
                "detectable_difference": math.nan}  # fmt: skip
    mean, sd = statistics.fmean(diffs), statistics.stdev(diffs)
    if sd == 0:
        p = 1.0 if mean == 0 else 0.0
    else:
        p = float(2 * stats.t.sf(abs(mean) / (sd / math.sqrt(n)), n - 1))
    return {
        "mean_difference": mean,
        "sd_difference": sd,
        "t_test_p": p,
        "detectable_difference": detectable_difference(n, sd),
    }


def detectable_difference(n: int, sd: float, alpha: float = ALPHA, power: float = POWER) -> float:
    """Smallest true mean difference a two-sided paired t-test on ``n`` pairs with difference sd
    ``sd`` rejects with probability ``power`` (noncentral t, solved exactly)."""
    if n < 2 or not sd > 0:
        return math.nan
    df, critical = n - 1, stats.t.ppf(1 - alpha / 2, n - 1)

    def shortfall(effect: float) -> float:
        nc = effect * math.sqrt(n) / sd
        wrong_side = stats.nct.cdf(-critical, df, nc)  # ~0, and NaN in scipy far in the tail
        return (
            stats.nct.sf(critical, df, nc)
            + (wrong_side if wrong_side == wrong_side else 0.0)
            - power
        )

    # Power is ~1 once the noncentrality exceeds the critical value by 10 (and scipy's noncentral
    # t is unreliable far beyond): that bounds the search.
    upper = (critical + 10) * sd / math.sqrt(n)
    return float(optimize.brentq(shortfall, 0.0, upper))


def sign_test_power(n: int, alpha: float = ALPHA, power: float = POWER) -> dict[str, float]:
    """For ``n`` non-tied seeds: the fewest favouring seeds with sign-test p <= ``alpha``, and the
    true share of favouring seeds that the test detects with probability ``power``."""
    needed = next((k for k in range(n // 2, n + 1) if sign_test_p(k, n - k) <= alpha), None)
    if needed is None:
        return {"sign_test_needed": math.nan, "sign_test_detectable_share": math.nan}

    def shortfall(share: float) -> float:
        return stats.binom.sf(needed - 1, n, share) + stats.binom.cdf(n - needed, n, share) - power

    share = 1.0 if shortfall(1.0) < 0 else float(optimize.brentq(shortfall, 0.5, 1.0))
    return {"sign_test_needed": float(needed), "sign_test_detectable_share": share}
