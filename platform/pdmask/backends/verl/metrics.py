"""The ``actor/pdm/...`` diagnostics as verl metrics with explicit aggregation.

verl reduces a metric over micro-batches and DP ranks by its ``Metric`` aggregation type, and
then over the mini-batches of a step by *name*: ``reduce_metrics`` takes the max of any key that
merely contains "max" and the min of any key containing "min". No pdmask key may contain either
(``tests/verl`` checks this).

A token-mean diagnostic (its denominator is the valid response tokens) is emitted like verl's own
``pg_loss``: each micro-batch contributes ``sum / batch_num_tokens * dp_size`` and the values are
SUMmed, which is the exact mean over the whole mini-batch whatever the micro-batch split. Means
over a sub-population (tokens with A > 0, A < 0) cannot be weighted that way and are averaged.
"""

from __future__ import annotations

import torch
from verl.utils.metric import AggregationType, Metric

from pdmask.trust_region import TokenStats, diagnostics

PREFIX = "actor/pdm/"
SUBPOPULATION_MEANS = frozenset({"masked_frac_pos_adv", "masked_frac_neg_adv"})


def metric_key(name: str) -> str:
    key = PREFIX + name
    if "max" in key or "min" in key:
        raise ValueError(f"metric {key!r} contains 'max'/'min': verl would reduce it with max/min")
    return key


def diagnostic_metrics(
    stats: TokenStats,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    valid: torch.Tensor,
    *,
    delta: float | None,
    batch_num_tokens: int | None,
    dp_size: int,
) -> dict[str, Metric]:
    """The math API's diagnostics for one micro-batch, ready for verl's metric pipeline."""
    values = diagnostics(stats, advantages, mask, valid, delta=delta)
    valid = valid.bool()
    # Tokens whose support is only {y_t}: the behaviour top-K was missing or misaligned.
    missing = (stats.support_size <= 1) & valid
    values["topk_missing_frac"] = float(missing.sum()) / max(int(valid.sum()), 1)
    n_valid = int(valid.sum())
    out = {}
    for name, value in values.items():
        if batch_num_tokens is not None and name not in SUBPOPULATION_MEANS:
            out[metric_key(name)] = Metric(
                AggregationType.SUM, value * n_valid / batch_num_tokens * dp_size
            )
        else:
            out[metric_key(name)] = Metric(AggregationType.MEAN, value)
    return out
