"""The per-sample top-K data contract between the rollout, the trainer's old-policy pass and the loss.

Each sample carries two tensors of shape ``(P+R, K+1)`` (``P`` prompt and ``R`` response tokens),
stored by verl as nested (jagged) tensors next to ``input_ids``, exactly like verl's own
``teacher_ids``:

- ``pdm_mu_topk_ids`` (int32) and ``pdm_mu_topk_logprobs`` (float32);
- row ``i`` is mu's distribution for predicting token ``i+1`` (so response token ``j`` lives in
  row ``P-1+j``), the same row convention as the trainer's packed logits, so the rows can be read
  next to the logits with no re-indexing;
- slots ``0..K-1``: mu's top-K by rank; slot ``K``: the sampled token ``y_t`` and its behaviour
  log-prob (always filled on response rows, also when ``y_t`` is among the top-K);
- invalid slots (prompt rows, the last row, missing entries, ``-inf`` under top-p/top-k) hold id
  ``-1`` and log-prob ``SENTINEL``. Never ``-inf``: ``0 * -inf`` is NaN.
"""

from __future__ import annotations

import numpy as np
import torch

from pdmask.trust_region import SENTINEL_THRESHOLD
from pdmask.trust_region.support import check_topk_ids

TOPK_IDS = "pdm_mu_topk_ids"
TOPK_LOGPROBS = "pdm_mu_topk_logprobs"
SENTINEL = -1e4
MISSING_ID = -1
assert SENTINEL <= SENTINEL_THRESHOLD  # the math API must read SENTINEL as an invalid slot

# Keys of the per-slot 1-D outputs of the old-policy pass (the engine hook only returns 1-D tensors).
OLD_ID_KEY = "pdm_old_id_{:02d}"
OLD_LP_KEY = "pdm_old_lp_{:02d}"


