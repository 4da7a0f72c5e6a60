"""GRPO advantages, checked against verl's own implementation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pdmask.backends.sim.grpo import grpo_advantages


def test_group_normalised_advantages():
    rewards = torch.tensor([1.0, 0, 0, 0, 0, 0, 0, 0])
    adv = grpo_advantages(rewards, 4)
    assert adv[4:].abs().max() == 0  # a group without signal has zero advantage
    assert adv[0] > 0 and (adv[1:4] < 0).all()
    assert abs(float(adv[:4].sum())) < 1e-6


@pytest.mark.verl
def test_matches_verl_compute_grpo_outcome_advantage():
    core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
    g = torch.Generator().manual_seed(0)
    rewards = (torch.rand(6 * 8, generator=g) < 0.3).float()
    response_mask = torch.ones(48, 5)
    token_rewards = torch.zeros(48, 5)
    token_rewards[:, -1] = rewards
    index = np.repeat(np.arange(6), 8)
    expected, _ = core_algos.compute_grpo_outcome_advantage(token_rewards, response_mask, index)
    assert torch.allclose(grpo_advantages(rewards, 8), expected[:, 0], atol=1e-6)
