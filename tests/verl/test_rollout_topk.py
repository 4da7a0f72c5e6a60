"""The behaviour top-K from vLLM to the trainer: extraction, server shims, agent-loop layout."""

from __future__ import annotations

import math
from collections import namedtuple
from dataclasses import dataclass
from types import SimpleNamespace
from typing import NamedTuple

import numpy as np
import pytest
import torch

from pdmask.backends.verl import vllm_shims
from pdmask.backends.verl.layout import (
    MISSING_ID,
    SENTINEL,
    TOPK_IDS,
    TOPK_LOGPROBS,
    check_batch_ids,
    packed_rows,
    sequence_rows,
)
from pdmask.backends.verl.vllm_topk import extract_decode_topk, rows_from_arrays
from pdmask.errors import BackendUnavailable


# vLLM's Logprob as it arrives in RequestOutput.outputs[0].logprobs (one dict per generated token).
@dataclass(frozen=True)
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


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


# The same first three positions as vLLM's engine core sends them (LogprobsLists): column 0 the
# sampled token, columns 1..K the top-K by rank; one (n, K+1) pair per engine step.
STEP_IDS = np.array([[11, 11, 12, 13], [42, 21, 22, 23], [7, 7, 8, 9]], dtype=np.int32)
STEP_LPS = np.array(
    [[-0.2, -0.2, -2.0, -3.0], [-5.5, -0.4, -1.5, -2.5], [-0.01, -0.01, -np.inf, -np.inf]],
    dtype=np.float32,
)


class _Lists(NamedTuple):  # vLLM's LogprobsLists fields, read by name
    logprob_token_ids: np.ndarray
    logprobs: np.ndarray
    sampled_token_ranks: np.ndarray
    cu_num_generated_tokens: list | None = None


def test_rows_from_arrays_equal_the_rows_read_from_vllms_dicts():
    steps = [(STEP_IDS[:2], STEP_LPS[:2]), (STEP_IDS[2:], STEP_LPS[2:])]
    ids, lps = rows_from_arrays(TOKENS[:3], steps, K)
    ref_ids, ref_lps = extract_decode_topk(TOKENS[:3], LOGPROBS[:3], K)
    assert ids.dtype == np.int32 and lps.dtype == np.float32
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_array_equal(lps, ref_lps)
    # a generation longer than the rows: the missing row keeps only the sampled id, invalid
    ids, lps = rows_from_arrays(TOKENS, steps, K)
    assert ids[3].tolist() == [MISSING_ID] * K + [5] and (lps[3] == SENTINEL).all()
    assert rows_from_arrays([3], [], K)[0].tolist() == [[MISSING_ID] * K + [3]]
    with pytest.raises(ValueError, match="expected 2"):
        rows_from_arrays(TOKENS[:3], steps, 2)


def _front_end():
    """vLLM's LogprobsProcessor as far as the patches read it: a dict per position of every
    column it is handed (``append_logprobs_for_next_position``)."""

    class Processor:
        def __init__(self, num_logprobs):
            self.num_logprobs, self.logprobs, self.seen = num_logprobs, [], []

        @classmethod
        def from_new_request(cls, tokenizer, request):
            return cls(request.sampling_params.logprobs)

        def _update_sample_logprobs(self, logprobs_lists):
            self.seen.append(logprobs_lists.logprob_token_ids.shape[1])
            for ids, lps in zip(
                logprobs_lists.logprob_token_ids, logprobs_lists.logprobs, strict=True
            ):
                self.logprobs.append(
                    {
                        int(t): Logprob(float(v), r, "")
                        for r, (t, v) in enumerate(zip(ids, lps, strict=True))
                    }
                )

    class Params:
        extra_args: dict | None

    return Processor, Params


