"""The exact full-vocabulary KL and Ddot against a brute-force float64 definition (autograd, fsum)."""

from __future__ import annotations

import math

import pytest
import torch

from pdmask.trust_region import exact_divergence


def brute_force(z: torch.Tensor, log_mu: torch.Tensor, k: int) -> tuple[float, float]:
    """KL(mu || softmax(z)) by fsum, and d/d eta KL(mu || softmax(z + eta (e_k - pi))) at 0."""
    z = z.to(torch.float64)
    mu = log_mu.to(torch.float64).exp()
    log_pi = torch.log_softmax(z, -1)
    kl = math.fsum(
        float(m) * (float(lm) - float(lp))
        for m, lm, lp in zip(mu, log_mu.to(torch.float64), log_pi, strict=True)
        if m > 0
    )
    v = torch.nn.functional.one_hot(torch.tensor(k), z.shape[0]).to(torch.float64) - log_pi.exp()
    eta = torch.zeros((), dtype=torch.float64, requires_grad=True)
    moved = torch.log_softmax(z + eta * v, -1)
    kl_eta = torch.where(mu > 0, mu * (log_mu.to(torch.float64) - moved), 0.0).sum()
    (ddot,) = torch.autograd.grad(kl_eta, eta)
    return kl, float(ddot)


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 2e-5)])
def test_exact_divergence_matches_the_definition(dtype, tol):
    g = torch.Generator().manual_seed(0)
    n, vocab = 24, 300
    z = torch.randn(n, vocab, generator=g, dtype=torch.float64) * 2.5
    log_mu = torch.log_softmax(z + torch.randn(n, vocab, generator=g, dtype=torch.float64), -1)
    log_mu[:4, 50:] = -math.inf  # mu with zero mass on most of the vocabulary
    log_mu[:4] = torch.log_softmax(log_mu[:4], -1)
    sampled = torch.multinomial(log_mu.exp(), 1, generator=g).squeeze(-1)
    out = exact_divergence(z.to(dtype), log_mu.to(dtype), sampled)
    assert out.kl.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    for t in range(n):
        kl, ddot = brute_force(z[t].to(dtype), log_mu[t].to(dtype), int(sampled[t]))
        assert out.kl[t].item() == pytest.approx(kl, abs=tol, rel=tol)
        assert out.ddot[t].item() == pytest.approx(ddot, abs=tol, rel=tol)
    assert (out.ddot > 0).any() and (out.ddot < 0).any()  # both signs exercised
