"""The differentiable inputs a recipe can ask for (``needs``: ``entropy``, ``support_log_probs``):
values and gradients of the chunked pass against plain float64 autograd over the full softmax.

Tolerances: float64 logits are compared at 1e-12 relative (the chunked backward sums the same
terms in another order). bf16 logits are computed in float32 from the exact bf16 values: values
to float32 rounding over a V-term sum (rtol 1e-5), gradients to one bf16 rounding of the result
(the gradient has the logits' dtype: rtol 2**-7)."""

from __future__ import annotations

import pytest
import torch

from pdmask.trust_region import Method, apply_method, compute_token_stats
from pdmask.trust_region.logits_pass import chunked_logits_pass

N, V, M = 11, 97, 5


def _inputs(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = (3 * torch.randn(N, V, generator=g, dtype=torch.float64)).to(dtype)
    sampled = torch.randint(0, V, (N,), generator=g)
    support = torch.randint(0, V, (N, M), generator=g)
    support[:, -1] = sampled  # the sampled token is in the support, as build_support puts it
    support[0, 1] = support[0, 0]  # a duplicate slot (how invalid slots are neutralised)
    weights = [torch.randn(shape, generator=g, dtype=torch.float64) for shape in ((N,), (N, M))]
    weights += [torch.randn(N, generator=g, dtype=torch.float64) for _ in range(2)]
    return logits, sampled, support, weights


def _objective(logp_y, logp_s, tail, entropy, weights, entropy_on, support_on):
    w_y, w_s, w_t, w_h = (w.to(logp_y.dtype) for w in weights)
    total = (logp_y * w_y).sum()
    if support_on:
        total = total + (logp_s * w_s).sum() + (tail * w_t).sum()
    if entropy_on:
        total = total + (entropy * w_h).sum()
    return total


def _reference(logits, sampled, support, weights, entropy_on, support_on):
    z = logits.double().requires_grad_(True)
    logp = torch.log_softmax(z, -1)
    p = logp.exp()
    off_support = torch.ones_like(p, dtype=torch.bool).scatter_(1, support, False)
    tail = (p * off_support).sum(-1)
    entropy = -(p * logp).sum(-1)
    logp_y = logp.gather(1, sampled[:, None]).squeeze(1)
    logp_s = logp.gather(1, support)
    total = _objective(logp_y, logp_s, tail, entropy, weights, entropy_on, support_on)
    (grad,) = torch.autograd.grad(total, z)
    return entropy.detach(), tail.detach(), logp_s.detach(), grad


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
@pytest.mark.parametrize("chunk_size", [1, 4, None])
@pytest.mark.parametrize(
    "entropy_on, support_on", [(True, False), (False, True), (True, True), (False, False)]
)
def test_values_and_gradients_equal_full_softmax_autograd(
    dtype, chunk_size, entropy_on, support_on
):
    logits, sampled, support, weights = _inputs(dtype)
    z = logits.clone().requires_grad_(True)
    out = chunked_logits_pass(
        z, sampled, support, chunk_size=chunk_size, entropy=entropy_on, support_grad=support_on
    )
    total = _objective(
        out.logp_sampled,
        out.logp_support,
        out.tail_mass,
        out.entropy,
        weights,
        entropy_on,
        support_on,
    )
    total.backward()
    entropy, tail, logp_s, grad = _reference(
        logits, sampled, support, weights, entropy_on, support_on
    )
    exact = dtype == torch.float64
    values = {"rtol": 1e-12, "atol": 1e-14} if exact else {"rtol": 1e-5, "atol": 1e-6}
    grads = {"rtol": 1e-12, "atol": 1e-14} if exact else {"rtol": 2**-7, "atol": 1e-6}
    assert z.grad.dtype == dtype
    torch.testing.assert_close(z.grad.double(), grad, **grads)
    torch.testing.assert_close(out.tail_mass.double(), tail, **values)
    torch.testing.assert_close(out.logp_support.double(), logp_s, **values)
    if entropy_on:
        torch.testing.assert_close(out.entropy.double(), entropy, **values)
    else:
        assert out.entropy is None
    assert out.logp_support.requires_grad == support_on == out.tail_mass.requires_grad


@pytest.mark.parametrize("chunk_size", [1, 4, None])
def test_entropy_gradient_on_some_rows_only(chunk_size):
    """ent-bonus's case: the entropy carries a gradient on the masked rows only. Chunks without
    one take the plain backward; every row's gradient must still equal the full reference."""
    logits, sampled, support, weights = _inputs(torch.float64)
    weights[3][::2] = 0.0  # the entropy's upstream gradient: zero on even rows
    weights[3][0:4] = 0.0  # and a whole 4-row chunk without one
    weights[0][1::2] = 0.0  # where the entropy acts, log pi(y) does not (the recipe's where())
    z = logits.clone().requires_grad_(True)
    out = chunked_logits_pass(z, sampled, support, chunk_size=chunk_size, entropy=True)
    _objective(out.logp_sampled, None, None, out.entropy, weights, True, False).backward()
    grad = _reference(logits, sampled, support, weights, True, False)[3]
    torch.testing.assert_close(z.grad, grad, rtol=1e-12, atol=1e-14)


def _stats_case(inputs):
    logits, sampled, _, _ = _inputs(torch.float64, seed=1)
    g = torch.Generator().manual_seed(2)
    mu = torch.log_softmax(
        logits + 0.5 * torch.randn(logits.shape, generator=g, dtype=torch.float64), -1
    )
    top_lp, top_ids = mu.topk(4, -1)
    top_lp[0, 3] = -torch.inf  # a missing top-K slot (top-p truncation)
    mu_k = mu.gather(1, sampled[:, None]).squeeze(1)
    z = logits.clone().requires_grad_(True)
    return (
        z,
        sampled,
        top_ids,
        top_lp,
        mu_k,
        mu,
        compute_token_stats(z, sampled, top_ids, top_lp, mu_k, inputs=inputs),
    )


def test_statistics_hand_a_recipe_exact_differentiable_support_and_entropy():
    z, sampled, top_ids, top_lp, mu_k, mu, stats = _stats_case(("entropy", "support_log_probs"))
    sup = stats.support
    logp = torch.log_softmax(z.detach(), -1)
    # Every valid slot is log pi at its id; invalid slots are -inf; S holds y.
    torch.testing.assert_close(
        sup.log_prob.detach()[sup.valid], logp.gather(1, sup.ids)[sup.valid], rtol=1e-12, atol=0
    )
    assert bool((sup.log_prob[~sup.valid] == -torch.inf).all())
    assert bool(((sup.ids == sampled[:, None]) & sup.valid).any(-1).all())
    # The tail's mass is pi off S, mu's likewise; both views agree with the statistics.
    in_s = torch.zeros_like(logp, dtype=torch.bool)
    for n in range(logp.shape[0]):
        in_s[n, sup.ids[n][sup.valid[n]]] = True
    torch.testing.assert_close(
        sup.tail_mass.detach(), (logp.exp() * ~in_s).sum(-1), rtol=1e-12, atol=1e-15
    )
    torch.testing.assert_close(sup.mu_tail_mass, (mu.exp() * ~in_s).sum(-1), rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(stats.pi_tail, sup.tail_mass.detach(), rtol=0, atol=0)
    # An exact top-K KL built from them has the gradient of the brute-force one.
    mu_s, logpi_s = sup.mu_log_prob.exp(), sup.log_prob
    kl = torch.where(sup.valid, mu_s * (sup.mu_log_prob - logpi_s), 0.0).sum(-1)
    kl = kl + sup.mu_tail_mass * (sup.mu_tail_mass.log() - sup.tail_mass.log())
    torch.testing.assert_close(kl.detach(), stats.kl_topk, rtol=1e-10, atol=1e-13)
    (grad,) = torch.autograd.grad(kl.sum(), z)
    ref_z = z.detach().clone().requires_grad_(True)
    ref_logp = torch.log_softmax(ref_z, -1)
    ref_tail = (ref_logp.exp() * ~in_s).sum(-1)
    ref_kl = torch.where(in_s, mu.exp() * (mu - ref_logp), 0.0).sum(-1)
    mu_tail = (mu.exp() * ~in_s).sum(-1)
    ref_kl = ref_kl + mu_tail * (mu_tail.log() - ref_tail.log())
    (ref_grad,) = torch.autograd.grad(ref_kl.sum(), ref_z)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-9, atol=1e-12)


def test_a_method_that_needs_an_input_the_statistics_lack_is_refused_by_name():
    *_, stats = _stats_case(())
    needy = Method("needy", needs=frozenset({"entropy"}))
    valid = torch.ones_like(stats.ratio, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"'needy' needs \['entropy'\]"):
        apply_method(needy, stats, torch.ones_like(stats.ratio), valid, backend="math")


def test_a_recipe_sees_the_differentiable_inputs_it_asked_for_and_detached_statistics():
    *_, stats = _stats_case(("entropy",))
    seen = {}

    def loss(batch):
        seen["batch"] = batch
        return -batch.entropy

    method = Method("ent", loss=loss, needs=frozenset({"entropy"}))
    valid = torch.ones_like(stats.ratio, dtype=torch.bool)
    out = apply_method(method, stats, torch.ones_like(stats.ratio), valid, backend="math")
    batch = seen["batch"]
    assert batch.entropy.requires_grad and batch.support is None
    assert not batch.stats.entropy.requires_grad and not batch.stats.logp.requires_grad
    assert out.token_loss.requires_grad


def test_the_inputs_come_in_the_batchs_dtype_as_every_float_there():
    """verl's log-probs are bf16 in a real FSDP job while the statistics are float32: a loss
    built from the entropy must still return the log-probs' dtype (it failed a real job)."""
    *_, stats = _stats_case(("entropy", "support_log_probs"))
    seen = {}

    def loss(batch):
        seen["batch"] = batch
        return -batch.entropy - batch.support.tail_mass

    method = Method("both", loss=loss, needs=frozenset({"entropy", "support_log_probs"}))
    log_prob = stats.logp.detach().to(torch.bfloat16).requires_grad_(True)
    valid = torch.ones_like(stats.ratio, dtype=torch.bool)
    out = apply_method(
        method, stats, torch.ones_like(stats.ratio), valid, log_prob=log_prob, backend="verl"
    )
    batch = seen["batch"]
    assert batch.entropy.dtype == batch.support.log_prob.dtype == torch.bfloat16
    assert out.token_loss.dtype == torch.bfloat16 and out.token_loss.requires_grad
