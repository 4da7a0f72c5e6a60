"""The logits pass on vocabulary-parallel logits: each rank of a tensor-parallel group holds
``V / TP`` columns of every row (Megatron's output layer), and the pass returns on every rank
exactly what ``logits_pass.chunked_logits_pass`` returns on the full ``[N, V]`` logits.

Forward, per rank: the shard's own statistics by the same engines as the full pass (the Triton
kernels on a GPU, the inductor-compiled kernels on a CPU from ``compiled_pass.MIN_VOCAB`` columns
per shard, the chunks otherwise), each relative to the shard's own log-sum-exp ``lse_r``; then
two collectives per call, whatever the statistics asked for:

1. MAX of ``lse_r`` (one ``[N]`` tensor): the row's shift ``m``;
2. SUM of one packed ``[N, 5 + M + 1]`` tensor: ``w_r = exp(lse_r - m)`` and the shard's tail
   sums scaled by ``w_r``, ``w_r**2``, ``w_r**3``, its entropy term, and the logits at the sampled
   and support ids, each from the rank that owns the id (0 from the others: adding 0 is exact).

With ``S = sum_r w_r``: ``lse = m + log S``, the tail's sums ``sum_r w_r^k t_r / S^k``, the entropy
``sum_r w_r (H_r - (lse_r - m)) / S + log S``, ``log pi`` at an id ``z - lse``. The tail is summed
directly on each shard, never as ``1 - sum over the support``.

Ids a rank does not own: the per-shard engines take only real local ids, and a support id they see
is left out of the shard's tail. So a rank hands them, for each slot it does not own, a copy of a
support id it does own (a duplicate excludes nothing new); a row with none at all gets local
column 0 in every slot, and that column's ``pi``, ``pi**2``, ``pi**3`` go back into the shard's tail
(sums of positive terms: no cancellation).

Backward: **the outputs are replicated** (equal on every rank of the group), and so is the loss
built from them, as Megatron's and verl's losses are on a tensor-parallel group. Each rank then
receives the same upstream gradients and computes its own shard of the exact gradient, the full
pass's terms (``pi_j (c - g_H z_j)`` plus the sparse entries at the ids it owns) with the global
``lse``, tail mass and entropy, with no collective. An all-reduce whose backward sums the ranks'
gradients (``torch.distributed.nn``) would return ``TP`` times the gradient of such a loss, and
Megatron's reduce with an identity backward a wrong one for these statistics, where ``lse``
enters both the reduced and the local terms (measured on gloo at TP 2: off by 0.12 and 0.52).
A loss that is *not* the same on every rank (say, each rank a different share of the rows) must
be summed over the group first.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from pdmask.trust_region.logits_pass import (
    LogitsPass,
    chunked_logits_pass,
    fused_kernels,
    rows_per_chunk,
)
from pdmask.trust_region.pass_terms import compute_dtype, sparse_entries, upstream

# Columns of the packed SUM before the sampled and support logits: S's terms and the four
# scaled tail and entropy sums (the cube's column is 0 unless second-order statistics are asked).
_SUMS = 5


@dataclass(frozen=True)
class VocabShard:
    """Which columns of the vocabulary this rank's logits hold, and its tensor-parallel group."""

    group: dist.ProcessGroup | None  # None: the default group
    start: int  # the first global id of this rank's columns
    vocab_size: int  # the padded vocabulary's width over the whole group

    @classmethod
    def of(cls, width: int, group: dist.ProcessGroup | None = None) -> VocabShard:
        """Megatron's split (``VocabUtility.vocab_range_from_per_partition_vocab_size``): rank
        ``r`` of the group holds the ``width`` columns from ``r * width``."""
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        return cls(group=group, start=rank * width, vocab_size=width * world)


