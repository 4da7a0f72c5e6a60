"""Brute-force float64 reference of the trust-region math: full softmax, Python sets, fsum.

Deliberately naive and independent of the package: one token at a time, the support built as a
Python set, sums with ``math.fsum``, the directional derivatives by autograd on the full softmax.
"""

from __future__ import annotations

import math

import torch

SENTINEL = -1e3


def support_of(k: int, mu_k_logp: float, topk_ids, topk_logp, vocab: int) -> dict[int, float]:
    """{id: log mu} for S = valid, de-duplicated TopK ∪ {k}; k's value is the sampled log-prob."""
    seen: dict[int, float] = {}
    for i, lp in zip(topk_ids, topk_logp, strict=True):
        i, lp = int(i), float(lp)
        if i < 0 or i >= vocab or not math.isfinite(lp) or lp <= SENTINEL or i in seen:
            continue
        seen[i] = lp
    seen[k] = float(mu_k_logp)
    return seen


def _sign(a: float, b: float, scale: float | None = None) -> int:
    """sign(a - b), 0 within a few ulps of scale (the kink convention of the package)."""
    scale = max(abs(a), abs(b)) if scale is None else scale
    if abs(a - b) <= 8 * 2.220446049250313e-16 * scale:
        return 0
    return (a > b) - (a < b)


def token_reference(
    z: torch.Tensor, k: int, mu_k_logp: float, topk_ids, topk_logp
) -> dict[str, float]:
    z = z.to(torch.float64)
    n = z.shape[0]
    pi = torch.softmax(z, -1)
    logpi = torch.log_softmax(z, -1)
    sup = support_of(k, mu_k_logp, topk_ids, topk_logp, n)
    ids = sorted(sup)
    m = len(ids)
    mu_s = {i: math.exp(sup[i]) for i in ids}
    pi_s = {i: float(pi[i]) for i in ids}
    in_s = torch.zeros(n, dtype=torch.bool)
    in_s[ids] = True
    pi_tail = math.fsum(pi[~in_s].tolist())
    tail_sq = math.fsum((pi[~in_s] ** 2).tolist())
    mu_tail = max(0.0, 1.0 - math.fsum(mu_s.values()))

    def xlog(p, lp, lq):
        return 0.0 if p == 0 else p * (lp - lq)

    tiny = torch.finfo(torch.float64).tiny
    kl = math.fsum(xlog(mu_s[i], sup[i], float(logpi[i])) for i in ids)
    kl += xlog(mu_tail, math.log(max(mu_tail, tiny)), math.log(max(pi_tail, tiny)))
    tv = 0.5 * (math.fsum(abs(mu_s[i] - pi_s[i]) for i in ids) + abs(mu_tail - pi_tail))
    pk, mk = float(pi[k]), math.exp(mu_k_logp)
    # log(1 - p) from log p without cancellation when p is close to 1.
    others = torch.ones(n, dtype=torch.bool)
    others[k] = False
    log_rest_pi = float(torch.logsumexp(logpi[others], -1)) if n > 1 else math.log(tiny)
    log_rest_mu = math.log(max(-math.expm1(mu_k_logp), tiny))
    kl_bin = xlog(mk, mu_k_logp, float(logpi[k])) + xlog(
        -math.expm1(mu_k_logp), log_rest_mu, log_rest_pi
    )
    sigma = math.fsum(pi_s[i] * (mu_s[i] - pi_s[i]) for i in ids)
    local = pk - mk
    agg = local + sigma + pi_tail * (mu_tail - pi_tail)
    uni = local + sigma + (pi_tail * (mu_tail - pi_tail) / (n - m) if n > m else 0.0)
    rho = tail_sq / pi_tail if pi_tail > 0 else 0.0
    bucket = local + sigma + rho * (mu_tail - pi_tail)
    s2 = float((pi**2).sum())
    s3 = float((pi**3).sum())
    vbar = pk - s2
    var_v = pk - 2 * pk * pk + s3 - vbar**2
    tail_cube = math.fsum((pi[~in_s] ** 3).tolist())
    # The tail as one token (agg) and as n - m equal tokens (uni): Var(v) of those distributions,
    # v = e_k - p, summed token by token.
    lumped = [pi_s[i] for i in ids] + [pi_tail]
    is_k = [i == k for i in ids] + [False]
    spread = [pi_s[i] for i in ids] + ([pi_tail / (n - m)] * (n - m) if n > m else [])
    spread_k = [i == k for i in ids] + [False] * (n - m)
    # The tail bucket's internal variance of pi_j under q_j = pi_j / pi_tail.
    inside = tail_cube / pi_tail - (tail_sq / pi_tail) ** 2 if pi_tail > 0 else 0.0
    # TV derivative along +-v, by the formula with kinks contributing |dpi|.
    v = -pi.clone()
    v[k] += 1
    dpi = pi * (v - vbar)
    dpi_tail = float(dpi[~in_s].sum())
    smooth, kink = 0.0, 0.0
    for i in ids:
        sgn = _sign(pi_s[i], mu_s[i])
        smooth += sgn * float(dpi[i])
        kink += abs(float(dpi[i])) if sgn == 0 else 0.0
    sgn_t = _sign(pi_tail, mu_tail, 1.0)
    smooth += sgn_t * dpi_tail
    kink += abs(dpi_tail) if sgn_t == 0 else 0.0
    return {
        "logp": float(logpi[k]),
        "ratio": math.exp(float(logpi[k]) - mu_k_logp),
        "kl_topk": kl,
        "tv_topk": tv,
        "kl_binary": kl_bin,
        "tv_binary": abs(pk - mk),
        "local_term": local,
        "ddot_agg": agg,
        "ddot_uni": uni,
        "ddot_bucket": bucket,
        "global_agg": agg - local,
        "mu_tail": mu_tail,
        "pi_tail": pi_tail,
        "mu_topk_mass": math.fsum(mu_s.values()),
        "pi_topk_mass": math.fsum(pi_s.values()),
        "support_size": m,
        "sum_pi_sq": s2,
        "var_v": var_v,
        "tail_sum_cube": tail_cube,
        "var_v_agg": _variance_of_v(lumped, is_k),
        "var_v_uni": _variance_of_v(spread, spread_k),
        "var_v_bucket": var_v - mu_tail * inside,
        "tv_deriv_pos": 0.5 * (smooth + kink),
        "tv_deriv_neg": 0.5 * (-smooth + kink),
    }


