"""The behaviour top-K from vLLM to the trainer: extraction, server shims, agent-loop layout."""

from __future__ import annotations

import math
from collections import namedtuple
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from pdmask.backends.verl import vllm_shims
from pdmask.backends.verl.layout import (
    MISSING_ID,
    SENTINEL,
    TOPK_IDS,
    TOPK_LOGPROBS,
    packed_rows,
    sequence_rows,
)
from pdmask.backends.verl.vllm_topk import extract_decode_topk

# vLLM's Logprob as it arrives in RequestOutput.outputs[0].logprobs (one dict per generated token).
Logprob = namedtuple("Logprob", "logprob rank decoded_token")
K = 3
# Recorded shape of a K=3 generation of 4 tokens [11, 42, 7, 5]:
TOKENS = [11, 42, 7, 5]
LOGPROBS = [
    # y=11 is rank 1: exactly K entries
    {11: Logprob(-0.2, 1, "a"), 12: Logprob(-2.0, 2, "b"), 13: Logprob(-3.0, 3, "c")},
    # y=42 outside the top-K: vLLM appends it with its true rank (K+1 entries), dict order arbitrary
    {
        42: Logprob(-5.5, 17, "x"),
        21: Logprob(-0.4, 1, "d"),
        23: Logprob(-2.5, 3, "f"),
        22: Logprob(-1.5, 2, "e"),
    },
    # top-p truncation: entries outside the nucleus come back as -inf
    {7: Logprob(-0.01, 1, "g"), 8: Logprob(-math.inf, 2, "h"), 9: Logprob(-math.inf, 3, "i")},
    # fewer entries than K (tiny vocabulary tail)
    {5: Logprob(-0.7, 1, "j"), 6: Logprob(-0.9, 2, "k")},
]


def test_extract_decode_topk_on_recorded_vllm_output():
    ids, lps = extract_decode_topk(TOKENS, LOGPROBS, K)
    assert ids.dtype == np.int32 and lps.dtype == np.float32 and ids.shape == (4, K + 1)
    assert ids.tolist() == [
        [11, 12, 13, 11],
        [21, 22, 23, 42],  # ranked, and the appended sampled token only in slot K
        [7, MISSING_ID, MISSING_ID, 7],  # -inf slots are invalid, never -inf
        [5, 6, MISSING_ID, 5],
    ]
    np.testing.assert_allclose(lps[1], [-0.4, -1.5, -2.5, -5.5])
    np.testing.assert_allclose(lps[2], [-0.01, SENTINEL, SENTINEL, -0.01])
    np.testing.assert_allclose(lps[3], [-0.7, -0.9, SENTINEL, -0.7])
    assert np.isfinite(lps).all()


def test_extract_decode_topk_missing_positions_and_ranks():
    # logprobs shorter than the generation (aborted stream) and entries without a rank
    ids, lps = extract_decode_topk(
        [3, 4], [{3: Logprob(-1.0, None, ""), 9: Logprob(-0.5, None, "")}], K
    )
    assert ids[0].tolist() == [9, 3, MISSING_ID, 3]  # unranked entries ordered by log-prob
    assert ids[1].tolist() == [MISSING_ID] * K + [4] and (lps[1] == SENTINEL).all()
    ids, lps = extract_decode_topk([3], None, K)
    assert ids.tolist() == [[MISSING_ID] * K + [3]]


def test_server_shims_ask_vllm_for_k_and_store_the_topk_only_in_marked_requests():
    calls = {}
    fake_module = SimpleNamespace(
        SamplingParams=lambda **kw: kw,
        extract_prompt_logprobs=lambda output, n, result: calls.setdefault("original", n),
    )
    vllm_shims.install(fake_module)
    vllm_shims.install(fake_module)  # idempotent
    output = SimpleNamespace(outputs=[SimpleNamespace(token_ids=TOKENS, logprobs=LOGPROBS)])

    assert fake_module.SamplingParams(max_tokens=4, logprobs=0)["logprobs"] == 0  # unmarked: verl's
    unmarked = {}
    fake_module.extract_prompt_logprobs(output, None, unmarked)
    assert unmarked == {}

    token = vllm_shims.requested_topk.set(K)
    try:
        assert fake_module.SamplingParams(max_tokens=4, logprobs=0)["logprobs"] == K
        assert fake_module.SamplingParams(max_tokens=4, logprobs=None)["logprobs"] is None
        marked = {"global_steps": 3}
        fake_module.extract_prompt_logprobs(output, None, marked)
    finally:
        vllm_shims.requested_topk.reset(token)
    assert calls["original"] is None  # verl's own prompt-logprob extraction still ran
    assert marked[vllm_shims.TOPK_IDS_FIELD].tolist()[1] == [21, 22, 23, 42]
    assert marked["global_steps"] == 3


