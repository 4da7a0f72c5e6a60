"""The logits hook inside verl's real FSDP engine code yields the math API's per-token statistics."""

from __future__ import annotations

import pytest

pytest.importorskip("verl")
pytestmark = pytest.mark.verl

import torch  # noqa: E402
from verl.workers.utils.padding import no_padding_2_padding  # noqa: E402

from pdmask.backends.verl.layout import OLD_ID_KEY, OLD_LP_KEY, stack_old_slots  # noqa: E402
from pdmask.backends.verl.processor import (  # noqa: E402
    PHASE_KEY,
    STAT_KEY,
    StatsSettings,
    old_policy_topk_outputs,
    statistics_outputs,
    stats_from_outputs,
)
from pdmask.trust_region import compute_token_stats  # noqa: E402

from .batches import engine_forward, make_batch, micro_batch, response_frame  # noqa: E402

ALL = [0, 1, 2, 3]


@pytest.fixture(scope="module")
def batch():
    return make_batch()


@pytest.mark.parametrize("method", ["pdm-agg", "dppo-binary-kl"])
def test_hook_statistics_equal_math_api(batch, method):
    data = micro_batch(batch, ALL)
    settings = StatsSettings(method=method, topk=batch.k, chunk_size=7)
    hook = lambda student_logits, data: statistics_outputs(student_logits, data, settings)  # noqa: E731
    model_output = engine_forward(batch.leaf, data, hook)
    stat_keys = [k for k in model_output if k.startswith(STAT_KEY.format(""))]
    assert model_output[stat_keys[0]].is_nested  # came back through the engine's nesting
    stats = stats_from_outputs({k: no_padding_2_padding(model_output[k], data) for k in stat_keys})

    frame = response_frame(batch, ALL)
    ref = compute_token_stats(
        frame.logits.detach(), frame.sampled, frame.ids, frame.lps, frame.mu_k
    )
    valid = frame.valid
    assert stats.vocab_size == ref.vocab_size == batch.vocab
    for name, expected in ref.tensors().items():
        got = getattr(stats, name)
        torch.testing.assert_close(
            got[valid].to(expected.dtype), expected[valid].detach(), rtol=1e-5, atol=1e-6, msg=name
        )
    # the statistics are not trivial: mu and pi differ and some tokens have y outside the top-K
    assert (ref.kl_topk[valid] > 1e-3).all()
    assert (ref.support_size[valid] == batch.k + 1).any() and (
        ref.support_size[valid] < batch.k + 1
    ).any()
    # verl's own log-probs, computed next to the hook, agree with the math API's
    log_probs = no_padding_2_padding(model_output["log_probs"], data)
    torch.testing.assert_close(log_probs[valid], ref.logp[valid].detach(), rtol=1e-5, atol=1e-5)


def test_old_policy_pass_yields_pi_topk_in_the_contract_layout(batch):
    data = micro_batch(batch, ALL, **{PHASE_KEY: "old"})

    def hook(student_logits, data):
        return old_policy_topk_outputs(student_logits, data, batch.k, chunk_size=5)

    model_output = engine_forward(batch.leaf.detach(), data, hook)
    assert OLD_ID_KEY.format(batch.k) in model_output and OLD_LP_KEY.format(0) in model_output
    ids, lps = stack_old_slots(model_output, batch.k)
    assert not any(k.startswith("pdm_old_") for k in model_output)
    full_logp = torch.log_softmax(batch.leaf.detach(), -1)
    top_lp, top_id = full_logp.topk(batch.k, -1)
    torch.testing.assert_close(lps.values()[:, : batch.k], top_lp)
    assert torch.equal(ids.values()[:, : batch.k].long(), top_id)
    # slot K: the sampled (next) token and pi_old's log-prob of it, as verl's log_probs has it
    torch.testing.assert_close(lps.values()[:, batch.k], model_output["log_probs"].values())
    assert torch.equal(ids.offsets(), data["input_ids"].offsets())
