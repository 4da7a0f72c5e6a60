"""Brute-force float64 references of the shipped baselines, written from their formulas.

Independent of the recipes' code: per row (response) and token, straight from the docstrings'
formulas (CISPO, GSPO, TIS, MIS, Seq-MIS). ``reference_loss`` returns the token-mean loss as a
differentiable function of the float64 logits, so its gradient is the reference gradient, and
the per-token mask for checking the recipes' decisions.
"""

from __future__ import annotations

import torch


def reference_loss(name, logits, sampled, mu_logp, adv, valid, params):
    """(token-mean loss, mask) of baseline ``name`` on padded ``[B, T]`` inputs, in float64.

    ``logits`` ``[B, T, V]`` float64 (differentiable), ``mu_logp`` the behaviour log-prob of
    ``sampled``, ``adv`` per token, ``valid`` the response mask."""
    logp = torch.log_softmax(logits, -1).gather(-1, sampled[..., None]).squeeze(-1)
    mu = mu_logp.double()
    adv = adv.double()
    b, t = valid.shape
    token = torch.zeros(b, t, dtype=torch.float64)
    mask = torch.zeros(b, t, dtype=torch.bool)
    for i in range(b):
        rows = [j for j in range(t) if valid[i, j]]
        log_r = [logp[i, j] - mu[i, j] for j in rows]
        if name in ("gspo", "seq-mis"):
            total = sum(float(x.detach()) for x in log_r)
            if name == "gspo":
                s = torch.exp(torch.tensor(min(total / len(rows), 10.0), dtype=torch.float64))
            else:
                s = torch.exp(torch.tensor(max(min(total, 20.0), -20.0), dtype=torch.float64))
        for j, lr in zip(rows, log_r, strict=True):
            a = adv[i, j]
            r = torch.exp(lr)
            r_value = float(r.detach())
            if name == "cispo":
                low, high = 1 - params["eps_low"], 1 + params["eps_high"]
                weight = min(max(r_value, low), high)
                token[i, j] = -weight * a * logp[i, j]
            elif name == "tis":
                token[i, j] = -min(r_value, params["is_cap"]) * a * logp[i, j]
            elif name == "mis":
                floor = params.get("is_floor")
                dropped = r_value > params["is_cap"] or (floor is not None and r_value < floor)
                mask[i, j] = dropped
                token[i, j] = 0.0 if dropped else -r * a
            elif name == "gspo":
                low, high = 1 - params["eps_low"], 1 + params["eps_high"]
                outside = float(s) < low or float(s) > high
                dropped = outside and float(a) * (float(s) - 1) > 0
                mask[i, j] = dropped
                # value s_i, gradient s_i * grad log pi(y_t)
                token[i, j] = (
                    0.0 if dropped else -a * s * torch.exp(logp[i, j] - logp[i, j].detach())
                )
            elif name == "seq-mis":
                dropped = float(s) > params["is_cap"]
                mask[i, j] = dropped
                token[i, j] = 0.0 if dropped else -s * a * logp[i, j]
            else:
                raise KeyError(name)
    return token.sum() / valid.sum(), mask


def decision_margin(name, logits, sampled, mu_logp, valid, params) -> float:
    """How far (relatively) the closest mask or clip decision is from its threshold: a float32
    computation agrees with the float64 reference when this exceeds its rounding."""
    with torch.no_grad():
        logp = torch.log_softmax(logits.double(), -1).gather(-1, sampled[..., None]).squeeze(-1)
        log_r = torch.where(valid, logp - mu_logp.double(), 0.0)
        if name in ("gspo", "seq-mis"):
            total = log_r.sum(-1)
            values = (total / valid.sum(-1)).exp() if name == "gspo" else total.exp()
        else:
            values = log_r.exp()[valid]
        if name in ("cispo", "gspo"):
            bounds = [1 - params["eps_low"], 1 + params["eps_high"]] + (
                [1.0] if name == "gspo" else []
            )
        else:
            bounds = [params["is_cap"], params.get("is_floor") or 0.0]
        return min(float(((values - c) / c).abs().min()) for c in bounds if c > 0)