def _local(ids: torch.Tensor, start: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Global ids as local columns, and whether this rank owns each."""
    local = ids.long() - start
    return local, (local >= 0) & (local < width)


def _safe_ids(local_sampled, owns_sampled, local_support, owns_support):
    """Local ids the per-shard engines accept (see the module docstring), and the rows that own
    no support id (their column 0 goes back into the tail)."""
    has_support = owns_support.any(1)
    first = owns_support.int().argmax(1, keepdim=True)  # the first owned slot (0 where none)
    stand_in = torch.where(has_support, local_support.gather(1, first).squeeze(1), 0)
    safe_support = torch.where(owns_support, local_support, stand_in[:, None])
    safe_sampled = torch.where(owns_sampled, local_sampled, stand_in)
    return safe_sampled, safe_support, ~has_support


@torch.no_grad()
def _shard_statistics(logits, sampled, support_ids, rows, second_order, entropy, kernels):
    """The shard's ``(tail, tail_sq, tail_cube, entropy, lse, padded, kernels)`` relative to its
    own normaliser, by the fused kernels where they run (``kernels`` None after: they could not
    be built), else by the chunked pass."""
    if kernels is not None:
        outputs = kernels.statistics(logits, sampled, support_ids, second_order, entropy)
        if outputs is not None:
            _, _, tail, sq, cube, ent, lse, padded = outputs
            return tail, sq, cube, ent, lse, padded, kernels
    out = chunked_logits_pass(
        logits, sampled, support_ids, chunk_size=rows, second_order=second_order, entropy=entropy
    )
    # lse = z - log pi at the gathered id with the largest logit: the least rounding in log pi
    at = torch.cat([support_ids, sampled[:, None]], 1)
    cdt = compute_dtype(logits.dtype)
    z_at = logits.gather(1, at).to(cdt)
    logp_at = torch.cat([out.logp_support, out.logp_sampled[:, None]], 1)
    best = z_at.argmax(1, keepdim=True)
    lse = (z_at.gather(1, best) - logp_at.gather(1, best)).squeeze(1)
    lost = ~torch.isfinite(lse)  # every gathered logit at -inf: that row in full (rare)
    if lost.any():
        lse[lost] = torch.logsumexp(logits[lost].to(cdt), -1)
    return out.tail_mass, out.tail_sum_sq, out.tail_sum_cube, out.entropy, lse, None, None


def _give_back_stand_in(logits, lse, rows_without, tail, sq, cube):
    """Column 0 of the rows that own no support id was handed to the engines as their support:
    its ``pi``, ``pi**2``, ``pi**3`` belong to the shard's tail."""
    if not rows_without.any():
        return
    p = torch.exp(logits[rows_without, 0].to(lse.dtype) - lse[rows_without])
    tail[rows_without] += p
    sq[rows_without] += p * p
    if cube is not None:
        cube[rows_without] += p * p * p


def _flat_write(grad: torch.Tensor, at: torch.Tensor, value: torch.Tensor) -> None:
    """``grad[i, at[i, k]] = value[i, k]`` on a fresh contiguous gradient, as one indexed write
    (a row-wise ``scatter_`` on a wide CPU tensor is far slower: ``compiled_pass.backward``)."""
    rows = torch.arange(grad.shape[0], device=grad.device)[:, None] * grad.stride(0)
    grad.view(-1)[(rows + at).reshape(-1)] = value.to(grad.dtype).reshape(-1)


def _chunked_dense(logits, lse, coef, g_h, rows):
    """``pi_j (c - g_H z_j)`` (0 where ``pi_j`` is 0) in the logits' dtype, a chunk of rows at a
    time in the compute dtype: the chunked pass's dense term."""
    n, cdt = logits.shape[0], lse.dtype
    grad = torch.empty_like(logits)
    for start in range(0, n, rows):
        stop = min(start + rows, n)
        z = logits[start:stop].to(cdt)
        p = torch.exp(z - lse[start:stop, None])
        dense = coef[start:stop, None]
        if g_h is not None:  # z = -inf where pi = 0: the term is 0 there, not inf * 0
            dense = dense - g_h[start:stop, None] * torch.where(p > 0, z, 0.0)
        grad[start:stop] = p * dense
    return grad


class _VocabParallelPass(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, logits, sampled, support_ids, shard, rows, second_order, entropy, support_grad, kernels
    ):
        ctx.set_materialize_grads(False)  # as the full pass: an unused output's gradient is None
        n, width = logits.shape
        cdt = compute_dtype(logits.dtype)
        local_y, owns_y = _local(sampled, shard.start, width)
        local_s, owns_s = _local(support_ids, shard.start, width)
        safe_y, safe_s, rows_without = _safe_ids(local_y, owns_y, local_s, owns_s)
        stats = _shard_statistics(logits, safe_y, safe_s, rows, second_order, entropy, kernels)
        tail, sq, cube, ent, lse_r, padded, kernels = stats
        tail, sq, lse_r = tail.to(cdt), sq.to(cdt), lse_r.to(cdt)
        cube = None if cube is None else cube.to(cdt)
        _give_back_stand_in(logits, lse_r, rows_without, tail, sq, cube)

        peak = lse_r.clone()
        dist.all_reduce(peak, dist.ReduceOp.MAX, group=shard.group)
        shift = peak.clamp_min(torch.finfo(cdt).min)  # a row at -inf on every rank stays finite
        w = torch.exp(lse_r - shift)
        alive = w > 0  # a shard row all at -inf has no statistics (0 / 0): it adds nothing
        packed = torch.zeros(n, _SUMS + support_ids.shape[1] + 1, dtype=cdt, device=logits.device)
        packed[:, 0] = w
        packed[:, 1] = torch.where(alive, w * tail, 0.0)
        packed[:, 2] = torch.where(alive, w * w * sq, 0.0)
        if cube is not None:
            packed[:, 3] = torch.where(alive, w * w * w * cube, 0.0)
        if ent is not None:
            packed[:, 4] = torch.where(alive, w * (ent.to(cdt) - (lse_r - shift)), 0.0)
        z_s = logits.gather(1, safe_s).to(cdt)
        z_y = logits.gather(1, safe_y[:, None]).squeeze(1).to(cdt)
        packed[:, _SUMS:-1] = torch.where(owns_s, z_s, 0.0)
        packed[:, -1] = torch.where(owns_y, z_y, 0.0)
        dist.all_reduce(packed, dist.ReduceOp.SUM, group=shard.group)

        total = packed[:, 0]
        lse = shift + total.log()
        logp_sampled = packed[:, -1] - lse
        logp_support = packed[:, _SUMS:-1] - lse[:, None]
        tail_mass = packed[:, 1] / total
        tail_sq = packed[:, 2] / total**2
        tail_cube = packed[:, 3] / total**3 if second_order else None
        entropy_out = packed[:, 4] / total + total.log() if entropy else None

        ctx.rows, ctx.kernels, ctx.padded = rows, kernels, padded
        ctx.save_for_backward(logits, safe_y, safe_s, owns_y, owns_s, lse, tail_mass, entropy_out)
        detached = [tail_sq] + ([tail_cube] if second_order else [])
        if not support_grad:
            detached += [logp_support, tail_mass]
        ctx.mark_non_differentiable(*detached)
        return logp_sampled, logp_support, tail_mass, tail_sq, tail_cube, entropy_out

    @staticmethod
    def backward(ctx, grad_logp, grad_support, grad_tail, _sq, _cube, grad_entropy):
        logits, safe_y, safe_s, owns_y, owns_s, lse, tail_mass, ent = ctx.saved_tensors
        nothing = (None,) * 8
        if all(g is None for g in (grad_logp, grad_support, grad_tail, grad_entropy)):
            return (None, *nothing)
        g_y, g_s, g_t, g_h, coef = upstream(
            grad_logp, grad_support, grad_tail, grad_entropy, tail_mass, ent, lse, lse
        )
        grad = _dense(ctx, logits, safe_y, safe_s, lse, tail_mass, ent, coef, g_h)
        # Every entry an engine may have written at the ids it was handed, exactly: the dense
        # term there plus the sparse terms of the ids this rank owns (-1 matches no column).
        at = torch.cat([safe_s, safe_y[:, None]], 1)
        z_at = logits.gather(1, at).to(lse.dtype)
        p_at = torch.exp(z_at - lse[:, None])
        owned_s = torch.where(owns_s, safe_s, -1)
        owned_y = torch.where(owns_y, safe_y, -1)
        value = sparse_entries(at, owned_s, owned_y, p_at, z_at, coef, g_y, g_s, g_t, g_h)
        _flat_write(grad, at, value)
        return (grad, *nothing)


def _dense(ctx, logits, safe_y, safe_s, lse, tail_mass, ent, coef, g_h):
    """The dense term ``pi_j (c - g_H z_j)`` on the shard (entries at the ids it was handed are
    rewritten by the caller). The fused kernels take their upstream gradients, not ``c``: handed
    a sampled-id gradient ``G`` with ``-G + g_H (lse - H) = c`` and nothing else, they compute
    this term (and ``G`` at the sampled id, rewritten)."""
    if ctx.kernels is not None:
        g = -coef if g_h is None else g_h * (lse - ent) - coef
        args = (logits, safe_y, safe_s, lse, tail_mass, ent, g, None, None, g_h)
        grad = ctx.kernels.backward(*args, padded=ctx.padded)
        if grad is not None:  # None: the compiled kernel could not be built
            return grad.contiguous()
    return _chunked_dense(logits, lse, coef, g_h, ctx.rows)


def vocab_parallel_logits_pass(
    logits: torch.Tensor,
    sampled: torch.Tensor,
    support_ids: torch.Tensor,
    shard: VocabShard,
    *,
    chunk_size: int | None = None,
    second_order: bool = False,
    entropy: bool = False,
    support_grad: bool = False,
) -> LogitsPass:
    """``chunked_logits_pass`` on this rank's shard ``logits [N, V / TP]`` of the vocabulary:
    ``sampled [N]`` and ``support_ids [N, M]`` are global ids (on any rank's shard), every
    output is the full vocabulary's, the same on every rank of ``shard.group``, and the backward
    gives this rank's columns of the gradient of a loss that is the same on every rank (see the
    module docstring). Every rank of the group must call it with the same rows."""
    if logits.dim() != 2 or support_ids.shape[0] != logits.shape[0]:
        raise ValueError(
            f"logits {tuple(logits.shape)} must be [N, V/TP] with support_ids "
            f"{tuple(support_ids.shape)} [N, M]"
        )
    width = logits.shape[1]
    if shard.start + width > shard.vocab_size:
        raise ValueError(
            f"a shard of {width} columns from id {shard.start} exceeds the vocabulary's "
            f"{shard.vocab_size}"
        )
    rows = rows_per_chunk(width, chunk_size, logits.device)
    kernels = fused_kernels(logits, chunk_size)
    if kernels is not None and logits.stride(-1) != 1:
        logits = logits.contiguous()  # the kernels read each row as one contiguous run
    out = _VocabParallelPass.apply(
        logits, sampled, support_ids, shard, rows, second_order, entropy, support_grad, kernels
    )
    return LogitsPass(*out)
