"""The token-level analysis building block."""

from __future__ import annotations

import torch

from pdmask.backends.sim import build_analysis_setup
from tests.methods import mask_of


def test_setup_carries_everything_the_math_api_needs(smoke_config):
    setup = build_analysis_setup(smoke_config(precision="fp8-rollout"))
    gen = setup.batch.generation
    n, r = gen.responses.shape
    assert setup.advantages.shape == setup.valid.shape == (n, r)
    assert gen.mu_topk_ids.shape == (n, r, 20)
    assert gen.mu_full_logprobs.shape == (n, r, setup.task.vocab_size)
    logits = setup.logits()
    assert logits.shape == (n, r, setup.task.vocab_size) and logits.requires_grad
    stats = setup.stats(logits)
    exact = setup.exact(logits)
    valid = setup.valid
    # The exact KL bounds the top-K one from above; the estimators track the exact derivative.
    assert (exact.kl[valid] >= stats.kl_topk[valid] - 1e-6).all()
    assert torch.allclose(stats.ddot_bucket[valid], exact.ddot[valid], atol=0.05)


def test_stale_updates_move_pi_away_from_mu_and_update_applies_a_mask(learned_base_config):
    fresh = build_analysis_setup(learned_base_config())
    stale = build_analysis_setup(learned_base_config(), stale_updates=3)
    with torch.no_grad():
        kl_fresh = fresh.stats(fresh.logits()).kl_topk[fresh.valid].mean()
        kl_stale = stale.stats(stale.logits()).kl_topk[stale.valid].mean()
    assert kl_stale > 10 * kl_fresh
    # The same batch either way (the batch is drawn before the stale updates).
    assert torch.equal(fresh.batch.generation.responses, stale.batch.generation.responses)

    stats = fresh.stats(fresh.logits())
    mask = mask_of("pdm-agg", stats, fresh.advantages, fresh.valid, delta=0.15)
    before = [p.detach().clone() for p in fresh.trainer.parameters()]
    fresh.update(mask)
    after = list(fresh.trainer.parameters())
    assert (fresh.advantages != 0).any()
    assert any(not torch.equal(b, a) for b, a in zip(before, after, strict=True))
