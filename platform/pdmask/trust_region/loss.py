"""The default per-token loss of every method, and verl's aggregation modes.

Per token: ``loss_t = -M_t * r_t * A_t`` with ``M_t = 1 - mask_t`` and the gradient flowing through
``r_t = exp(log pi - log mu)``, so ``d loss_t / d z = -M_t r_t A_t (e_k - pi)``. An optional ratio cap
``C`` (truncated importance sampling) makes the value ``-M A min(r, C)`` and scales the gradient by
``min(r, C) / r`` instead of dropping it. A recipe may bring its own per-token loss instead
(``Method.loss``); aggregation is always one of verl's modes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from pdmask.trust_region.contract import RecipeBatch

AGG_MODES = (
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)


def _ratio_surrogate(
    logp: torch.Tensor, mu_logp: torch.Tensor, advantages: torch.Tensor, ratio_cap: float | None
) -> torch.Tensor:
    ratio = (logp - mu_logp.to(logp.dtype)).exp()
    if ratio_cap is not None:
        detached = ratio.detach()
        ratio = ratio * (detached.clamp(max=ratio_cap) / detached)
    return -advantages.to(ratio.dtype) * ratio


def per_token_loss(
    logp: torch.Tensor,
    mu_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    ratio_cap: float | None = None,
) -> torch.Tensor:
    """``-M r A`` from raw tensors (zero where ``mask``), for callers without a recipe."""
    loss = _ratio_surrogate(logp, mu_logp, advantages, ratio_cap)
    return torch.where(mask, torch.zeros_like(loss), loss)


def ratio_loss(batch: RecipeBatch, ratio_cap: float | None = None) -> torch.Tensor:
    """The default loss hook: ``-r A`` per token (the mask is applied by ``apply_method``)."""
    return _ratio_surrogate(batch.log_prob, batch.mu_log_prob, batch.advantages, ratio_cap)


def _masked_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask.bool(), values, torch.zeros_like(values)).sum()


def aggregate_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    mode: str = "token-mean",
    *,
    dp_size: int = 1,
    batch_num_tokens: int | torch.Tensor | None = None,
    global_batch_size: int | torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Aggregate ``[B, T]`` per-token losses exactly as verl 0.9.1's ``agg_loss`` does.

    With the global batch info (``batch_num_tokens`` / ``global_batch_size`` of the whole
    mini-batch) the sum over micro-batches equals the whole-batch loss, whatever the split.
    """
    mask = loss_mask.to(loss_mat.dtype)
    if mode == "token-mean":
        if batch_num_tokens is None:
            if dp_size > 1:
                raise ValueError("batch_num_tokens is required when dp_size > 1")
            batch_num_tokens = loss_mask.sum()
        return _masked_sum(loss_mat, loss_mask) / batch_num_tokens * dp_size
    if mode == "token-sum":
        return _masked_sum(loss_mat, loss_mask) * dp_size
    if mode in ("seq-mean-token-sum", "seq-mean-token-sum-norm"):
        seq_losses = (loss_mat * mask).sum(-1)
        seq_mask = (mask.sum(-1) > 0).to(loss_mat.dtype)
        if global_batch_size is None:
            if dp_size > 1:
                raise ValueError("global_batch_size is required when dp_size > 1")
            global_batch_size = seq_mask.sum()
        loss = _masked_sum(seq_losses, seq_mask) / global_batch_size * dp_size
        if mode == "seq-mean-token-sum-norm":
            loss = loss / (loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor)
        return loss
    if mode == "seq-mean-token-mean":
        counts = mask.sum(-1)
        seq_losses = (loss_mat * mask).sum(-1) / (counts + 1e-8)
        seq_mask = (counts > 0).to(loss_mat.dtype)
        if global_batch_size is None:
            if dp_size > 1:
                raise ValueError("global_batch_size is required when dp_size > 1")
            global_batch_size = seq_mask.sum()
        return _masked_sum(seq_losses, seq_mask) / global_batch_size * dp_size
    raise ValueError(f"unknown loss_agg_mode {mode!r}; known: {', '.join(AGG_MODES)}")
