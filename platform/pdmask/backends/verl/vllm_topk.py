"""Reading the behaviour policy's top-K out of a vLLM generation (pure: no vllm import).

With ``SamplingParams(logprobs=K)`` vLLM returns, for each generated position, a mapping
``token_id -> Logprob(logprob, rank, decoded_token)`` with K entries, plus one more for the sampled
token (with its true rank) when it is not among the top-K. Under top-p/top-k truncation some of
the returned log-probs are ``-inf``; near the end of the vocabulary there can be fewer entries.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pdmask.backends.verl.layout import MISSING_ID, SENTINEL
from pdmask.trust_region import SENTINEL_THRESHOLD


def _usable(logprob: float) -> bool:
    return math.isfinite(logprob) and logprob > SENTINEL_THRESHOLD


def extract_decode_topk(
    token_ids: Sequence[int], logprobs: Sequence[Mapping[int, Any]] | None, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(G, K+1)`` int32 ids and float32 log-probs, one row per generated token.

    Slots ``0..K-1``: the entries of rank ``1..K`` in rank order (entries without a rank are
    ordered by log-prob); slot ``K``: the sampled token ``token_ids[j]`` and its log-prob. Missing,
    ``-inf`` and out-of-top-K entries are invalid slots (id ``-1``, log-prob ``SENTINEL``).
    """
    g = len(token_ids)
    ids = np.full((g, k + 1), MISSING_ID, dtype=np.int32)
    lps = np.full((g, k + 1), SENTINEL, dtype=np.float32)
    ids[:, k] = np.asarray(token_ids, dtype=np.int64)
    for j, position in enumerate((logprobs or [])[:g]):
        if not position:
            continue
        entries = sorted(
            position.items(),
            key=lambda item: (
                item[1].rank if getattr(item[1], "rank", None) is not None else math.inf,
                -item[1].logprob,
            ),
        )
        for slot, (token_id, entry) in enumerate(entries[:k]):
            rank = getattr(entry, "rank", None)
            if rank is not None and rank > k:
                break  # the sampled token appended outside the top-K, or anything past it
            if _usable(entry.logprob):
                ids[j, slot] = token_id
                lps[j, slot] = entry.logprob
        entry = position.get(token_ids[j])
        if entry is not None and _usable(entry.logprob):
            lps[j, k] = entry.logprob
    return ids, lps
