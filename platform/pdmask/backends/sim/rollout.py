"""Rollout: sample responses from the behaviour copy and record what vLLM would hand the trainer.

Per response token the trainer gets the sampled id, its behaviour log-prob and the behaviour's
top-K ids and log-probs (``logprobs=20`` in vLLM), nothing more. Because the behaviour distribution
is fully known here, the rollout can also keep it whole (``keep_full=True``) for diagnostics that
compare the top-K estimators against the exact full-vocabulary quantities; the trainer's loss never
reads it.

Sampling is plain temperature-1 sampling (inverse CDF) with an explicit generator (deterministic).
Decoding stops at ``<eos>``; later positions are padding and invalid. Responses vary in length
(the task's attempts): a finished one leaves the decoding batch, so a step costs only the
responses still running.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from pdmask.backends.sim.model import TinyDecoder
from pdmask.backends.sim.task import EOS, PAD


@dataclass
class Generation:
    """Sampled responses and the behaviour's view of each response token."""

    prompts: torch.Tensor  # [N, P] long
    responses: torch.Tensor  # [N, R] long, PAD after <eos>
    valid: torch.Tensor  # [N, R] bool: response tokens up to and including <eos>
    mu_logp: torch.Tensor  # [N, R] float32: log mu of the sampled token (0 on padding)
    mu_topk_ids: torch.Tensor  # [N, R, K] long (-1 on padding)
    mu_topk_logprobs: torch.Tensor  # [N, R, K] float32 (-inf on padding)
    mu_full_logprobs: torch.Tensor | None  # [N, R, V] float32 when kept

    @property
    def sequences(self) -> torch.Tensor:
        return torch.cat([self.prompts, self.responses], dim=1)


@torch.no_grad()
def generate(
    model: TinyDecoder,
    prompts: torch.Tensor,
    max_new_tokens: int,
    generator: torch.Generator,
    *,
    top_k: int = 20,
    keep_full: bool = False,
) -> Generation:
    """Sample up to ``max_new_tokens`` per prompt at temperature 1 (prompts share one length).

    A response that emitted ``<eos>`` leaves the batch (its rows of the key/value cache too), so a
    step costs what the responses still running cost: the long tail of response lengths is paid
    for by the long responses alone. The tensors are as wide as the longest response; a finished
    response's later positions are padding (``<pad>``, invalid, ``mu_logp`` 0, top-K ids -1 and
    log-probs -inf, a uniform full distribution)."""
    n, vocab = prompts.shape[0], model.lm_head.weight.shape[0]
    tokens = torch.full((n, max_new_tokens), PAD, dtype=torch.long)
    valid = torch.zeros(n, max_new_tokens, dtype=torch.bool)
    sampled_lp = torch.zeros(n, max_new_tokens)
    topk_ids = torch.full((n, max_new_tokens, top_k), -1, dtype=torch.long)
    topk_lp = torch.full((n, max_new_tokens, top_k), -torch.inf)
    full = torch.full((n, max_new_tokens, vocab), -math.log(vocab)) if keep_full else None
    logits, cache = model(prompts, return_cache=True, logits_from=prompts.shape[1] - 1)
    rows = torch.arange(n)  # the responses still running
    steps = 0
    for step in range(max_new_tokens):
        logp = torch.log_softmax(logits[:, -1].float(), dim=-1)
        nxt = _sample(logp, generator)
        tokens[rows, step] = nxt
        valid[rows, step] = True
        sampled_lp[rows, step] = logp.gather(1, nxt[:, None]).squeeze(1)
        if top_k:
            values, ids = logp.topk(top_k, dim=-1)
            topk_ids[rows, step] = ids
            topk_lp[rows, step] = values
        if keep_full:
            full[rows, step] = logp
        steps = step + 1
        running = nxt != EOS
        if not running.any() or step == max_new_tokens - 1:
            break
        if not running.all():
            rows, nxt = rows[running], nxt[running]
            cache = [(k[running], v[running]) for k, v in cache]
        logits, cache = model(nxt[:, None], cache=cache, return_cache=True)
    return Generation(
        prompts=prompts,
        responses=tokens[:, :steps],
        valid=valid[:, :steps],
        mu_logp=sampled_lp[:, :steps],
        mu_topk_ids=topk_ids[:, :steps],
        mu_topk_logprobs=topk_lp[:, :steps],
        mu_full_logprobs=None if full is None else full[:, :steps],
    )


def _sample(logp: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One token per row from ``exp(logp)`` by inverse-CDF sampling (10x cheaper than multinomial).

    ``right=True`` returns the first index whose cumulative mass exceeds the uniform draw, so a
    zero-probability token is never chosen.
    """
    cdf = logp.exp().cumsum(-1)
    target = torch.rand(logp.shape[0], 1, generator=generator) * cdf[:, -1:]
    return torch.searchsorted(cdf, target, right=True).squeeze(1).clamp_max(logp.shape[-1] - 1)


@torch.no_grad()
def sample_responses(
    model: TinyDecoder, prompts: torch.Tensor, max_new_tokens: int, generator: torch.Generator
) -> torch.Tensor:
    """Responses only (evaluation): no per-token view is recorded."""
    return generate(model, prompts, max_new_tokens, generator, top_k=0).responses
