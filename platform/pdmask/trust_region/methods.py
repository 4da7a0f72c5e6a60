"""Proximity tests and direction tests by name, and the mask that composes two of them.

A token is masked (its gradient zeroed, ``True``) iff it is outside the region (proximity) AND the
update would push it further out (direction). Direction tests are strict, so ``A = 0`` is never
masked. These are building blocks: a method (a file in ``recipes/``) composes two of them by name
or brings its own mask; the math API holds no list of methods.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from pdmask.trust_region.stats import TokenStats

ProximityFn = Callable[..., torch.Tensor]
DirectionFn = Callable[[TokenStats, torch.Tensor], torch.Tensor]


def _ratio_outside(
    stats: TokenStats, advantages: torch.Tensor, *, eps_low: float, eps_high: float, **_
):
    return (stats.ratio < 1 - eps_low) | (stats.ratio > 1 + eps_high)


def _above(name: str) -> ProximityFn:
    def test(stats: TokenStats, advantages: torch.Tensor, *, delta: float, **_):
        return getattr(stats, name) > delta

    test.__name__ = f"{name}_above_delta"
    return test


PROXIMITY_TESTS: dict[str, ProximityFn] = {
    "ratio": _ratio_outside,  # r < 1 - eps_low or r > 1 + eps_high
    "kl_binary": _above("kl_binary"),
    "tv_binary": _above("tv_binary"),
    "kl_topk": _above("kl_topk"),
    "tv_topk": _above("tv_topk"),
}
"""Proximity tests by name: True where the token is outside the trust region."""


def _signed(name: str) -> DirectionFn:
    def test(stats: TokenStats, advantages: torch.Tensor) -> torch.Tensor:
        return advantages * getattr(stats, name) > 0

    test.__name__ = f"adv_times_{name}_positive"
    return test


def _ratio_direction(stats: TokenStats, advantages: torch.Tensor) -> torch.Tensor:
    return advantages * (stats.ratio - 1) > 0


def _tv_direction(stats: TokenStats, advantages: torch.Tensor) -> torch.Tensor:
    # The one-sided TV derivative along the actual step sign(A) * v.
    return torch.where(
        advantages > 0,
        stats.tv_deriv_pos > 0,
        (advantages < 0) & (stats.tv_deriv_neg > 0),
    )


DIRECTION_TESTS: dict[str, DirectionFn] = {
    "ratio": _ratio_direction,  # A (r - 1) > 0: keeps only the local term of Ddot
    "ddot_agg": _signed("ddot_agg"),
    "ddot_uni": _signed("ddot_uni"),
    "ddot_bucket": _signed("ddot_bucket"),
    "tv_deriv": _tv_direction,
}
"""Direction tests by name: True where the update would push the token further out."""


def proximity_test(
    name: str, stats: TokenStats, advantages: torch.Tensor, **params
) -> torch.Tensor:
    if name not in PROXIMITY_TESTS:
        raise KeyError(f"unknown proximity test {name!r}; known: {', '.join(PROXIMITY_TESTS)}")
    return PROXIMITY_TESTS[name](stats, advantages, **params)


def direction_test(name: str, stats: TokenStats, advantages: torch.Tensor) -> torch.Tensor:
    if name not in DIRECTION_TESTS:
        raise KeyError(f"unknown direction test {name!r}; known: {', '.join(DIRECTION_TESTS)}")
    return DIRECTION_TESTS[name](stats, advantages)


def composed_mask(
    proximity: str,
    direction: str,
    stats: TokenStats,
    advantages: torch.Tensor,
    *,
    delta: float | None = None,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
) -> torch.Tensor:
    """``proximity & direction``: True = gradient zeroed."""
    if proximity != "ratio" and delta is None:
        raise ValueError(f"proximity test {proximity!r} needs delta")
    outside = proximity_test(
        proximity, stats, advantages, delta=delta, eps_low=eps_low, eps_high=eps_high
    )
    return outside & direction_test(direction, stats, advantages)
