"""Reading the behaviour policy's top-K out of a vLLM generation (pure: no vllm import).

Two readers of the same numbers: :func:`rows_from_arrays` takes the arrays vLLM's engine core
sends (the rollout's path, ``vllm_shims``); :func:`extract_decode_topk` reads vLLM's public
per-token ``Logprob`` dicts (the reference the tests and the rollout benchmark compare with).

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


def rows_from_arrays(
    token_ids: Sequence[int], steps: Sequence[tuple[np.ndarray, np.ndarray]], k: int
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`extract_decode_topk`'s ``(G, K+1)`` rows, from vLLM's own arrays instead of dicts.

    ``steps``: the ``(logprob_token_ids, logprobs)`` pairs vLLM's engine core sent for this
    request, one ``(n, K+1)`` pair per engine step (``LogprobsLists``): column 0 the sampled token,
    columns ``1..K`` the top-K in rank order (``torch.topk`` sorts). The same slots as the dict
    path: the top-K in slots ``0..K-1``, the sampled token in slot ``K``, unusable log-probs
    invalid; rows past the generated tokens are dropped, missing rows stay invalid.
    """
    g = len(token_ids)
    ids = np.full((g, k + 1), MISSING_ID, dtype=np.int32)
    lps = np.full((g, k + 1), SENTINEL, dtype=np.float32)
    ids[:, k] = np.asarray(token_ids, dtype=np.int64)
    if not steps or g == 0:
        return ids, lps
    step_ids = np.concatenate([s[0] for s in steps])[:g]
    step_lps = np.concatenate([s[1] for s in steps])[:g].astype(np.float32)
    if step_ids.shape[1] != k + 1:
        raise ValueError(f"vLLM sent {step_ids.shape[1] - 1} log-probs per token, expected {k}")
    n = step_ids.shape[0]
    ids[:n, k] = step_ids[:, 0]  # the engine's sampled id: layout.sequence_rows checks alignment
    usable = np.isfinite(step_lps) & (step_lps > SENTINEL_THRESHOLD)
    top = usable[:, 1:]
    ids[:n, :k] = np.where(top, step_ids[:, 1:], MISSING_ID)
    lps[:n, :k] = np.where(top, step_lps[:, 1:], SENTINEL)
    lps[:n, k] = np.where(usable[:, 0], step_lps[:, 0], SENTINEL)
    return ids, lps
