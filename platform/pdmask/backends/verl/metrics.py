"""The ``actor/pdm/...`` diagnostics as verl metrics with explicit aggregation.

verl reduces a metric over micro-batches and DP ranks by its ``Metric`` aggregation type, and
then over the mini-batches of a step by *name*: ``reduce_metrics`` takes the max of any key that
merely contains "max" and the min of any key containing "min". No pdmask key may contain either
(``tests/verl`` checks this).

A token-mean diagnostic (its denominator is the valid response tokens) is emitted like verl's own
``pg_loss``: each micro-batch contributes ``sum / batch_num_tokens * dp_size`` and the values are
SUMmed, which is the exact mean over the whole mini-batch whatever the micro-batch split. Means
over a sub-population (tokens with A > 0, A < 0) cannot be weighted that way and are averaged.

``actor/entropy`` has verl's name and meaning (and the embedded backend's): the policy's entropy
over the step's response tokens before its updates, aggregated with the actor's
``loss_agg_mode``. verl computes it in its old-log-prob pass, which bypass mode skips; so the
logits hook computes it in every mini-batch's forward, and the step keeps the first mini-batch's
value (:func:`keep_first_update`), the one taken at the parameters the step started from, as the
embedded backend does. Where verl's own pass ran (mu recomputed) the trainer keeps verl's.
"""

from __future__ import annotations

import torch
from verl.trainer.ppo.core_algos import agg_loss
from verl.utils.metric import AggregationType, Metric

from pdmask.trust_region import TokenStats, diagnostics

PREFIX = "actor/pdm/"
SUBPOPULATION_MEANS = frozenset({"masked_frac_pos_adv", "masked_frac_neg_adv"})
ENTROPY_METRIC = "actor/entropy"  # verl's name; the figures' diagnostics read it


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
    n_missing, n_valid = torch.stack([missing.sum(), valid.sum()]).tolist()  # one read back
    values["topk_missing_frac"] = n_missing / max(n_valid, 1)
    out = {}
    for name, value in values.items():
        if batch_num_tokens is not None and name not in SUBPOPULATION_MEANS:
            out[metric_key(name)] = Metric(
                AggregationType.SUM, value * n_valid / batch_num_tokens * dp_size
            )
        else:
            out[metric_key(name)] = Metric(AggregationType.MEAN, value)
    return out


def add_entropy_metric(
    metrics: dict, entropy: torch.Tensor, response_mask: torch.Tensor, config
) -> None:
    """The micro-batch's share of ``actor/entropy``, added to the metrics ``ppo_loss`` returned:
    verl's ``agg_loss`` of the per-token entropy ``(B, R)`` with the actor's ``loss_agg_mode``
    and the global batch info ``ppo_loss`` has just set, aggregated as verl aggregates its
    ``pg_loss``, so the micro-batches combine into the mini-batch's value whatever the split."""
    value = agg_loss(
        loss_mat=entropy.detach().float(),
        loss_mask=response_mask.bool(),
        loss_agg_mode=config.loss_agg_mode,
        **config.global_batch_info,
    )
    metrics[ENTROPY_METRIC] = Metric(metrics["actor/pg_loss"].aggregation, value.item())


def keep_first_update(metrics: dict) -> None:
    """In the metrics of a step's updates (verl's ``train_mini_batch``: a list per key, one value
    per mini-batch), ``actor/entropy`` keeps its first mini-batch's value only."""
    if metrics.get(ENTROPY_METRIC):
        metrics[ENTROPY_METRIC] = metrics[ENTROPY_METRIC][:1]
