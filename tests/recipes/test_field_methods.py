"""pdm-2nd, ipo, icepop, clip-cov, kl-cov (issue 46): each against a float64 reference and through
the math API (``test_field_methods_verl``: through verl 0.9.1's real loss path).

- ``pdm-2nd``: its mask against the brute-force float64 reference of the statistics
  (``tests/trust_region/reference.py``: full softmax, Python sets, fsum), on random and on
  LLM-like logits (a few plausible tokens and a long thin tail), in each form: 0 mismatches.
- ``ipo``, ``icepop``: mask, loss and gradient against references written from their docstrings'
  formulas, token by token.
- ``clip-cov``, ``kl-cov``: equal to verl 0.9.1's own ``compute_policy_loss_clip_cov`` /
  ``compute_policy_loss_kl_cov``, called from the installed package on the same batch (clip-cov:
  with verl's global generator seeded with the recipe's ``draw_seed``), in float64 and float32
  (bit for bit), and with bf16 log-probs from the float32 inputs (``batch.fp32``).

Tolerances: float64 throughout (1e-10 relative), every threshold decision checked to be further
than 1e-9 from its threshold, so no decision can flip on rounding.
"""

from __future__ import annotations

import math

import pytest
import torch

from pdmask.trust_region import apply_method, compute_token_stats, policy_loss
from pdmask.trust_region.loss import aggregate_loss
from tests.methods import method as recipe_method
from tests.methods import project_recipes
from tests.trust_region.reference import token_reference

K = 6


def _case(seed=0, b=5, t=7, vocab=40, spread=0.6, llm_like=False):
    """Padded [B, T] responses of lengths 7, 1, 4, 6, 3; mu a perturbed pi. ``llm_like``: a few
    plausible tokens per position over a long thin Zipf tail of ``vocab`` tokens."""
    g = torch.Generator().manual_seed(seed)
    if llm_like:
        tail = -1.1 * torch.arange(1, vocab + 1, dtype=torch.float64).log()
        logits = tail[torch.randperm(vocab, generator=g)].expand(b, t, vocab).clone()
        heads = torch.randint(0, vocab, (b, t, 3), generator=g)
        logits.scatter_(-1, heads, 6 + 2 * torch.rand(b, t, 3, generator=g, dtype=torch.float64))
    else:
        logits = torch.randn(b, t, vocab, generator=g, dtype=torch.float64) * 2
    noise = spread * torch.randn(logits.shape, generator=g, dtype=torch.float64)
    mu_full = torch.log_softmax(logits + noise, -1)
    sampled = torch.multinomial(mu_full.exp().reshape(-1, vocab), 1, generator=g).reshape(b, t)
    top_lp, top_ids = mu_full.topk(K, -1)
    mu_k = mu_full.gather(-1, sampled[..., None]).squeeze(-1)
    lengths = torch.tensor([7, 1, 4, 6, 3][:b])
    valid = torch.arange(t)[None, :] < lengths[:, None]
    adv = torch.where(
        valid, torch.tensor([1.0, -1.0, 0.6, -0.4, 0.0][:b], dtype=torch.float64)[:, None], 0.0
    )
    return logits, sampled, top_ids, top_lp, mu_k, adv, valid


def test_the_field_methods_ship_as_recipes():
    recipes = project_recipes()
    assert recipes["pdm-2nd"].needs == ("behaviour_topk", "second_order")
    assert recipes["pdm-2nd"].uses_delta and recipes["ipo"].uses_delta
    assert recipes["ipo"].loss_sees_mask and recipes["clip-cov"].loss_sees_mask
    assert not any(recipes[n].uses_delta for n in ("icepop", "clip-cov", "kl-cov"))
    # verl ships clip_cov and kl_cov: pdmask's are registered beside them, not over them
    assert (recipes["clip-cov"].verl_name, recipes["kl-cov"].verl_name) == (
        "pdm_clip_cov",
        "pdm_kl_cov",
    )


