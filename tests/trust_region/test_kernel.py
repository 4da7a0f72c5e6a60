"""The output-embedding kernel terms (``trust_region.kernel``, ``exact.exact_gram``) against
brute-force float64 references: the top-K form rebuilt as an explicit vocabulary-wide vector with
Python sets, the identity ``W = I`` (where ``gram`` must be ``Ddot_bucket`` and the exact form
``Ddot``), and the decomposition of the own-gradient change that motivates the term, by autograd.

Tolerances: everything here is float64 (sums of at most a few hundred terms of size <= |W|^2):
1e-10 relative, 1e-12 absolute."""

from __future__ import annotations

import math

import pytest
import torch

from pdmask.trust_region import compute_token_stats, exact_divergence, exact_gram, kernel_terms

from .cases import make_case
from .reference import support_of

TOL = {"rtol": 1e-10, "atol": 1e-12}
SEEDS = range(12)


def _terms(case, weight, hidden):
    return kernel_terms(
        case.logits, hidden, weight, case.sampled, case.topk_ids, case.topk_logp, case.mu_logp
    )


def _gram_reference(case, weight) -> list[float]:
    """One token at a time: u over the whole vocabulary with the tail spread as pi (the tail
    bucket's pi-weighted embedding), then <W^T u, w_k - W^T pi>."""
    out = []
    for row in range(case.logits.shape[0]):
        z = case.logits[row]
        k = int(case.sampled[row])
        pi = torch.softmax(z, -1)
        sup = support_of(
            k, float(case.mu_logp[row]), case.topk_ids[row], case.topk_logp[row], len(z)
        )
        in_s = torch.zeros(len(z), dtype=torch.bool)
        in_s[sorted(sup)] = True
        pi_tail = math.fsum(pi[~in_s].tolist())
        mu_tail = max(0.0, 1.0 - math.fsum(math.exp(v) for v in sup.values()))
        u = torch.where(in_s, pi, pi * (pi_tail - mu_tail) / pi_tail)
        for i, lp in sup.items():
            u[i] = pi[i] - math.exp(lp)
        v = -pi.clone()
        v[k] += 1
        out.append(float((weight.T @ u) @ (weight.T @ v)))
    return out


@pytest.mark.parametrize("seed", SEEDS)
def test_gram_equals_the_explicit_vocabulary_sum(seed):
    case = make_case(seed, n=6, vocab=40, k=5)
    g = torch.Generator().manual_seed(100 + seed)
    weight = torch.randn(40, 7, generator=g, dtype=torch.float64)
    hidden = torch.randn(6, 7, generator=g, dtype=torch.float64)
    terms = _terms(case, weight, hidden)
    expected = torch.tensor(_gram_reference(case, weight), dtype=torch.float64)
    torch.testing.assert_close(terms.gram, expected, **TOL)
    torch.testing.assert_close(terms.head, (hidden * hidden).sum(-1), **TOL)


@pytest.mark.parametrize("seed", SEEDS)
def test_identity_embeddings_give_the_bucket_and_exact_derivatives(seed):
    case = make_case(seed, n=6, vocab=40, k=5)
    eye = torch.eye(40, dtype=torch.float64)
    terms = _terms(case, eye, torch.zeros(6, 40, dtype=torch.float64))
    stats = compute_token_stats(
        case.logits, case.sampled, case.topk_ids, case.topk_logp, case.mu_logp
    )
    torch.testing.assert_close(terms.gram, stats.ddot_bucket, **TOL)
    exact = exact_divergence(case.logits, case.mu_full.log(), case.sampled)
    torch.testing.assert_close(
        exact_gram(case.logits, case.mu_full.log(), case.sampled, eye), exact.ddot, **TOL
    )


def test_chunks_blocks_and_batch_shape_do_not_change_the_terms():
    case = make_case(3, n=8, vocab=40, k=5)
    g = torch.Generator().manual_seed(7)
    weight = torch.randn(40, 5, generator=g, dtype=torch.float64)
    hidden = torch.randn(8, 5, generator=g, dtype=torch.float64)
    whole = _terms(case, weight, hidden)
    chunked = kernel_terms(
        case.logits.reshape(2, 4, 40),
        hidden.reshape(2, 4, 5),
        weight,
        case.sampled.reshape(2, 4),
        case.topk_ids.reshape(2, 4, -1),
        case.topk_logp.reshape(2, 4, -1),
        case.mu_logp.reshape(2, 4),
        chunk_size=3,
        vocab_block=7,  # blocks of the weight that split the support, the last one short
    )
    torch.testing.assert_close(chunked.gram.reshape(-1), whole.gram, **TOL)
    with pytest.raises(ValueError, match="hidden"):
        kernel_terms(case.logits, hidden[:, :4], weight, case.sampled, None, None, case.mu_logp)


@pytest.mark.parametrize("seed", range(6))
def test_own_gradient_change_is_head_times_ddot_plus_the_gram_term(seed):
    """With a free hidden state (h itself a parameter: K_h = I) the decomposition is exact:
    <grad D, grad log pi_k> over (W, h) = |h|^2 Ddot + gram, for D the full KL."""
    case = make_case(seed, n=5, vocab=30, k=4)
    g = torch.Generator().manual_seed(200 + seed)
    weight = torch.randn(30, 6, generator=g, dtype=torch.float64, requires_grad=True)
    hidden = torch.randn(5, 6, generator=g, dtype=torch.float64, requires_grad=True)
    log_mu = case.mu_full.log()
    predicted = []
    for row in range(5):
        logp = torch.log_softmax(weight @ hidden[row], -1)
        kl = (log_mu[row].exp() * (log_mu[row] - logp)).sum()
        grad_kl = torch.autograd.grad(kl, (weight, hidden), retain_graph=True)
        grad_logp = torch.autograd.grad(logp[int(case.sampled[row])], (weight, hidden))
        predicted.append(sum(float((a * b).sum()) for a, b in zip(grad_kl, grad_logp, strict=True)))
    logits = (hidden @ weight.T).detach()
    ddot = exact_divergence(logits, log_mu, case.sampled).ddot
    head = (hidden.detach() ** 2).sum(-1)
    expected = head * ddot + exact_gram(logits, log_mu, case.sampled, weight)
    torch.testing.assert_close(torch.tensor(predicted, dtype=torch.float64), expected, **TOL)


def test_a_bf16_weight_is_read_as_it_is_in_float32():
    """The weight is converted block by block (never copied whole): the terms equal those of the
    same (bf16-representable) weight handed over in float32."""
    case = make_case(4, n=6, vocab=30, k=4)
    g = torch.Generator().manual_seed(3)
    weight = torch.randn(30, 4, generator=g).to(torch.bfloat16)
    hidden = torch.randn(6, 4, generator=g)
    args = (case.sampled, case.topk_ids, case.topk_logp.float(), case.mu_logp.float())
    logits = case.logits.float()
    from_bf16 = kernel_terms(logits, hidden, weight, *args, vocab_block=8)
    from_f32 = kernel_terms(logits, hidden, weight.float(), *args)
    # float32 throughout; only the summation order differs
    torch.testing.assert_close(from_bf16.gram, from_f32.gram, rtol=1e-5, atol=1e-6)
