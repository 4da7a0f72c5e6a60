"""cispo, gspo, tis, mis, seq-mis through verl 0.9.1's real ``ppo_loss``, as a job's FSDP actor runs
them (the logits hook, then the loss): loss and gradient equal the brute-force float64 reference.
Tolerances as in ``test_baselines``."""

from __future__ import annotations

from dataclasses import replace

import pytest

pytest.importorskip("verl")
pytestmark = pytest.mark.verl

from verl.workers.config import ActorConfig  # noqa: E402

from pdmask.backends.verl.config import PDMPolicyLossConfig  # noqa: E402
from tests.verl.batches import make_batch, response_frame  # noqa: E402
from tests.verl.test_loss_path import ALL, verl_step  # noqa: E402

from .reference import decision_margin, reference_loss  # noqa: E402
from .test_baselines import EPS32, PARAMS, flip_tolerance, grad_close, resolved  # noqa: E402


@pytest.mark.parametrize("name,params", PARAMS)
def test_verl_loss_path_equals_the_reference(name, params, carry):
    params = resolved(name, params)
    batch = make_batch(mismatch=0.3)
    job = carry(name, **params)
    config = ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        loss_agg_mode="token-mean",
        policy_loss=PDMPolicyLossConfig(loss_mode=job.loss_mode, pdm_topk=5, pdm_chunk_size=7),
    )
    loss, metrics = verl_step(batch, ALL, config)
    verl_grad = batch.leaf.grad.clone()

    twin = replace(batch, leaf=batch.leaf.detach().double().requires_grad_(True))
    frame = response_frame(twin, ALL)
    longest = int(frame.valid.sum(-1).max())
    margin = decision_margin(name, frame.logits, frame.sampled, frame.mu_k, frame.valid, params)
    assert margin > flip_tolerance(frame.logits, longest)
    ref, ref_mask = reference_loss(
        name, frame.logits, frame.sampled, frame.mu_k, frame.adv, frame.valid, params
    )
    ref.backward()
    grad_close(verl_grad, twin.leaf.grad, longest)
    rtol = 32 * EPS32 * (1 + longest)
    assert float(loss) == pytest.approx(float(ref), rel=rtol, abs=rtol * float(ref.abs()))
    masked = int((ref_mask & frame.valid).sum()) / int(frame.valid.sum())
    assert metrics["actor/pdm/masked_frac"].aggregate() == pytest.approx(masked, abs=1e-9)
    if name in ("mis", "gspo", "seq-mis"):
        assert 0 < masked < 1, masked  # the mask decided something, not everything