# -- pdm-2nd ---------------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["agg", "uni", "bucket"])
@pytest.mark.parametrize("llm_like", [False, True], ids=["random", "llm-like"])
@pytest.mark.parametrize("eta", [0.1, 2.0])
def test_pdm_2nd_masks_exactly_where_the_reference_predicts_growth(form, llm_like, eta):
    vocab = 2000 if llm_like else 40
    logits, sampled, ids, lps, mu_k, adv, valid = _case(seed=7, vocab=vocab, llm_like=llm_like)
    delta = 0.02 if llm_like else 0.1
    method = recipe_method("pdm-2nd", delta=delta, eta=eta, form=form)
    z = logits.clone().requires_grad_(True)
    res = policy_loss(method, z, sampled, ids, lps, mu_k, adv, valid)
    mask = torch.zeros_like(valid)
    margins, disagree_first_order = [], 0
    for i, j in valid.nonzero().tolist():
        ref = token_reference(
            logits[i, j], int(sampled[i, j]), float(mu_k[i, j]), ids[i, j].tolist(),
            lps[i, j].tolist(),
        )  # fmt: skip
        step = eta * float(adv[i, j])
        change = step * ref[f"ddot_{form}"] + 0.5 * step * step * ref[f"var_v_{form}"]
        mask[i, j] = ref["kl_topk"] > delta and change > 0
        margins += [abs(ref["kl_topk"] - delta), abs(change) if step else 1.0]
        first = ref["kl_topk"] > delta and step * ref[f"ddot_{form}"] > 0
        disagree_first_order += bool(mask[i, j]) != first
    assert min(margins) > 1e-9
    assert torch.equal(res.mask, mask)  # 0 mismatches
    assert 0 < int(mask.sum()) < int(valid.sum())  # decisions both ways
    if eta == 2.0 and form == "agg":  # a step long enough for the second order to decide
        assert disagree_first_order > 0
    # the gradient: -r A on the kept tokens (the default loss)
    res.loss.backward()
    z_ref = logits.clone().requires_grad_(True)
    logp = torch.log_softmax(z_ref, -1).gather(-1, sampled[..., None]).squeeze(-1)
    kept = valid & ~mask
    ref_loss = torch.where(kept, -torch.exp(logp - mu_k) * adv, 0.0).sum() / valid.sum()
    ref_loss.backward()
    torch.testing.assert_close(z.grad, z_ref.grad, rtol=1e-10, atol=1e-13)


def test_pdm_2nd_at_a_vanishing_step_is_pdm_agg():
    logits, sampled, ids, lps, mu_k, adv, valid = _case(seed=2)
    args = (logits, sampled, ids, lps, mu_k, adv, valid)
    second = policy_loss(recipe_method("pdm-2nd", delta=0.1, eta=1e-6), *args)
    first = policy_loss(recipe_method("pdm-agg", delta=0.1), *args)
    assert torch.equal(second.mask, first.mask) and int(first.mask.sum()) > 0


# -- ipo, icepop -----------------------------------------------------------------------------


def _logp(z, sampled):
    return torch.log_softmax(z, -1).gather(-1, sampled[..., None]).squeeze(-1)


@pytest.mark.parametrize("eps", [0.05, 0.1])
def test_ipo_equals_prime_rls_formula(eps):
    logits, sampled, ids, lps, mu_k, adv, valid = _case(seed=4, spread=0.8)
    kl_tau = 0.01
    z = logits.clone().requires_grad_(True)
    res = policy_loss(
        recipe_method("ipo", eps=eps, kl_tau=kl_tau), z, sampled, ids, lps, mu_k, adv, valid
    )
    res.loss.backward()
    z_ref = logits.clone().requires_grad_(True)
    logp = _logp(z_ref, sampled)
    moved = (logp.detach().exp() - mu_k.exp()).abs()
    mask = (moved > eps) & valid
    log_r = logp - mu_k
    token = torch.where(mask, 0.0, -adv * log_r.exp()) + kl_tau * log_r**2
    ref = torch.where(valid, token, 0.0).sum() / valid.sum()
    ref.backward()
    assert float((moved[valid] - eps).abs().min()) > 1e-9
    assert torch.equal(res.mask, mask) and 0 < int(mask.sum()) < int(valid.sum())
    torch.testing.assert_close(res.loss.detach(), ref.detach(), rtol=1e-10, atol=1e-13)
    torch.testing.assert_close(z.grad, z_ref.grad, rtol=1e-10, atol=1e-13)
    # the masked tokens still feel the drift term: their loss is kl_tau (log r)^2, not 0
    torch.testing.assert_close(res.token_loss[mask], (kl_tau * log_r**2)[mask].detach())


def test_icepop_drops_the_band_in_both_directions_and_clips_like_ppo():
    logits, sampled, ids, lps, mu_k, adv, valid = _case(seed=5, spread=1.2)
    params = {"band_low": 0.6, "band_high": 1.6, "eps_low": 0.2, "eps_high": 0.28}
    z = logits.clone().requires_grad_(True)
    res = policy_loss(recipe_method("icepop", **params), z, sampled, ids, lps, mu_k, adv, valid)
    res.loss.backward()
    z_ref = logits.clone().requires_grad_(True)
    r = (_logp(z_ref, sampled) - mu_k).exp()
    rv = r.detach()
    band = (rv < params["band_low"]) | (rv > params["band_high"])
    clip = ((rv < 1 - params["eps_low"]) | (rv > 1 + params["eps_high"])) & (adv * (rv - 1) > 0)
    mask = (band | clip) & valid
    ref = torch.where(valid & ~mask, -r * adv, 0.0).sum() / valid.sum()
    ref.backward()
    bounds = [
        params["band_low"],
        params["band_high"],
        1 - params["eps_low"],
        1 + params["eps_high"],
    ]
    assert min(float((rv[valid] - c).abs().min()) for c in bounds) > 1e-9
    assert torch.equal(res.mask, mask)
    # the band drops tokens PPO's clip would keep (pulled back toward mu)
    assert bool((band & ~clip & valid).any()) and bool((clip & valid).any())
    torch.testing.assert_close(z.grad, z_ref.grad, rtol=1e-10, atol=1e-13)


