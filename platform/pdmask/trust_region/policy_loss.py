"""One call from a trainer's tensors to the aggregated loss, the mask and the diagnostics."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from pdmask.trust_region.diagnostics import diagnostics
from pdmask.trust_region.loss import aggregate_loss, per_token_loss
from pdmask.trust_region.methods import MethodSpec, method_mask
from pdmask.trust_region.stats import TokenStats, compute_token_stats

MaskFn = Callable[[TokenStats, torch.Tensor], torch.Tensor]


@dataclass
class PolicyLossResult:
    loss: torch.Tensor  # scalar, aggregated
    token_loss: torch.Tensor  # [...] per-token -M r A
    mask: torch.Tensor  # [...] bool, True = gradient zeroed
    stats: TokenStats
    metrics: dict[str, float]


def policy_loss(
    method: str | MethodSpec | MaskFn,
    logits: torch.Tensor,
    sampled_ids: torch.Tensor,
    mu_topk_ids: torch.Tensor | None,
    mu_topk_logprobs: torch.Tensor | None,
    mu_sampled_logprob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    delta: float | None = None,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    ratio_cap: float | None = None,
    loss_agg_mode: str = "token-mean",
    chunk_size: int | None = None,
    **global_batch_info,
) -> PolicyLossResult:
    """``method`` is a name of ``METHODS``, a ``MethodSpec``, or a recipe's own mask function."""
    stats = compute_token_stats(
        logits,
        sampled_ids,
        mu_topk_ids,
        mu_topk_logprobs,
        mu_sampled_logprob,
        chunk_size=chunk_size,
    )
    adv = advantages.to(stats.ratio.dtype)
    if callable(method) and not isinstance(method, MethodSpec):
        mask = method(stats, adv)
    else:
        mask = method_mask(method, stats, adv, delta=delta, eps_low=eps_low, eps_high=eps_high)
    valid = response_mask.bool()
    mask = mask & valid
    token_loss = per_token_loss(stats.logp, stats.mu_logp, adv, mask, ratio_cap)
    loss = aggregate_loss(token_loss, valid, loss_agg_mode, **global_batch_info)
    metrics = diagnostics(stats, adv, mask, valid, delta=delta)
    return PolicyLossResult(loss, token_loss, mask, stats, metrics)
