"""Rollouts from the behaviour copy: the top-K view the trainer gets, and the mismatch settings."""

from __future__ import annotations

import pytest
import torch

from pdmask.backends.sim import SimTrialConfig, build_analysis_setup
from pdmask.backends.sim.task import EOS


@pytest.fixture(scope="module")
def setups(learned_base_config) -> dict:
    """One analysis setup (the real tiny-4b base model + a rollout batch) per precision."""
    return {
        precision: build_analysis_setup(learned_base_config(precision=precision))
        for precision in ("bf16", "fp8-rollout", "fp8-e2e")
    }


def test_topk_view_is_a_consistent_truncation_of_the_behaviour_distribution(setups):
    gen = setups["bf16"].batch.generation
    valid = gen.valid
    full = gen.mu_full_logprobs
    assert full.shape[-1] >= 1000 and gen.mu_topk_ids.shape[-1] == 20
    # The sampled token's log-prob and the top-20 entries are read off the full distribution.
    sampled = full.gather(-1, gen.responses.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(gen.mu_logp[valid], sampled[valid])
    topk = full.gather(-1, gen.mu_topk_ids.clamp_min(0))
    assert torch.allclose(gen.mu_topk_logprobs[valid], topk[valid])
    assert torch.equal(gen.mu_topk_ids[valid], full.topk(20, -1).indices[valid])
    # A real truncation: the top-20 leave noticeable mass out at many positions.
    mass = gen.mu_topk_logprobs.exp().sum(-1)[valid]
    assert float((mass < 0.95).float().mean()) > 0.3


def test_padding_after_eos_is_invalid_and_marked_missing(setups):
    gen = setups["bf16"].batch.generation
    ended = (gen.responses == EOS) & gen.valid
    after = ended.cumsum(1).roll(1, dims=1)
    after[:, 0] = 0
    assert not (gen.valid & (after > 0)).any()
    pad = ~gen.valid
    assert (gen.mu_topk_ids[pad] == -1).all()
    assert torch.isinf(gen.mu_topk_logprobs[pad]).all()


def test_mismatch_is_positive_and_larger_in_fp8_than_bf16(setups):
    kl = {}
    for precision, setup in setups.items():
        with torch.no_grad():
            logits = setup.logits()
        kl[precision] = float(setup.stats(logits).kl_topk[setup.valid].mean())
        exact = float(setup.exact(logits).kl[setup.valid].mean())
        assert exact >= kl[precision] - 1e-7  # the top-K KL is a lower bound of the full KL
    assert kl["bf16"] > 0
    assert kl["fp8-rollout"] > 5 * kl["bf16"]  # measured: about 30x
    assert kl["fp8-e2e"] > 5 * kl["bf16"]


def test_rollouts_are_deterministic_given_the_seed(sim_cache):
    def batch(seed):
        cfg = SimTrialConfig(
            stand_in="tiny-4b",
            precision="bf16",
            profile="smoke",
            seed=seed,
            delta=0.15,
            cache_dir=sim_cache,
        )
        return build_analysis_setup(cfg).batch.generation.responses

    assert torch.equal(batch(3), batch(3))
    assert not torch.equal(batch(3), batch(4))