# -- clip-cov, kl-cov: verl's own losses ------------------------------------------------------

PARAMS = {
    "clip-cov": {"clip_cov_ratio": 0.2, "clip_cov_lb": 0.05, "clip_cov_ub": 5.0},
    "kl-cov": {"kl_cov_ratio": 0.2, "ppo_kl_coef": 0.5},
}


def verl_config(name: str, params: dict):
    pytest.importorskip("verl")
    from verl.workers.config import ActorConfig, PolicyLossConfig

    policy = PolicyLossConfig(loss_mode=name.replace("-", "_"), **params)
    return ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio_low=0.2,  # the recipes' clip (clip-cov's defaults; kl-cov has none)
        clip_ratio_high=0.28,
        policy_loss=policy,
    )


def draw_seed(sampled: torch.Tensor, valid: torch.Tensor, seed: int = 0) -> int:
    """recipes/clip_cov.py's draw_seed, as its docstring states it."""
    return (seed * 1_000_003 + int(sampled[valid].sum()) * 31 + int(valid.sum())) % 2**31


def verls_own(name, params, mu_k, log_prob, adv, valid, sampled):
    """verl 0.9.1's loss and its gradient on ``log_prob``, clip-cov's draw seeded as ours."""
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    theirs = log_prob.detach().clone().requires_grad_(True)
    torch.manual_seed(draw_seed(sampled, valid))  # verl draws from torch's global generator
    loss, _ = get_policy_loss_fn(name.replace("-", "_"))(
        mu_k, theirs, adv, valid, "token-mean", verl_config(name, params)
    )
    loss.backward()
    return loss.detach(), theirs.grad


def ours(name, params, stats, log_prob, mu_k, adv, valid):
    leaf = log_prob.detach().clone().requires_grad_(True)
    out = apply_method(
        recipe_method(name, **params),
        stats,
        adv,
        valid,
        log_prob=leaf,
        mu_log_prob=mu_k,
        backend="verl",
    )
    loss = aggregate_loss(out.token_loss, valid)
    loss.backward()
    return loss.detach(), leaf.grad, out


@pytest.mark.parametrize("name", ["clip-cov", "kl-cov"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_equal_to_verls_own_loss_bit_for_bit(name, dtype, seed):
    logits, sampled, ids, lps, mu_k, adv, valid = _case(seed=seed, spread=0.8)
    stats = compute_token_stats(logits.to(dtype), sampled, ids, lps.to(dtype), mu_k.to(dtype))
    log_prob, mu, a = stats.logp.detach(), mu_k.to(dtype), adv.to(dtype)
    params = dict(PARAMS[name])
    ref_loss, ref_grad = verls_own(name, params, mu, log_prob, a, valid, sampled)
    loss, grad, out = ours(name, params, stats, log_prob, mu, a, valid)
    assert loss.dtype == dtype
    assert torch.equal(loss, ref_loss), (float(loss), float(ref_loss))
    assert torch.equal(grad, ref_grad)
    if name == "clip-cov":
        drawn = out.mask & ~(out.batch.fp32.advantages * (out.batch.stats.ratio - 1) > 0) & valid
        assert int(out.mask.sum()) > int(drawn.sum()) > 0  # clipped tokens and drawn ones
    else:
        assert out.batch.reported["penalised_frac"] > 0


@pytest.mark.parametrize("name", ["clip-cov", "kl-cov"])
def test_bf16_log_probs_compute_from_the_float32_inputs_as_verl_does(name):
    """verl's functions promote bf16 log-probs against its float32 old log-probs and
    advantages; so does the recipe (``batch.fp32``), and only the per-token loss is rounded to
    the batch's dtype: the losses agree to one bf16 rounding of each token's loss."""
    logits, sampled, ids, lps, mu_k, adv, valid = _case(seed=3, spread=0.8)
    stats = compute_token_stats(logits.float(), sampled, ids, lps.float(), mu_k.float())
    log_prob = stats.logp.detach().to(torch.bfloat16)
    mu, a = mu_k.float(), adv.float()
    params = dict(PARAMS[name])
    ref_loss, ref_grad = verls_own(name, params, mu, log_prob, a, valid, sampled)
    loss, grad, out = ours(name, params, stats, log_prob, mu, a, valid)
    assert out.token_loss.dtype == torch.bfloat16 and ref_loss.dtype == torch.float32
    bf16 = 2.0**-8  # one rounding of each token's loss (relative)
    scale = float(out.token_loss.detach().float().abs().max())
    assert math.isclose(float(loss), float(ref_loss), rel_tol=bf16, abs_tol=bf16 * scale)
    torch.testing.assert_close(
        grad.float(), ref_grad.float(), rtol=2 * bf16, atol=2 * bf16 * float(ref_grad.abs().max())
    )
