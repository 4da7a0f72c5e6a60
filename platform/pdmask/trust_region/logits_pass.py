"""One chunked pass over the policy's logits: everything the trust-region math needs from ``[N, V]``.

Why a custom autograd function: the statistics need the log-sum-exp, ``pi`` at ``K+1`` ids and
sums of ``pi**2`` (and ``pi**3``) over the tail, in at least float32, from bf16 logits. Computing them
with plain torch ops would materialise ``[N, V]`` float32 copies (log-softmax, probabilities) for the
forward *and* keep them for the backward. Here rows are processed in chunks: the only extra memory is
one ``[chunk, V]`` float32 buffer plus ``O(N * (K+1))``, and the backward recomputes each chunk's
softmax, exactly as a fused cross-entropy kernel would.

Only ``logp_sampled`` (the log-probability of the sampled token) carries a gradient; every other
output is a detached statistic.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Elements of the float32 chunk buffer, by device type. Every chunk costs a fixed number of
# kernels (about ten in the forward, four in the backward), whatever its size:
# - CPU: ~2 MB keeps a chunk in the cache, which matters because every statistic is one more
#   sweep over the chunk (measured: 2**19 beats 2**21 by ~15 %);
# - GPU: a chunk must be big enough that its kernels run far longer than they take to launch
#   (~5 us each). 2**26 elements (256 MiB of float32, 441 rows at V = 151,936) is one ~60 us
#   sweep at an H200's ~4.3 TB/s, so launches cost under a tenth, for 256 MiB of memory. Derived,
#   not yet measured: the GPU check's chunk sweep measures it (benchmarks/README.md).
CHUNK_ELEMENTS = {"cpu": 2**19, "cuda": 2**26}


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; everything else is computed in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def rows_per_chunk(
    vocab_size: int, chunk_size: int | None, device: torch.device | str = "cpu"
) -> int:
    """Rows per chunk: ``chunk_size`` when given, else the device type's element budget."""
    if chunk_size is not None:
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        return chunk_size
    elements = CHUNK_ELEMENTS.get(torch.device(device).type, CHUNK_ELEMENTS["cpu"])
    return max(1, elements // max(vocab_size, 1))


@dataclass
class LogitsPass:
    """Per-token results of the chunked pass (flat: ``[N]`` or ``[N, M]``)."""

    logp_sampled: torch.Tensor  # [N] log pi(y), differentiable w.r.t. the logits
    logp_support: torch.Tensor  # [N, M] log pi at the support ids (detached)
    tail_mass: torch.Tensor  # [N] sum of pi over ids NOT in the support (exact, no cancellation)
    tail_sum_sq: torch.Tensor  # [N] sum of pi**2 over the tail
    tail_sum_cube: torch.Tensor | None  # [N] sum of pi**3 over the tail (second order only)


class _ChunkedLogitsPass(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, sampled, support_ids, rows, second_order):
        n = logits.shape[0]
        cdt = compute_dtype(logits.dtype)
        m = support_ids.shape[1]
        logp_sampled = torch.empty(n, dtype=cdt, device=logits.device)
        logp_support = torch.empty(n, m, dtype=cdt, device=logits.device)
        tail_mass = torch.empty(n, dtype=cdt, device=logits.device)
        tail_sq = torch.empty(n, dtype=cdt, device=logits.device)
        tail_cube = torch.empty(n, dtype=cdt, device=logits.device) if second_order else None
        for start in range(0, n, rows):
            stop = min(start + rows, n)
            ids = support_ids[start:stop]
            # One fused kernel reads the low-precision chunk and writes float32 log-probs.
            logp = torch.log_softmax(logits[start:stop], dim=-1, dtype=cdt)
            logp_support[start:stop] = logp.gather(1, ids)
            logp_sampled[start:stop] = logp.gather(1, sampled[start:stop, None]).squeeze(1)
            probs = logp.exp_()
            # Zero the support in place: what is left is exactly the tail (no 1 - sum cancellation).
            probs.scatter_(1, ids, 0.0)
            tail_mass[start:stop] = probs.sum(dim=-1)
            tail_sq[start:stop] = torch.linalg.vector_norm(probs, 2, dim=-1).square()
            if second_order:
                tail_cube[start:stop] = torch.linalg.vector_norm(probs, 3, dim=-1).pow(3)
        ctx.save_for_backward(logits, sampled)
        ctx.rows = rows
        detached = [t for t in (logp_support, tail_mass, tail_sq, tail_cube) if t is not None]
        ctx.mark_non_differentiable(*detached)
        return logp_sampled, logp_support, tail_mass, tail_sq, tail_cube

    @staticmethod
    def backward(ctx, grad_logp, *_unused):
        logits, sampled = ctx.saved_tensors
        if grad_logp is None:
            return None, None, None, None, None
        grad_logits = torch.empty_like(logits)
        cdt = compute_dtype(logits.dtype)
        grad_logp = grad_logp.to(cdt)
        for start in range(0, logits.shape[0], ctx.rows):
            stop = min(start + ctx.rows, logits.shape[0])
            # d log pi_k / d z = e_k - pi: recompute this chunk's softmax (one fused kernel), then
            # write -g (pi - e_k) straight into the gradient's dtype.
            probs = torch.softmax(logits[start:stop], dim=-1, dtype=cdt)
            probs.scatter_add_(
                1, sampled[start:stop, None], probs.new_full((stop - start, 1), -1.0)
            )
            torch.mul(probs, -grad_logp[start:stop, None], out=grad_logits[start:stop])
        return grad_logits, None, None, None, None


def chunked_logits_pass(
    logits: torch.Tensor,
    sampled: torch.Tensor,
    support_ids: torch.Tensor,
    *,
    chunk_size: int | None = None,
    second_order: bool = False,
) -> LogitsPass:
    """Run the pass on flat inputs: ``logits [N, V]``, ``sampled [N]``, ``support_ids [N, M]``.

    Every support id must be a real vocabulary id; duplicates are allowed (a duplicate of an id
    already in the support zeroes nothing new), which is how invalid slots are neutralised.
    """
    rows = rows_per_chunk(logits.shape[-1], chunk_size, logits.device)
    out = _ChunkedLogitsPass.apply(logits, sampled, support_ids, rows, second_order)
    return LogitsPass(*out)