def test_front_end_keeps_a_marked_requests_arrays_and_builds_only_the_sampled_dict():
    processor_cls, params_cls = _front_end()
    vllm_shims.install_front_end(processor_cls, _Lists, params_cls, Logprob)
    vllm_shims.install_front_end(processor_cls, _Lists, params_cls, Logprob)  # idempotent

    def request(extra_args):
        return SimpleNamespace(sampling_params=SimpleNamespace(logprobs=K, extra_args=extra_args))

    def run(processor):
        processor.cumulative_logprob = 0.0
        for rows in (slice(0, 2), slice(2, 3)):
            ranks = np.arange(rows.start, rows.stop) + 1
            processor._update_sample_logprobs(_Lists(STEP_IDS[rows], STEP_LPS[rows], ranks))
        return processor

    plain = run(processor_cls.from_new_request(None, request(None)))
    assert plain.seen == [K + 1, K + 1] and not isinstance(plain.logprobs, vllm_shims.TopKRows)
    marked = run(processor_cls.from_new_request(None, request({vllm_shims.ROWS_ARG: K})))
    assert marked.seen == [], "vLLM's own update (a dict and a text per column) never ran"
    # what verl reads: the sampled token's log-prob per position, its rank, no text
    assert marked.logprobs == [
        {11: Logprob(float(np.float32(-0.2)), 1, None)},
        {42: Logprob(-5.5, 2, None)},
        {7: Logprob(float(np.float32(-0.01)), 3, None)},
    ]
    assert marked.cumulative_logprob == sum(float(v) for v in STEP_LPS[:, 0])
    # through verl's extract_prompt_logprobs: the rows from the arrays
    fake_module = SimpleNamespace(
        SamplingParams=lambda **kw: kw, extract_prompt_logprobs=lambda output, n, result: None
    )
    vllm_shims.install(fake_module)
    output = SimpleNamespace(
        outputs=[SimpleNamespace(token_ids=TOKENS[:3], logprobs=marked.logprobs)]
    )
    token = vllm_shims.requested_topk.set(K)
    try:
        assert fake_module.SamplingParams(logprobs=0)["extra_args"] == {vllm_shims.ROWS_ARG: K}
        from_dicts = vllm_shims.topk_from_dicts.set(True)
        assert "extra_args" not in fake_module.SamplingParams(logprobs=0)  # the benchmark's before
        vllm_shims.topk_from_dicts.reset(from_dicts)
        extra = {}
        fake_module.extract_prompt_logprobs(output, None, extra)
    finally:
        vllm_shims.requested_topk.reset(token)
    np.testing.assert_array_equal(
        extra[vllm_shims.TOPK_IDS_FIELD], extract_decode_topk(TOKENS[:3], LOGPROBS[:3], K)[0]
    )


def test_front_end_refuses_to_start_when_vllms_internals_moved():
    processor_cls, params_cls = _front_end()

    def update(self, lists, extra):  # a new signature: the arrays may no longer be what we read
        pass

    processor_cls._update_sample_logprobs = update
    with pytest.raises(BackendUnavailable) as err:
        vllm_shims.install_front_end(processor_cls, namedtuple("L", "ids lps"), object, object)
    message = str(err.value)
    assert "_update_sample_logprobs(self, logprobs_lists)" in message
    assert "LogprobsLists(" in message and "SamplingParams.extra_args" in message
    assert "Logprob(logprob, rank, decoded_token)" in message


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


def test_an_id_beyond_the_vocabulary_is_refused_before_the_loss():
    """The worker's check of a step's batch (``update_actor``), on verl's jagged fields: the
    fused GPU pass would read such an id as a missing slot and say nothing."""
    pytest.importorskip("verl")
    from verl.utils import tensordict_utils as tu

    ids, lps, _ = sequence_rows(
        2, [11, 42], [-0.2, -5.5], *extract_decode_topk(TOKENS[:2], LOGPROBS[:2], K)
    )
    largest = int(ids.max())

    def batch(sample_ids):
        fields = {TOPK_IDS: sample_ids, TOPK_LOGPROBS: [lps, lps]}
        return tu.get_tensordict(
            {
                key: torch.nested.as_nested_tensor(v, layout=torch.jagged)
                for key, v in fields.items()
            }
        )

    check_batch_ids(batch([ids, ids]), largest + 1)  # the largest id inside the width passes
    check_batch_ids(tu.get_tensordict({"input_ids": torch.zeros(2, 3)}), 1)  # no top-K: nothing
    beyond = ids.clone()
    beyond[3, 0] = largest + 1
    with pytest.raises(ValueError) as err:
        check_batch_ids(batch([ids, beyond]), largest + 1)
    assert str(err.value) == (
        f"{TOPK_IDS}: mu_topk_ids holds ids >= the logits width ({largest + 1}): "
        f"the largest is {largest + 1}"
    )


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
