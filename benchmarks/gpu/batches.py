"""Synthetic packed micro-batches shaped like the ones verl 0.9.1's FSDP actor hands its engine.

Sequences are packed without padding (nested jagged tensors). Each response token is drawn from a
behaviour policy mu given only by its top-K in pdmask's full-sequence layout (``layout.py``: row
``i`` of a sample predicts token ``i+1``; slot ``K`` holds the sampled token): mu's log-probs are
a sorted random log-softmax, its top-K ids K distinct ids, and the token is one of them (or, one
time in ten, a token outside them). Advantages are +1 / -1 by sequence, so every token trains.
"""

from __future__ import annotations

import torch
from verl.utils import tensordict_utils as tu

from pdmask.backends.verl.layout import MISSING_ID, SENTINEL, TOPK_IDS, TOPK_LOGPROBS


def _nested(parts: list[torch.Tensor]) -> torch.Tensor:
    return torch.nested.as_nested_tensor(parts, layout=torch.jagged)


def _sample(vocab: int, k: int, prompt: int, response: int, g: torch.Generator):
    """One sequence's ids and mu fields: (ids [S], topk ids [S, K+1], topk lps [S, K+1])."""
    s = prompt + response
    mu = torch.log_softmax(torch.randn(response, k + 1, generator=g) * 2, -1).sort(-1, True).values
    first = torch.randint(0, vocab - k, (response, 1), generator=g)
    top_ids = first + torch.arange(k)  # K distinct ids per row
    slot = torch.multinomial(mu[:, :k].exp(), 1, generator=g).squeeze(1)
    outside = torch.rand(response, generator=g) < 0.1
    token = torch.where(
        outside, (first.squeeze(1) + k) % vocab, top_ids.gather(1, slot[:, None]).squeeze(1)
    )
    token_lp = torch.where(outside, mu[:, k], mu.gather(1, slot[:, None]).squeeze(1))
    ids = torch.cat([torch.randint(0, vocab, (prompt,), generator=g), token])
    layout_ids = torch.full((s, k + 1), MISSING_ID, dtype=torch.int32)
    layout_lps = torch.full((s, k + 1), SENTINEL, dtype=torch.float32)
    rows = torch.arange(prompt - 1, s - 1)
    layout_ids[rows, :k] = top_ids.int()
    layout_lps[rows, :k] = mu[:, :k]
    layout_ids[rows, k] = token.int()
    layout_lps[rows, k] = token_lp
    return ids, layout_ids, layout_lps, token_lp


def packed_batch(
    vocab: int, k: int, sequences: int, prompt: int, response: int, micro_batch: int, seed: int = 0
):
    """``sequences`` packed samples as verl's actor update receives them (one mini-batch)."""
    g = torch.Generator().manual_seed(seed)
    parts = [_sample(vocab, k, prompt, response, g) for _ in range(sequences)]
    ones = [torch.ones(response, dtype=torch.int64) for _ in parts]
    return tu.get_tensordict(
        tensor_dict={
            "input_ids": _nested([p[0] for p in parts]),
            "position_ids": _nested([torch.arange(prompt + response) for _ in parts]),
            "prompts": _nested([p[0][:prompt] for p in parts]),
            "responses": _nested([p[0][prompt:] for p in parts]),
            "response_mask": _nested(ones),
            "loss_mask": _nested(ones),
            "old_log_probs": _nested([p[3] for p in parts]),
            "advantages": _nested(
                [torch.full((response,), 1.0 if i % 2 == 0 else -1.0) for i in range(sequences)]
            ),
            TOPK_IDS: _nested([p[1] for p in parts]),
            TOPK_LOGPROBS: _nested([p[2] for p in parts]),
        },
        non_tensor_dict={
            "temperature": 1.0,
            "use_remove_padding": True,
            "distillation_use_topk": True,
            "calculate_entropy": False,
            "pad_mode": "no_padding",
            "use_dynamic_bsz": False,
            "micro_batch_size_per_gpu": micro_batch,
            "global_batch_size": sequences,
        },
    )