def invalid_rows(n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` rows of ``k+1`` invalid slots."""
    return (
        torch.full((n, k + 1), MISSING_ID, dtype=torch.int32),
        torch.full((n, k + 1), SENTINEL, dtype=torch.float32),
    )


def sequence_rows(
    prompt_len: int,
    response_ids: list[int],
    response_logprobs: list[float],
    generated_ids: np.ndarray,
    generated_logprobs: np.ndarray,
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Full-sequence ``(P+R, K+1)`` rows from the rollout's per-generated-token rows.

    ``generated_*`` are the ``(G, K+1)`` arrays of :func:`~.vllm_topk.extract_decode_topk`, one
    row per token the engine generated. Slot ``K`` is rebuilt from the final response (the
    authoritative ids and log-probs the trainer sees); a generated row whose sampled id disagrees
    with the response token at that position (re-tokenisation, truncation) keeps only slot ``K``,
    so the token degrades to the binary view instead of using someone else's top-K. Returns the
    rows and how many response tokens had no usable top-K.
    """
    if prompt_len < 1:
        raise ValueError(
            "the top-K rows need at least one prompt token (row P-1 is response token 0)"
        )
    if response_logprobs is None or len(response_logprobs) != len(response_ids):
        raise ValueError(
            "the rollout must return the sampled tokens' log-probs (calculate_log_probs=True)"
        )
    gen_ids = np.asarray(generated_ids)
    gen_lps = np.asarray(generated_logprobs)
    k = gen_ids.shape[1] - 1
    r = len(response_ids)
    ids, lps = invalid_rows(prompt_len + r, k)
    rows = slice(prompt_len - 1, prompt_len - 1 + r)
    n = min(r, gen_ids.shape[0])
    response = torch.as_tensor(response_ids, dtype=torch.int32)
    aligned = torch.as_tensor(gen_ids[:n, k], dtype=torch.int32) == response[:n]
    top_ids = torch.as_tensor(gen_ids[:n, :k], dtype=torch.int32)
    top_lps = torch.as_tensor(gen_lps[:n, :k], dtype=torch.float32)
    ids[rows][:n, :k] = torch.where(aligned[:, None], top_ids, MISSING_ID)
    lps[rows][:n, :k] = torch.where(aligned[:, None], top_lps, SENTINEL)
    ids[rows][:, k] = response
    lps[rows][:, k] = torch.as_tensor(response_logprobs, dtype=torch.float32)
    return ids, lps, int(r - n + (~aligned).sum())


def check_batch_ids(data, vocab_size: int) -> None:
    """The step's top-K ids (rollout or old-policy pass) against the trainer's vocabulary, once,
    before the batch reaches the loss: the fused GPU pass reads an id beyond the logits as an
    invalid slot and does not check (a check inside it would read back to the host).

    Raises:
        ValueError: naming the field, the largest id and the width.
    """
    if TOPK_IDS not in data:
        return
    ids = data[TOPK_IDS]
    try:
        check_topk_ids(ids.values() if ids.is_nested else ids, vocab_size)
    except ValueError as err:
        raise ValueError(f"{TOPK_IDS}: {err}") from None


def packed_rows(data, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The micro-batch's top-K rows packed like its ``input_ids``: ``(total_tokens, K+1)`` each.

    verl's synthetic padding samples (added to make batches divisible) copy a real sample's fields
    verbatim, so their top-K has the wrong length; they train on nothing (empty response mask) and
    get invalid rows here. A real sample with mismatching rows is a bug upstream and raises.
    """
    if TOPK_IDS not in data or TOPK_LOGPROBS not in data:
        raise KeyError(
            f"the batch has no {TOPK_IDS}/{TOPK_LOGPROBS}: the rollout must use the pdm_single_turn "
            "agent loop with rollout.custom.pdm_topk set (and the dataset must not set agent_name), "
            "or pdm_mu_source=recompute must run the old-policy pass"
        )
    input_ids, ids, lps = data["input_ids"], data[TOPK_IDS], data[TOPK_LOGPROBS]
    seq_lens = input_ids.offsets().diff()
    if torch.equal(ids.offsets().diff(), seq_lens) and ids.values().shape[-1] == k + 1:
        return ids.values().long(), lps.values().float()
    trains = [bool(row.sum() > 0) for row in data["response_mask"].unbind()]
    out_ids, out_lps = [], []
    for b, (sample_ids, sample_lps) in enumerate(zip(ids.unbind(), lps.unbind(), strict=True)):
        n = int(seq_lens[b])
        if sample_ids.shape == (n, k + 1):
            out_ids.append(sample_ids.long())
            out_lps.append(sample_lps.float())
        elif trains[b]:
            raise ValueError(
                f"sample {b}: top-K rows {tuple(sample_ids.shape)} do not match its {n} tokens x {k + 1} slots"
            )
        else:
            bad_ids, bad_lps = invalid_rows(n, k)
            out_ids.append(bad_ids.long().to(sample_ids.device))
            out_lps.append(bad_lps.to(sample_lps.device))
    return torch.cat(out_ids), torch.cat(out_lps)


def stack_old_slots(model_output: dict, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Turn the old-policy pass's ``2(K+1)`` per-slot nested outputs into the two contract fields.

    Pops the per-slot keys from ``model_output``; returns nested ``(B, j, K+1)`` int32/float32.
    """
    id_slots = [model_output.pop(OLD_ID_KEY.format(i)) for i in range(k + 1)]
    lp_slots = [model_output.pop(OLD_LP_KEY.format(i)) for i in range(k + 1)]
    offsets = id_slots[0].offsets()
    ids = torch.stack([s.values() for s in id_slots], dim=-1).to(torch.int32)
    lps = torch.stack([s.values() for s in lp_slots], dim=-1).to(torch.float32)
    return (
        torch.nested.nested_tensor_from_jagged(ids, offsets),
        torch.nested.nested_tensor_from_jagged(lps, offsets),
    )
