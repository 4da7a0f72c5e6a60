"""The top-K support ``S = TopK(mu, K) ∪ {k}`` built from what a rollout engine returns.

A rollout engine gives, per response token, the behaviour policy's top-K ids and log-probs (slots
may be missing, ``-inf`` under top-p/top-k truncation, or the ``-1e4`` sentinel of the VeRL data
layout) and the log-prob of the sampled token. This module turns that into ``K+1`` slots:
slots ``0..K-1`` hold the valid, de-duplicated top-K entries, slot ``K`` holds the sampled token
unless it already appears among them. Invalid slots carry the sampled id (so scattering into them
is harmless) and ``-inf`` log-probs (so they weigh nothing); ``valid`` says which slots count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

# A log-prob at or below this is an invalid slot (VeRL layout sentinel is -1e4; never store -inf).
SENTINEL_THRESHOLD = -1e3

SupportMode = Literal["union", "overwrite"]


def check_topk_ids(topk_ids: torch.Tensor, vocab_size: int) -> None:
    """Refuse mu's top-K ids at or beyond the logits' width (a negative id is a missing slot).

    The one range rule, applied where the ids enter: ``build_support`` (the chunked pass) and
    the VeRL worker once per step, on the host, before the batch reaches the loss. The fused
    kernels read such an id as an invalid slot and never index with it, so the check does not
    have to run inside their pass (it would read back to the host or add launches there).

    Raises:
        ValueError: naming the largest id and the width.
    """
    if topk_ids.numel() == 0:
        return
    largest = int(topk_ids.max())
    if largest >= vocab_size:
        raise ValueError(
            f"mu_topk_ids holds ids >= the logits width ({vocab_size}): the largest is {largest}"
        )


@dataclass
class Support:
    ids: torch.Tensor  # [N, K+1] vocabulary ids (invalid slots hold the sampled id)
    mu_logp: torch.Tensor  # [N, K+1] behaviour log-probs, -inf on invalid slots
    valid: torch.Tensor  # [N, K+1] bool
    size: torch.Tensor  # [N] number of valid slots, m = |S|


def build_support(
    sampled: torch.Tensor,
    mu_sampled_logp: torch.Tensor,
    topk_ids: torch.Tensor | None,
    topk_logp: torch.Tensor | None,
    vocab_size: int,
    *,
    mode: SupportMode = "union",
    dtype: torch.dtype = torch.float32,
) -> Support:
    """Flat inputs: ``sampled [N]``, ``mu_sampled_logp [N]``, ``topk_* [N, K]`` (or None: K = 0).

    ``mode="union"`` is the project's convention (``m = K+1`` when the sampled token is outside
    the top-K). ``mode="overwrite"`` reproduces public DPPO code that writes the sampled token over
    the K-th entry (``m = K``); it is a different divergence, offered only by explicit request.
    The sampled token's behaviour log-prob is always ``mu_sampled_logp`` (the one the ratio uses),
    also when the token appears in the top-K, so the ratio and the divergence see the same ``mu_k``.
    """
    n = sampled.shape[0]
    device = sampled.device
    mu_k = mu_sampled_logp.to(dtype)
    if topk_ids is None or topk_ids.shape[-1] == 0:
        ids = sampled[:, None].clone()
        return Support(
            ids,
            mu_k[:, None].clone(),
            torch.ones(n, 1, dtype=torch.bool, device=device),
            torch.ones(n, dtype=torch.long, device=device),
        )
    if topk_logp is None or topk_logp.shape != topk_ids.shape:
        raise ValueError("mu_topk_logprobs must be given with the same shape as mu_topk_ids")
    ids = topk_ids.long()
    check_topk_ids(ids, vocab_size)
    lp = topk_logp.to(dtype)
    valid = (ids >= 0) & torch.isfinite(lp) & (lp > SENTINEL_THRESHOLD)
    # De-duplicate: a slot repeating an id of an earlier valid slot is dropped.
    k = ids.shape[1]
    same = ids[:, :, None] == ids[:, None, :]
    earlier = torch.ones(k, k, dtype=torch.bool, device=device).tril(-1)
    valid &= ~(same & earlier & valid[:, None, :]).any(-1)
    is_sampled = valid & (ids == sampled[:, None])
    lp = torch.where(is_sampled, mu_k[:, None], lp)
    sampled_in_topk = is_sampled.any(-1)

    if mode == "overwrite":
        # Public DPPO variant: the sampled token replaces the last top-K entry when absent.
        last = torch.full((n, 1), k - 1, device=device)
        replace = ~sampled_in_topk
        ids = ids.scatter(
            1, last, torch.where(replace[:, None], sampled[:, None], ids.gather(1, last))
        )
        lp = lp.scatter(1, last, torch.where(replace[:, None], mu_k[:, None], lp.gather(1, last)))
        valid = valid.scatter(1, last, valid.gather(1, last) | replace[:, None])
        extra_valid = torch.zeros(n, 1, dtype=torch.bool, device=device)
    elif mode == "union":
        extra_valid = ~sampled_in_topk[:, None]
    else:
        raise ValueError(f"unknown support mode {mode!r}; expected 'union' or 'overwrite'")

    ids = torch.cat([ids, sampled[:, None]], dim=1)
    lp = torch.cat([lp, mu_k[:, None]], dim=1)
    valid = torch.cat([valid, extra_valid], dim=1)
    ids = torch.where(valid, ids, sampled[:, None])
    lp = torch.where(valid, lp, torch.full_like(lp, -torch.inf))
    return Support(ids, lp, valid, valid.sum(-1))