def test_sequence_rows_put_response_tokens_at_row_p_minus_1_plus_j():
    gen_ids, gen_lps = extract_decode_topk(TOKENS, LOGPROBS, K)
    response = [11, 42, 99, 5]  # token 2 was re-tokenised after generation: no longer the sampled 7
    response_lps = [-0.2, -5.5, -1.0, -0.7]
    ids, lps, unusable = sequence_rows(2, response, response_lps, gen_ids, gen_lps)
    assert ids.shape == (6, K + 1) and ids.dtype == torch.int32 and lps.dtype == torch.float32
    assert (ids[0] == MISSING_ID).all() and (lps[-1] == SENTINEL).all()  # prompt row, last row
    assert ids[1].tolist() == [11, 12, 13, 11] and ids[2].tolist() == [21, 22, 23, 42]
    assert ids[3].tolist() == [MISSING_ID] * K + [99]  # misaligned: only the sampled slot
    assert lps[3, K].item() == pytest.approx(-1.0) and unusable == 1
    # a response longer than what the engine reported keeps slot K from the response
    ids, _, unusable = sequence_rows(1, response + [8], response_lps + [-0.1], gen_ids, gen_lps)
    assert ids[4].tolist() == [MISSING_ID] * K + [8] and unusable == 2


def test_packed_rows_fix_verl_padding_samples_and_refuse_real_misalignment():
    pytest.importorskip("verl")
    from verl.utils import tensordict_utils as tu

    def nested(ts):
        return torch.nested.as_nested_tensor(ts, layout=torch.jagged)

    good_ids, good_lps, _ = sequence_rows(
        2, [11, 42], [-0.2, -5.5], *extract_decode_topk(TOKENS[:2], LOGPROBS[:2], K)
    )
    # verl's synthetic padding sample: 127 prompt + 1 response token, fields copied from sample 0
    td = tu.get_tensordict(
        {
            "input_ids": nested(
                [torch.zeros(4, dtype=torch.long), torch.zeros(128, dtype=torch.long)]
            ),
            "response_mask": nested(
                [torch.ones(2, dtype=torch.long), torch.zeros(1, dtype=torch.long)]
            ),
            TOPK_IDS: nested([good_ids, good_ids]),
            TOPK_LOGPROBS: nested([good_lps, good_lps]),
        }
    )
    ids, lps = packed_rows(td, K)
    assert ids.shape == (132, K + 1) and torch.equal(ids[:4], good_ids.long())
    assert (ids[4:] == MISSING_ID).all() and (lps[4:] == SENTINEL).all()
    td["response_mask"] = nested([torch.ones(2, dtype=torch.long), torch.ones(1, dtype=torch.long)])
    with pytest.raises(ValueError, match="sample 1"):
        packed_rows(td, K)


def test_agent_loop_output_carries_the_topk_as_sample_fields():
    pytest.importorskip("verl")
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput

    from pdmask.backends.verl.agent_loop import with_topk

    gen_ids, gen_lps = extract_decode_topk(TOKENS, LOGPROBS, K)
    out = AgentLoopOutput(
        prompt_ids=[1, 2, 3],
        response_ids=TOKENS,
        response_mask=[1, 1, 1, 1],
        response_logprobs=[-0.2, -5.5, -0.01, -0.7],
        num_turns=2,
        metrics=AgentLoopMetrics(),
        extra_fields={
            vllm_shims.TOPK_IDS_FIELD: gen_ids,
            vllm_shims.TOPK_LOGPROBS_FIELD: gen_lps,
            "turn_scores": [],
        },
    )
    sample = with_topk(out).as_dict()
    assert sample[TOPK_IDS].shape == (7, K + 1) and sample[TOPK_LOGPROBS].shape == (7, K + 1)
    assert sample[TOPK_IDS][3].tolist() == [21, 22, 23, 42]  # response token 1 at row P-1+1
    assert (
        TOPK_IDS not in sample["extra_fields"]
        and vllm_shims.TOPK_IDS_FIELD not in sample["extra_fields"]
    )
    assert sample["rollout_log_probs"].tolist() == pytest.approx(out.response_logprobs)
    # without a top-K from the server the loop's output is verl's, untouched
    plain = AgentLoopOutput(
        prompt_ids=[1], response_ids=[2], response_mask=[1], metrics=AgentLoopMetrics()
    )
    assert with_topk(plain) is plain
