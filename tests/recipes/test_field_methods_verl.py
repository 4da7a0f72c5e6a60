"""pdm-2nd, ipo, icepop, clip-cov, kl-cov through verl 0.9.1's real ``ppo_loss``, as a job's FSDP
actor runs them (the logits hook, then the loss): loss and gradient equal the math API's on the
same samples (``test_field_methods`` holds the math API to float64 references and to verl's own
clip-cov and kl-cov). pdm-2nd's second-order statistics come out of the hook (the verl backend
supplies ``second_order``); clip-cov's draw is seeded from the same token ids on both paths."""

from __future__ import annotations

import pytest

pytest.importorskip("verl")
pytestmark = pytest.mark.verl

import torch  # noqa: E402

from tests.methods import method as recipe_method  # noqa: E402
from tests.verl.batches import make_batch  # noqa: E402
from tests.verl.test_loss_path import ALL, actor_config, math_api_step, verl_step  # noqa: E402

CASES = [
    ("pdm-2nd", {"delta": 0.05, "eta": 2.0, "form": "agg"}),
    ("pdm-2nd", {"delta": 0.05, "eta": 2.0, "form": "bucket"}),
    ("ipo", {"eps": 0.05}),
    ("icepop", {"band_low": 0.7, "band_high": 1.5}),
    ("clip-cov", {"clip_cov_ratio": 0.2, "clip_cov_lb": 0.05}),
    ("kl-cov", {"kl_cov_ratio": 0.2, "ppo_kl_coef": 0.5}),
]


@pytest.mark.parametrize("name,params", CASES, ids=lambda x: x if isinstance(x, str) else "")
def test_verl_loss_path_equals_the_math_api(name, params, carry):
    batch = make_batch(mismatch=0.6)
    job = carry(name, **params)
    delta = params.get("delta", params.get("eps"))
    loss, metrics = verl_step(batch, ALL, actor_config(job.loss_mode, "token-mean", delta))
    verl_grad = batch.leaf.grad.clone()
    batch.leaf.grad = None
    ref = math_api_step(batch, recipe_method(name, **params), delta=delta)
    torch.testing.assert_close(loss, ref.loss.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(verl_grad, batch.leaf.grad, rtol=1e-5, atol=1e-7)
    masked = ref.metrics["masked_frac"]
    assert metrics["actor/pdm/masked_frac"].aggregate() == pytest.approx(masked)
    if name == "kl-cov":  # a loss only: nothing masked, a few tokens penalised
        assert masked == 0 and metrics["actor/pdm/recipe/penalised_frac"].aggregate() > 0
    else:
        assert 0 < masked < 1, masked