def _variance_of_v(p: list[float], is_k: list[bool]) -> float:
    """Var_p(v) with v_i = 1[i = k] - p_i, by its definition, token by token."""
    v = [float(hit) - pi for pi, hit in zip(p, is_k, strict=True)]
    mean = math.fsum(pi * vi for pi, vi in zip(p, v, strict=True))
    return math.fsum(pi * (vi - mean) ** 2 for pi, vi in zip(p, v, strict=True))


def bucketed_kl(z: torch.Tensor, mu_s: dict[int, float], mu_tail: float) -> torch.Tensor:
    """KL_topK(mu || softmax(z)) as a differentiable function of z (for autograd derivatives)."""
    logpi = torch.log_softmax(z, -1)
    ids = torch.tensor(sorted(mu_s))
    mu = torch.tensor([mu_s[i] for i in sorted(mu_s)], dtype=z.dtype)
    out = (mu * (mu.log() - logpi[ids])).sum()
    in_s = torch.zeros(z.shape[0], dtype=torch.bool)
    in_s[ids] = True
    if mu_tail > 0:
        log_pi_tail = torch.logsumexp(logpi[~in_s], -1)
        out = out + mu_tail * (math.log(mu_tail) - log_pi_tail)
    return out


def full_kl(z: torch.Tensor, mu: torch.Tensor) -> torch.Tensor:
    logpi = torch.log_softmax(z, -1)
    return torch.where(mu > 0, mu * (mu.log() - logpi), 0.0).sum()
