"""Judging the decisions: unsafe keeps, shrinking updates, and the paired sign test over seeds.

- A *kept* token is out of region and not masked by the test, so the step updated it.
- *Unsafe keep*: a kept token whose ``D_t`` grew (by more than ``tol``) after the step.
- *Shrink share*: kept tokens whose ``D_t`` shrank (by more than ``tol``). Changes within ``tol``
  count as neither, so the two shares add up to at most 1.
- A seed *favours* the predictive test when its unsafe-keep rate is lower than the ratio test's
  on that seed; the paired two-sided sign test asks whether the split of non-tied seeds could be
  a fair coin's.
"""

from __future__ import annotations

import math

import torch


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
    }
