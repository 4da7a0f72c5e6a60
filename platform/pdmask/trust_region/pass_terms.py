"""The terms every logits pass shares: the chunked pass (``logits_pass``) and the fused kernels
(``triton_pass``, ``compiled_pass``) compute the same outputs with the same gradients from these.

``upstream`` turns the outputs' upstream gradients into the dense coefficient ``c`` of the
backward's ``pi_j (c - g_H z_j)`` (``logits_pass``'s docstring has the formulas);
``sparse_entries`` the gradient's exact value at the sampled and support ids; ``first_slots``
which support slots hold their id for the first time (a duplicate slot counts once).
"""

from __future__ import annotations

import torch


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; everything else is computed in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def upstream(grad_logp, grad_support, grad_tail, grad_entropy, tail_mass, ent, lse, like):
    """The outputs' upstream gradients in the compute dtype of ``like`` (a float tensor of the
    rows: ``g_y`` zeros when None, the others None when None) and the dense coefficient ``c`` per
    row: every output's ``-g pi_j`` part (``logits_pass``'s docstring), with the entropy's
    ``-g_H pi_j (log pi_j + H) = pi_j g_H (lse - H) - g_H pi_j z_j``."""
    n, cdt = like.shape[0], compute_dtype(like.dtype)
    g_y = torch.zeros(n, dtype=cdt, device=like.device) if grad_logp is None else grad_logp.to(cdt)
    g_s, g_t, g_h = (
        None if g is None else g.to(cdt) for g in (grad_support, grad_tail, grad_entropy)
    )
    coef = -g_y
    if g_s is not None:
        coef = coef - g_s.sum(-1)
    if g_t is not None:
        coef = coef + g_t * (1 - tail_mass)
    if g_h is not None:
        coef = coef + g_h * (lse - ent)
    return g_y, g_s, g_t, g_h, coef


def sparse_entries(at, support_ids, sampled, p_at, z_at, coef, g_y, g_s, g_t, g_h):
    """The gradient's exact value (compute dtype) at the ids ``at`` [n, P] (the support ids and
    the sampled one), from pi and z there, for a backward that writes the dense term straight
    into the gradient's dtype (the fused kernels'): the dense term ``pi_j (c - g_H z_j)``, ``g_y`` at the
    sampled id, the tail's ``-g_T pi_j`` where ``j`` is in the support, and every support slot's
    ``g_s`` holding ``j``. Equal ids get equal values, so a scatter over duplicates is exact."""
    dense = coef[:, None] if g_h is None else coef[:, None] - g_h[:, None] * z_at
    # 0 where pi is 0 (an id at -inf: g_H z_j is infinite there)
    value = torch.where(p_at > 0, p_at * dense, 0.0) + (at == sampled[:, None]) * g_y[:, None]
    if g_t is not None or g_s is not None:
        same = at[:, :, None] == support_ids[:, None, :]  # [n, P, M]: slot m holds id at[p]
        if g_t is not None:
            value = value - same.any(-1) * g_t[:, None] * p_at
        if g_s is not None:
            value = value + (same * g_s[:, None, :]).sum(-1)
    return value


def first_slots(support_ids: torch.Tensor) -> torch.Tensor:
    """``[N, M]`` bool: each slot that holds its id for the first time in its row (a duplicate
    slot repeats an id already counted)."""
    m = support_ids.shape[1]
    earlier = torch.ones(m, m, dtype=torch.bool, device=support_ids.device).tril(-1)
    return ~((support_ids[:, :, None] == support_ids[:, None, :]) & earlier).any(-1)
