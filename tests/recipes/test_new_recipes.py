"""k3-penalty, asym-pdm, seq-tv and ent-bonus (issue 24's probe methods, shipped): mask, loss and gradient
equal brute-force float64 references written from their docstrings' formulas, token by token
from the full distributions (not from pdmask's statistics).

Tolerances: everything runs in float64 (1e-10 relative); every threshold decision is checked to
be further than 1e-9 from its threshold, so no decision can flip on rounding.
"""

from __future__ import annotations

import math

import pytest
import torch

from pdmask.trust_region import policy_loss
from tests.methods import method as recipe_method
from tests.methods import project_recipes

K = 6


def _case(seed=0, b=5, t=7, vocab=40, spread=0.6):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, t, vocab, generator=g, dtype=torch.float64) * 2
    mu_full = torch.log_softmax(
        logits + spread * torch.randn(logits.shape, generator=g, dtype=torch.float64), -1
    )
    sampled = torch.multinomial(mu_full.exp().reshape(-1, vocab), 1, generator=g).reshape(b, t)
    top_lp, top_ids = mu_full.topk(K, -1)
    mu_k = mu_full.gather(-1, sampled[..., None]).squeeze(-1)
    lengths = torch.tensor([7, 1, 4, 6, 3][:b])
    valid = torch.arange(t)[None, :] < lengths[:, None]
    adv = torch.where(
        valid, torch.tensor([1.0, -1.0, 0.6, -0.4, -0.8][:b], dtype=torch.float64)[:, None], 0.0
    )
    return logits, sampled, top_ids, top_lp, mu_k, adv, valid, mu_full


def _token_values(logits, sampled, top_ids, mu_full, i, j):
    """(log pi(y), KL_topK, TV_topK, Ddot_agg, H(pi)) of token (i, j), from the full
    distributions."""
    logp_all = torch.log_softmax(logits[i, j], -1)
    pi = logp_all.exp()
    mu = mu_full[i, j].exp()
    support = [int(s) for s in top_ids[i, j]]
    pi_tail = 1.0 - sum(float(pi[s]) for s in support)
    mu_tail = 1.0 - sum(float(mu[s]) for s in support)
    kl = sum(float(mu[s]) * math.log(float(mu[s]) / float(pi[s])) for s in support)
    kl += mu_tail * math.log(mu_tail / pi_tail)
    tv = 0.5 * (sum(abs(float(mu[s]) - float(pi[s])) for s in support) + abs(mu_tail - pi_tail))
    k = int(sampled[i, j])
    ddot = float(pi[k]) - float(mu[k])
    ddot += sum(float(pi[s]) * (float(mu[s]) - float(pi[s])) for s in support)
    ddot += pi_tail * (mu_tail - pi_tail)
    entropy = -(logp_all.exp() * logp_all).sum()
    return logp_all[k], kl, tv, ddot, entropy


def _run(name, case, **params):
    logits, sampled, ids, lps, mu_k, adv, valid, _ = case
    z = logits.clone().requires_grad_(True)
    res = policy_loss(recipe_method(name, **params), z, sampled, ids, lps, mu_k, adv, valid)
    res.loss.backward()
    return res, z.grad


def _reference(case, token_loss_and_mask):
    """Token-mean loss of ``token_loss_and_mask(i, j, logp, kl, tv, ddot, entropy) -> (loss,
    masked)``,
    its gradient on the logits, and the mask."""
    logits, sampled, ids, _, mu_k, adv, valid, mu_full = case
    z = logits.clone().requires_grad_(True)
    b, t = valid.shape
    mask = torch.zeros(b, t, dtype=torch.bool)
    total = torch.zeros((), dtype=torch.float64)
    for i in range(b):
        for j in range(t):
            if not valid[i, j]:
                continue
            loss, masked = token_loss_and_mask(i, j, *_token_values(z, sampled, ids, mu_full, i, j))
            mask[i, j] = masked
            total = total + loss
    total = total / int(valid.sum())
    total.backward()
    return total.detach(), z.grad, mask


def _check(res, grad, ref):
    loss, ref_grad, ref_mask = ref
    assert torch.equal(res.mask, ref_mask)
    assert 0 < int(ref_mask.sum()) < int(res.mask.numel())  # decisions both ways
    assert not bool((res.mask & ~ref_mask).any())
    torch.testing.assert_close(res.loss.detach(), loss, rtol=1e-10, atol=1e-13)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-10, atol=1e-13)


def test_the_probe_methods_ship_as_recipes():
    recipes = project_recipes()
    assert recipes["k3-penalty"].loss_sees_mask and not recipes["k3-penalty"].uses_delta
    assert recipes["asym-pdm"].uses_delta and recipes["seq-tv"].uses_delta
    assert recipes["ent-bonus"].loss_sees_mask and "entropy" in recipes["ent-bonus"].needs


