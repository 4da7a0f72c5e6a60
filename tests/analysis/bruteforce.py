"""Float64 full-softmax recomputation of every per-token quantity, one token at a time.

Deliberately naive (Python loops, explicit sets), independent of the math API: the reference the
analysis's vectorised quantities are checked against.
"""

from __future__ import annotations

import math

import torch

from pdmask.analysis.quantities import SECOND_ORDER_ETA


def token_reference(
    z, k, topk_ids, topk_logprobs, mu_full_logprobs, mu_logp, advantage=0.0
) -> dict[str, float]:
    """Every quantity of one token from its logits ``z [V]`` and the behaviour's views
    (``advantage``: for pdm-2nd's prediction per unit step, ``2nd``)."""
    z = z.double()
    pi = torch.softmax(z, dim=0)
    n = z.shape[0]
    mu_s: dict[int, float] = {}
    for i, lp in zip(topk_ids.tolist(), topk_logprobs.double().tolist(), strict=True):
        if i >= 0 and math.isfinite(lp) and lp > -1e3:
            mu_s.setdefault(i, math.exp(lp))
    mu_s.setdefault(int(k), math.exp(float(mu_logp)))
    support = sorted(mu_s)
    m = len(support)
    pi_s = {i: float(pi[i]) for i in support}
    mu_tail = max(0.0, 1.0 - sum(mu_s.values()))
    outside = [j for j in range(n) if j not in mu_s]
    pi_tail = sum(float(pi[j]) for j in outside)
    kl = sum(mu_s[i] * math.log(mu_s[i] / pi_s[i]) for i in support)
    if mu_tail > 0:
        kl += mu_tail * math.log(mu_tail / pi_tail)
    pi_k, mu_k = pi_s[int(k)], mu_s[int(k)]
    local = pi_k - mu_k
    global_s = sum(pi_s[i] * (mu_s[i] - pi_s[i]) for i in support)
    tail = mu_tail - pi_tail
    rho = sum(float(pi[j]) ** 2 for j in outside) / pi_tail
    mu_full = mu_full_logprobs.double().exp()
    log_pi = torch.log_softmax(z, dim=0)
    exact = float(pi[k] - mu_full[k]) + float((pi * (mu_full - pi)).sum())
    kl_full = float((mu_full * (mu_full_logprobs.double() - log_pi)).sum())
    # Var(v) of pi with the tail as one token (v = e_k - p over S and the tail bucket)
    lumped = [(pi_s[i], float(i == int(k)) - pi_s[i]) for i in support] + [(pi_tail, -pi_tail)]
    mean_v = sum(p * v for p, v in lumped)
    var_agg = sum(p * (v - mean_v) ** 2 for p, v in lumped)
    agg = local + global_s + pi_tail * tail
    return {
        "kl_topk": kl,
        "ratio": pi_k / mu_k,
        "agg": agg,
        "2nd": agg + 0.5 * SECOND_ORDER_ETA * advantage * var_agg,
        "uni": local + global_s + pi_tail * tail / (n - m),
        "bucket": local + global_s + rho * tail,
        "exact": exact,
        "kl_full": kl_full,
    }


def reference_table(logits, setup, index) -> dict[tuple[int, int], dict[str, float]]:
    """``{(row, position): quantities}`` for every valid token of sequences ``index``."""
    gen = setup.batch.generation
    out = {}
    valid = setup.valid[index]
    for row, seq in enumerate(index.tolist()):
        for pos in range(valid.shape[1]):
            if not valid[row, pos]:
                continue
            out[(row, pos)] = token_reference(
                logits[row, pos],
                gen.responses[seq, pos],
                gen.mu_topk_ids[seq, pos],
                gen.mu_topk_logprobs[seq, pos],
                gen.mu_full_logprobs[seq, pos],
                gen.mu_logp[seq, pos],
                float(setup.advantages[seq, pos]),
            )
    return out


def kl_topk_reference(logits, setup, index) -> dict[tuple[int, int], float]:
    return {key: q["kl_topk"] for key, q in reference_table(logits, setup, index).items()}


def manual_step(trainer, optimizer, setup, index, mask, grad_clip) -> None:
    """One masked update written out by hand: token-mean of ``-(1 - mask) * r * A``."""
    gen = setup.batch.generation
    logits = setup.logits(index)
    log_pi = torch.log_softmax(logits.double(), dim=-1)
    logp = log_pi.gather(-1, gen.responses[index].unsqueeze(-1)).squeeze(-1)
    ratio = (logp - gen.mu_logp[index].double()).exp()
    valid = setup.valid[index]
    per_token = -ratio * setup.advantages[index].double() * (~mask) * valid
    loss = per_token.sum() / valid.sum()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(trainer.parameters(), grad_clip)
    optimizer.step()
