r"""The exact own-gradient prediction: what a token's own update does to its ``D_t``, to first order.

A token's update moves the parameters by ``-eta P grad loss_t = eta A r P grad log pi_k`` (``P``:
the optimizer's preconditioner), so ``D_t`` changes by ``eta A r <grad D_t, P grad log pi_k>`` to
first order, through the whole network. Its sign (times ``A``) is the ceiling every direction test
estimates: ``Ddot`` is its lm-head-only, free-logit part, ``kernel_terms`` add the output-embedding
kernel (``pdmask.trust_region.kernel``). Here it is computed exactly, one token at a time (two
backward passes per token through its sequence), which only a small model affords:

- ``own``: ``P = I``, the plain gradient step (SGD);
- ``own-adam``: ``P = diag(1 / (sqrt(v_hat) + eps))`` from the trainer's AdamW state (the share of
  the token's own gradient in the next step; AdamW's momentum carries the earlier minibatches'
  gradients, which are the crowd, not the token). A parameter without optimizer state yet
  contributes nothing.

``D_t`` is the measured top-K KL, built differentiably from the support log-probs the math API
gives on request (``support_log_probs``), so ``grad D_t`` is the gradient of exactly the statistic
the analysis judges by.
"""

from __future__ import annotations

import torch

from pdmask.trust_region.stats import SupportLogProbs

OWN_TESTS = ("own", "own-adam")


def kl_topk_of(support: SupportLogProbs) -> torch.Tensor:
    """``D = sum_S mu_i log(mu_i / pi_i) + mu_tail log(mu_tail / pi_tail)``, differentiable
    through ``support.log_prob`` and ``support.tail_mass`` (the statistics' ``kl_topk``)."""
    mu = support.mu_log_prob.exp()
    on_s = torch.where(support.valid, mu * (support.mu_log_prob - support.log_prob), 0.0)
    mu_tail, pi_tail = support.mu_tail_mass, support.tail_mass
    tiny = torch.finfo(pi_tail.dtype).tiny
    tail = torch.where(
        mu_tail > 0, mu_tail * (mu_tail.clamp_min(tiny).log() - pi_tail.clamp_min(tiny).log()), 0.0
    )
    return on_s.sum(-1) + tail


def adam_preconditioner(optimizer: torch.optim.Optimizer, params) -> list[torch.Tensor | None]:
    """Per parameter ``1 / (sqrt(v_hat) + eps)`` from AdamW's state (None without state)."""
    out: list[torch.Tensor | None] = []
    group_of = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    for p in params:
        state = optimizer.state.get(p, {})
        if "exp_avg_sq" not in state:
            out.append(None)
            continue
        group = group_of[id(p)]
        step = float(state["step"])
        v_hat = state["exp_avg_sq"] / (1 - group["betas"][1] ** step)
        out.append(1.0 / (v_hat.sqrt() + group["eps"]))
    return out


def own_gradient_predictions(
    setup, index: torch.Tensor, where: torch.Tensor
) -> dict[str, torch.Tensor]:
    """``{"own", "own-adam"}``: ``<grad D_t, P grad log pi_k>`` per token of sequences ``index``
    (``[n, R]`` float64) where ``where`` holds, NaN elsewhere."""
    params = [p for p in setup.trainer.parameters() if p.requires_grad]
    adam = adam_preconditioner(setup.optimizer, params)
    out = {name: torch.full(where.shape, torch.nan, dtype=torch.float64) for name in OWN_TESTS}
    for row in where.any(-1).nonzero().flatten().tolist():
        sequence = index[row : row + 1]
        logits = setup.logits(sequence)
        stats = setup.stats(logits, sequence, ("support_log_probs",))
        divergence = kl_topk_of(stats.support)
        for col in where[row].nonzero().flatten().tolist():
            grad_d = torch.autograd.grad(divergence[0, col], params, retain_graph=True)
            grad_l = torch.autograd.grad(stats.logp[0, col], params, retain_graph=True)
            plain = adam_weighted = 0.0
            for gd, gl, scale in zip(grad_d, grad_l, adam, strict=True):
                product = gd.double() * gl.double()
                plain += float(product.sum())
                if scale is not None:
                    adam_weighted += float((product * scale).sum())
            out["own"][row, col] = plain
            out["own-adam"][row, col] = adam_weighted
    return out
