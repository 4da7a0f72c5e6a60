"""cispo, gspo, tis, mis, seq-mis: loss and gradient equal a brute-force float64 reference on the
math API and on the embedded trainer's real update (``test_baselines_verl``: through verl 0.9.1's
real ``ppo_loss``).

Tolerances: the math API runs in float64 there (1e-10). The two backends run in float32: log pi of
one token carries a rounding error of a few ulps of |logits| + log V (~1e-6 absolute here), the
ratio r = exp(log pi - log mu) the same relative error, a sequence's ratio (a mean or a sum of at
most T log-ratios) T times that; the gradient -w A (e_k - pi) / N inherits these relative errors.
So ``RTOL32 = 32 * eps32 * (1 + T)`` (T = the longest response) with an absolute floor of
``RTOL32`` times the gradient's largest entry. A mask or clip decision within that of its threshold
could go either way: each case asserts its decisions are further away (``decision_margin``).
"""

from __future__ import annotations

import pytest
import torch

from pdmask.trust_region import compute_token_stats, policy_loss
from tests.methods import method as recipe_method
from tests.methods import project_recipes

from .reference import decision_margin, reference_loss

EPS32 = torch.finfo(torch.float32).eps
# Parameters that make every decision non-trivial on the test batches (some tokens clipped or
# masked, some not); each recipe's defaults are checked too where they do.
CASES = {
    "cispo": [{}, {"eps_low": 0.2, "eps_high": 0.1}],
    "tis": [{}, {"is_cap": 1.2}],
    "mis": [{}, {"is_cap": 1.5, "is_floor": 0.75}],
    "gspo": [{"eps_low": 0.05, "eps_high": 0.1}],
    "seq-mis": [{}],
}
PARAMS = [(name, p) for name, cases in CASES.items() for p in cases]


def resolved(name, params):
    recipe = project_recipes()[name]
    out, errors = recipe.resolve_params(params)
    assert not errors
    return out


def flip_tolerance(logits, longest: int) -> float:
    """How close (relatively) a float32 decision value may come to its threshold before float32
    and float64 may disagree: log pi's rounding, ~ a few ulps of the largest |logit|, times the
    tokens a sequence-level value sums."""
    return 8 * EPS32 * max(1.0, float(logits.detach().abs().max())) * longest


def grad_close(got, want, longest):
    rtol = 32 * EPS32 * (1 + longest)
    torch.testing.assert_close(got.double(), want, rtol=rtol, atol=rtol * float(want.abs().max()))


def test_the_baselines_ship_as_recipes():
    recipes = project_recipes()
    for name in CASES:
        assert name in recipes
        assert recipes[name].mask is not None or recipes[name].loss is not None
    assert recipes["gspo"].verl_name == "pdm_gspo" and recipes["cispo"].verl_name == "pdm_cispo"
    assert not any(recipes[n].uses_delta for n in CASES)  # not crossed with the delta axis


# -- the math API, float64 -----------------------------------------------------------------------


def _case(seed=0, b=5, t=7, vocab=40, k=6, spread=0.35):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, t, vocab, generator=g, dtype=torch.float64) * 2
    mu_logp = torch.log_softmax(
        logits + spread * torch.randn(logits.shape, generator=g, dtype=torch.float64), -1
    )
    sampled = torch.multinomial(mu_logp.exp().reshape(-1, vocab), 1, generator=g).reshape(b, t)
    top_lp, top_ids = mu_logp.topk(k, -1)
    mu_k = mu_logp.gather(-1, sampled[..., None]).squeeze(-1)
    lengths = torch.tensor([7, 1, 4, 6, 3][:b])
    valid = torch.arange(t)[None, :] < lengths[:, None]
    adv = torch.where(
        valid, torch.tensor([1.0, -1.0, 0.6, -0.4, 0.0][:b], dtype=torch.float64)[:, None], 0.0
    )
    return logits, sampled, top_ids, top_lp, mu_k, adv, valid


