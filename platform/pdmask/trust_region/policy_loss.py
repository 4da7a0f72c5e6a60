"""One call from a trainer's tensors to the aggregated loss, the mask and the diagnostics."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pdmask.trust_region.contract import RECIPE_METRIC_GROUP
from pdmask.trust_region.diagnostics import diagnostics
from pdmask.trust_region.hooks import Method, apply_method
from pdmask.trust_region.loss import aggregate_loss
from pdmask.trust_region.stats import TokenStats, compute_token_stats


@dataclass
class PolicyLossResult:
    loss: torch.Tensor  # scalar, aggregated
    token_loss: torch.Tensor  # [...] the method's per-token loss (0 on masked and padding tokens)
    mask: torch.Tensor  # [...] bool, True = gradient zeroed
    stats: TokenStats
    metrics: dict[str, float]


def policy_loss(
    method: Method,
    logits: torch.Tensor,
    sampled_ids: torch.Tensor,
    mu_topk_ids: torch.Tensor | None,
    mu_topk_logprobs: torch.Tensor | None,
    mu_sampled_logprob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    delta: float | None = None,
    loss_agg_mode: str = "token-mean",
    chunk_size: int | None = None,
    backend: str = "math",
    precision: str | None = None,
    **global_batch_info,
) -> PolicyLossResult:
    """``method`` (a recipe's, from ``Recipe.method(params)``) on ``[B, T]`` response tokens.

    ``delta`` only enables the out-of-region diagnostics; the method carries its own parameters.
    """
    stats = compute_token_stats(
        logits,
        sampled_ids,
        mu_topk_ids,
        mu_topk_logprobs,
        mu_sampled_logprob,
        chunk_size=chunk_size,
        inputs=method.needs,
    )
    valid = response_mask.bool()
    out = apply_method(method, stats, advantages, valid, backend=backend, precision=precision)
    loss = aggregate_loss(out.token_loss, valid, loss_agg_mode, **global_batch_info)
    metrics = diagnostics(out.batch.stats, out.batch.advantages, out.mask, valid, delta=delta)
    metrics |= {RECIPE_METRIC_GROUP + k: v for k, v in out.batch.reported.items()}
    return PolicyLossResult(loss, out.token_loss, out.mask, out.batch.stats, metrics)
