"""The exact full-vocabulary KL and ``Ddot``, for when the behaviour distribution is fully known.

A production trainer sees mu only on its top-K, so the masks use the estimators of ``stats``; a
small model, a simulator or an offline study can hold mu over the whole vocabulary, and then these
are the quantities the estimators approximate (paper.md)::

    KL(mu || pi) = sum_i mu_i (log mu_i - log pi_i)
    Ddot         = (pi_k - mu_k) + sum_i pi_i (mu_i - pi_i)     d/d eta KL(mu || softmax(z + eta v)) at 0
    gram         = <W^T (pi - mu), w_k - W^T pi>                   the output-embedding kernel term

For diagnostics and analysis only (how often each estimator gets the sign of ``Ddot`` right):
it makes ``[N, V]`` float32 copies, unlike the chunked statistics pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ExactDivergence:
    """Per-token exact quantities, shape ``[N]``."""

    kl: torch.Tensor  # KL(mu || pi) over the whole vocabulary
    ddot: torch.Tensor  # the derivative the masks' direction tests estimate


@torch.no_grad()
def exact_divergence(
    logits: torch.Tensor, mu_logprobs: torch.Tensor, sampled_ids: torch.Tensor
) -> ExactDivergence:
    """``logits`` ``[N, V]`` of pi, ``mu_logprobs`` ``[N, V]`` (full log-probs of mu, ``-inf``
    allowed), ``sampled_ids`` ``[N]``. Float64 inputs stay float64; others are computed in float32."""
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    log_pi = torch.log_softmax(logits.detach().to(dtype), dim=-1)
    log_mu = mu_logprobs.to(dtype)
    mu, pi = log_mu.exp(), log_pi.exp()
    k = sampled_ids.long().unsqueeze(-1)
    local = (pi.gather(-1, k) - mu.gather(-1, k)).squeeze(-1)
    global_term = (pi * (mu - pi)).sum(-1)
    kl = torch.where(mu > 0, mu * (log_mu - log_pi), 0.0).sum(-1)
    return ExactDivergence(kl=kl, ddot=local + global_term)


@torch.no_grad()
def exact_gram(
    logits: torch.Tensor, mu_logprobs: torch.Tensor, sampled_ids: torch.Tensor, weight: torch.Tensor
) -> torch.Tensor:
    """``<W^T (pi - mu), w_k - W^T pi>`` per token over the whole vocabulary (``kernel``'s module
    docstring): ``weight`` ``[V, d]`` is the lm head (rows the output embeddings); the other
    inputs as :func:`exact_divergence`."""
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    pi = torch.softmax(logits.detach().to(dtype), dim=-1)
    w = weight.detach().to(dtype)
    pi_embed = pi @ w
    u_embed = pi_embed - mu_logprobs.to(dtype).exp() @ w
    v_embed = w[sampled_ids.long()] - pi_embed
    return (u_embed * v_embed).sum(-1)