@pytest.mark.parametrize("beta", [0.1, 2.0])
def test_k3_penalty_equals_the_reference_and_acts_on_clipped_tokens(beta):
    case = _case()
    _, _, _, _, mu_k, adv, _, _ = case
    eps_low, eps_high = 0.2, 0.28
    margins = []

    def token(i, j, logp, kl, tv, ddot, entropy):
        log_r = logp - mu_k[i, j]
        r = float(log_r.detach().exp())
        a = float(adv[i, j])
        margins.extend([abs(r - (1 - eps_low)), abs(r - (1 + eps_high))])
        masked = (r < 1 - eps_low or r > 1 + eps_high) and a * (r - 1) > 0
        log_mu_over_pi = -log_r
        k3 = torch.exp(log_mu_over_pi) - log_mu_over_pi - 1
        pg = 0.0 if masked else -torch.exp(log_r) * a
        return beta * k3 + pg, masked

    ref = _reference(case, token)
    res, grad = _run("k3-penalty", case, beta=beta)
    assert min(margins) > 1e-9
    _check(res, grad, ref)
    # The penalty is kept on the clipped tokens (it is what pulls them back), and reported.
    assert bool((res.token_loss[res.mask] > 0).all())
    valid = case[6]
    log_mu_over_pi = res.stats.mu_logp - res.stats.logp.detach()
    k3 = log_mu_over_pi.exp() - log_mu_over_pi - 1
    assert res.metrics["recipe/k3_mean"] == pytest.approx(float(k3[valid].mean()), rel=1e-10)


@pytest.mark.parametrize("neg_scale", [0.5, 1.0, 3.0])
def test_asym_pdm_equals_the_reference(neg_scale):
    case = _case(seed=1)
    _, _, _, _, mu_k, adv, _, _ = case
    delta = 0.12
    margins = []

    def token(i, j, logp, kl, tv, ddot, entropy):
        a = float(adv[i, j])
        threshold = delta if a > 0 else neg_scale * delta
        margins.extend([abs(kl - threshold), abs(ddot)])
        masked = kl > threshold and a * ddot > 0
        r = torch.exp(logp - mu_k[i, j])
        return (0.0 if masked else -r * a), masked

    ref = _reference(case, token)
    res, grad = _run("asym-pdm", case, delta=delta, neg_scale=neg_scale)
    assert min(margins) > 1e-9
    _check(res, grad, ref)
    if neg_scale == 1.0:  # one threshold: pdm-agg exactly
        agg, _ = _run("pdm-agg", case, delta=delta)
        assert torch.equal(agg.mask, res.mask)


def test_seq_tv_masks_whole_responses_as_the_reference():
    case = _case(seed=2)
    logits, sampled, ids, _, mu_k, adv, valid, mu_full = case
    delta = 0.15
    b, t = valid.shape
    out_of_region = {}
    margins = []
    for i in range(b):  # the sequence-level decision, from the per-token values
        rows = [j for j in range(t) if valid[i, j]]
        values = [_token_values(logits, sampled, ids, mu_full, i, j) for j in rows]
        mean_tv = sum(v[2] for v in values) / len(rows)
        s = math.exp(
            min(
                sum(float(v[0]) - float(mu_k[i, j]) for v, j in zip(values, rows, strict=True))
                / len(rows),
                10.0,
            )
        )
        a = float(adv[i, rows[0]])
        margins.extend([abs(mean_tv - delta), abs(s - 1)])
        out_of_region[i] = mean_tv > delta and a * (s - 1) > 0

    def token(i, j, logp, kl, tv, ddot, entropy):
        masked = out_of_region[i]
        r = torch.exp(logp - mu_k[i, j])
        return (0.0 if masked else -r * float(adv[i, j])), masked

    ref = _reference(case, token)
    res, grad = _run("seq-tv", case, delta=delta)
    assert min(margins) > 1e-9
    _check(res, grad, ref)
    for i in range(b):  # whole responses
        assert len(set(res.mask[i][valid[i]].tolist())) == 1


def _entropy(row: torch.Tensor) -> torch.Tensor:
    logp = torch.log_softmax(row, -1)
    return -(logp.exp() * logp).sum()


@pytest.mark.parametrize("beta", [0.05, 1.0])
def test_ent_bonus_is_minus_beta_grad_entropy_on_the_tokens_pdm_agg_masks(beta):
    case = _case(seed=3)
    logits, sampled, ids, _, mu_k, adv, valid, mu_full = case
    delta = 0.1
    margins, masked_entropy = [], []

    def token(i, j, logp, kl, tv, ddot, entropy):
        a = float(adv[i, j])
        margins.extend([abs(kl - delta), abs(ddot)])
        masked = kl > delta and a * ddot > 0
        if masked:
            masked_entropy.append(float(entropy))
            return -beta * entropy, masked
        return -torch.exp(logp - mu_k[i, j]) * a, masked

    ref = _reference(case, token)
    n_valid = int(valid.sum())
    res, grad = _run("ent-bonus", case, delta=delta, beta=beta)
    assert min(margins) > 1e-9
    _check(res, grad, ref)
    # Token by token: a masked token's logits move along -beta grad H, nothing else.
    for i, j in ref[2].nonzero().tolist():
        row = logits[i, j].clone().requires_grad_(True)
        (grad_h,) = torch.autograd.grad(_entropy(row), row)
        torch.testing.assert_close(grad[i, j], -beta * grad_h / n_valid, rtol=1e-10, atol=1e-15)
    assert res.metrics["recipe/masked_entropy"] == pytest.approx(
        sum(masked_entropy) / len(masked_entropy), rel=1e-10
    )
    # pdm-agg's mask exactly; a recipe's batch.stats stays detached.
    agg, _ = _run("pdm-agg", case, delta=delta)
    assert torch.equal(agg.mask, res.mask)
    assert not res.stats.logp.requires_grad and not res.stats.entropy.requires_grad