@pytest.mark.parametrize("name,params", PARAMS)
def test_math_api_float64_equals_the_reference(name, params):
    params = resolved(name, params)
    logits, sampled, ids, lps, mu_k, adv, valid = _case()
    assert decision_margin(name, logits, sampled, mu_k, valid, params) > 1e-6
    z = logits.clone().requires_grad_(True)
    res = policy_loss(recipe_method(name, **params), z, sampled, ids, lps, mu_k, adv, valid)
    res.loss.backward()
    z_ref = logits.clone().requires_grad_(True)
    ref, ref_mask = reference_loss(name, z_ref, sampled, mu_k, adv, valid, params)
    ref.backward()
    assert res.loss.dtype == torch.float64 and res.token_loss.dtype == torch.float64
    torch.testing.assert_close(res.loss.detach(), ref.detach(), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(z.grad, z_ref.grad, rtol=1e-10, atol=1e-13)
    assert torch.equal(res.mask, ref_mask)
    assert z.grad.abs().sum() > 0


# -- verl 0.9.1's own cispo and gspo: the same gradient ----------------------------------------


@pytest.mark.parametrize("name", ["cispo", "gspo"])
def test_gradient_equals_verls_own_loss(name):
    """verl 0.9.1 ships CISPO and GSPO; with the same clip range and mu, the gradients agree."""
    pytest.importorskip("verl")
    from verl.trainer.ppo.core_algos import get_policy_loss_fn
    from verl.workers.config import ActorConfig

    from pdmask.trust_region import apply_method

    params = resolved(
        name,
        {"eps_low": 0.2, "eps_high": 0.1}
        if name == "cispo"
        else {"eps_low": 0.05, "eps_high": 0.1},
    )
    logits, sampled, ids, lps, mu_k, adv, valid = _case(seed=3)
    stats = compute_token_stats(logits, sampled, ids, lps, mu_k)
    ours = stats.logp.detach().clone().requires_grad_(True)
    out = apply_method(
        recipe_method(name, **params), stats, adv, valid, log_prob=ours, backend="verl"
    )
    (out.token_loss.sum() / valid.sum()).backward()
    theirs = stats.logp.detach().clone().requires_grad_(True)
    config = ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio_low=params["eps_low"],
        clip_ratio_high=params["eps_high"],
    )
    loss, _ = get_policy_loss_fn(name)(mu_k, theirs, adv, valid, "token-mean", config)
    loss.backward()
    assert 0 < out.mask.sum() < valid.sum() or name == "cispo"
    torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-10, atol=1e-13)


# -- the embedded trainer's real update ------------------------------------------------------------


@pytest.fixture(scope="module")
def sim_state(model_cache):
    """A real tiny-4b base model, a real rollout with a learning signal, one minibatch."""
    from pdmask.backends.sim import SimTrialConfig
    from pdmask.backends.sim.state import TrialState, step_generator

    cfg = SimTrialConfig(
        stand_in="tiny-4b",
        precision="fp8-rollout",
        profile="smoke",
        base_model="stand-in",
        seed=1,
        delta=0.15,
        cache_dir=str(model_cache / "sim"),
    )
    batch = TrialState(cfg).rollout(step_generator(cfg.seed, 1, "rollout"))
    assert (batch.token_advantages != 0).any()  # something to learn
    return cfg, batch


@pytest.mark.parametrize("name,params", PARAMS)
def test_sim_update_equals_the_reference(name, params, sim_state, monkeypatch):
    from pdmask.backends.sim import trainer
    from pdmask.backends.sim.grpo import trainer_logits_and_hidden
    from pdmask.backends.sim.runtime import single_threaded
    from pdmask.backends.sim.state import TrialState
    from pdmask.backends.sim.trainer import _update

    cfg, batch = sim_state
    params = resolved(name, params)
    index = torch.arange(batch.size // 2)
    gen = batch.generation
    captured = []

    def keep_logits(*args):  # the trainer's logits of the update, their gradient kept
        out, hidden = trainer_logits_and_hidden(*args)
        out.retain_grad()
        captured.append(out)
        return out, hidden

    monkeypatch.setattr(trainer, "trainer_logits_and_hidden", keep_logits)
    with single_threaded():
        state = TrialState(cfg)
        metrics, _ = _update(state, batch, index, recipe_method(name, **params), step=1)
    (logits,) = captured
    valid = batch.valid[index]
    mu = gen.mu_logp[index]
    longest = int(valid.sum(-1).max())
    margin = decision_margin(name, logits, gen.responses[index], mu, valid, params)
    assert margin > flip_tolerance(logits, longest)
    z = logits.detach().double().requires_grad_(True)
    ref, ref_mask = reference_loss(
        name, z, gen.responses[index], mu, batch.token_advantages[index], valid, params
    )
    ref.backward()
    grad_close(logits.grad, z.grad, longest)
    assert metrics["actor/pg_loss"] == pytest.approx(float(ref), rel=1e-4, abs=1e-6)
    masked = int((ref_mask & valid).sum()) / int(valid.sum())
    assert metrics["actor/pdm/masked_frac"] == pytest.approx(masked, abs=1e-9)
    assert z.grad.abs().sum() > 0
