"""One chunked pass over the policy's logits: everything the trust-region math needs from ``[N, V]``.

Why a custom autograd function: the statistics need the log-sum-exp, ``pi`` at ``K+1`` ids and
sums of ``pi**2`` (and ``pi**3``) over the tail, in at least float32, from bf16 logits. Computing them
with plain torch ops would materialise ``[N, V]`` float32 copies (log-softmax, probabilities) for the
forward *and* keep them for the backward. Here rows are processed in chunks: the only extra memory is
two ``[chunk, V]`` float32 buffers plus ``O(N * (K+1))``, and the backward recomputes each chunk's
``pi = exp(z - lse)`` from the saved log-sum-exp, as a fused cross-entropy kernel would.

``logp_sampled`` (the log-probability of the sampled token) always carries a gradient. On request
(a recipe's ``needs``) two more outputs do, still without an ``[N, V]`` copy:

- ``entropy=True``: ``H = -sum_j pi_j log pi_j`` per row, with ``dH/dz_j = -pi_j (log pi_j + H)``;
- ``support_grad=True``: ``log pi`` at the support ids (``d log pi_s / dz = e_s - pi``) and the
  tail's mass ``T = sum_{j not in S} pi_j`` (``dT/dz_j = pi_j (1[j not in S] - T)``).

Every other output is a detached statistic. The backward adds all requested terms in one float32
chunk buffer: a dense part ``pi_j (c - g_H z_j)`` (``c`` per row, from every output's upstream
gradient; ``log pi_j = z_j - lse``) plus sparse corrections at the sampled and support ids.

The same outputs, with the same gradients, come from two fused kernels whenever they can
(``fused_kernels``): float32 or lower precision logits and no ``chunk_size`` given (a chunk size
asks for this chunked pass, whose knob it is), and
- on a GPU with Triton installed, Triton kernels (``triton_pass``: one read of the logits
  forward, one read and one write backward);
- on a CPU from ``compiled_pass.MIN_VOCAB`` columns on, with a C++ compiler, kernels compiled by
  torch's inductor (``compiled_pass``: one loop nest per row forward, one sweep backward). Where
  compiling fails the pass falls back to its chunks (warned once per process).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import torch

from .pass_terms import compute_dtype, first_slots, upstream

# Elements of the float32 chunk buffer, by device type. Every chunk costs a fixed number of
# kernels (about ten in the forward, four in the backward), whatever its size:
# - CPU: a chunk's two float32 buffers (the logits' copy and log pi) must stay in a core's L2
#   cache (1-2 MB on current server cores), because every statistic is one more sweep over the
#   chunk: 2**18 elements (one row at Qwen3's vocabulary) against 2**19 (three rows, 3.6 MB),
#   measured on a 2 MB-L2 Xeon: one row takes 0.65-0.95 of the time per sweep of three (the
#   EPYC it was set on: 2**19 had beaten 2**21 by ~15 %);
# - GPU: a chunk must be big enough that its kernels run far longer than they take to launch
#   (~5 us each). 2**26 elements (256 MiB of float32, 441 rows at V = 151,936) is one ~60 us
#   sweep at an H200's ~4.3 TB/s. Measured on an H200 (benchmarks/RESULTS.md): 441 rows took
#   66 ms at 0.81 GB above the gradient, 2048 rows 60 ms at 3.7 GB, 64 rows 118 ms; a GPU runs
#   the fused kernels instead (12 ms), so this is the size of an explicit request for chunks.
CHUNK_ELEMENTS = {"cpu": 2**18, "cuda": 2**26}
# The logits dtypes the fused kernels take (computed in float32, like this pass).
FUSED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


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
    logp_support: torch.Tensor  # [N, M] log pi at the support ids (detached unless support_grad)
    tail_mass: torch.Tensor  # [N] sum of pi over ids NOT in the support (exact; as logp_support)
    tail_sum_sq: torch.Tensor  # [N] sum of pi**2 over the tail
    tail_sum_cube: torch.Tensor | None  # [N] sum of pi**3 over the tail (second order only)
    entropy: torch.Tensor | None = None  # [N] H(pi), differentiable (entropy=True only)


class _ChunkedLogitsPass(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, logits, sampled, support_ids, rows, second_order, entropy, support_grad, kernels
    ):
        # An output nobody differentiated arrives in backward as None, not as zeros: the common
        # case (a gradient on log pi(y) alone) then takes its two-sweep path, and no pass adds
        # zero terms (with zeros materialised, every backward took the general path).
        ctx.set_materialize_grads(False)
        ctx.rows = rows
        ctx.kernels = kernels
        if kernels is not None:
            outputs = _fused_forward(
                ctx, kernels, logits, sampled, support_ids, second_order, entropy, support_grad
            )
            if outputs is not None:
                return outputs
            ctx.kernels = None  # the CPU kernels could not be built: the chunks serve
        n = logits.shape[0]
        cdt = compute_dtype(logits.dtype)
        m = support_ids.shape[1]
        logp_sampled = torch.empty(n, dtype=cdt, device=logits.device)
        logp_support = torch.empty(n, m, dtype=cdt, device=logits.device)
        tail_mass = torch.empty(n, dtype=cdt, device=logits.device)
        tail_sq = torch.empty(n, dtype=cdt, device=logits.device)
        tail_cube = torch.empty(n, dtype=cdt, device=logits.device) if second_order else None
        ent = torch.empty(n, dtype=cdt, device=logits.device) if entropy else None
        # The chunk's logits are copied into the compute dtype first: on CPU, torch's softmax
        # family reading bf16 with ``dtype=float32`` runs 1.4-2 times slower than a vectorised
        # copy plus the float32 kernel (measured on an AMX Xeon). With the entropy that buffer
        # then takes pi (never the caller's logits). Both buffers are allocated once: a fresh
        # ``[rows, V]`` per chunk costs its page faults.
        copy = logits.dtype != cdt
        shape = (min(rows, n), logits.shape[1])
        logp_buffer = logits.new_empty(shape, dtype=cdt)
        buffer = logits.new_empty(shape, dtype=cdt) if copy or entropy else None
        for start in range(0, n, rows):
            stop = min(start + rows, n)
            ids = support_ids[start:stop]
            z = buffer[: stop - start].copy_(logits[start:stop]) if copy else logits[start:stop]
            logp = torch.log_softmax(z, dim=-1, out=logp_buffer[: stop - start])
            logp_support[start:stop] = logp.gather(1, ids)
            logp_sampled[start:stop] = logp.gather(1, sampled[start:stop, None]).squeeze(1)
            # log pi is still needed with the entropy: exponentiate into the buffer (z is done).
            probs = torch.exp(logp, out=buffer[: stop - start]) if entropy else logp.exp_()
            # Zero the support in place: what is left is exactly the tail (no 1 - sum cancellation).
            probs.scatter_(1, ids, 0.0)
            tail_mass[start:stop] = probs.sum(dim=-1)
            _row_dots(probs, probs, out=tail_sq[start:stop])
            if entropy:  # the tail's part of sum pi log pi; the support's is added below
                _row_dots(probs, logp, out=ent[start:stop])
            if second_order:
                tail_cube[start:stop] = torch.linalg.vector_norm(probs, 3, dim=-1).pow(3)
        # A row with logits at -inf (a padded vocabulary) has pi log pi = 0 * -inf in its dot:
        # its tail part is taken again with 0 there, and its backward zeroes those entries.
        ctx.padded_rows = None
        if entropy:
            padded = torch.isnan(ent)
            if padded.any():
                for block in padded.nonzero().squeeze(1).split(rows):  # a chunk's worth at a time
                    ent[block] = _tail_p_log_p(logits[block], support_ids[block], cdt)
                ctx.padded_rows = padded
            ent.add_(_support_p_log_p(logp_support, support_ids)).neg_()
        # log pi_j = z_j - lse: every backward rebuilds pi_j = exp(z_j - lse) from it (from z_y,
        # exact), which is cheaper than a softmax's two reductions.
        lse = logits.gather(1, sampled[:, None]).squeeze(1).to(cdt) - logp_sampled
        lost = ~torch.isfinite(lse)  # a sampled id at -inf: that row's lse in full (rare)
        if lost.any():
            lse[lost] = torch.logsumexp(logits[lost].to(cdt), dim=-1)
        ctx.save_for_backward(logits, sampled, support_ids, tail_mass, ent, lse)
        detached = [tail_sq] + ([tail_cube] if second_order else [])
        if not support_grad:
            detached += [logp_support, tail_mass]
        ctx.mark_non_differentiable(*detached)
        return logp_sampled, logp_support, tail_mass, tail_sq, tail_cube, ent

    @staticmethod
    def backward(ctx, grad_logp, grad_support, grad_tail, _sq, _cube, grad_entropy):
        logits, sampled, support_ids, tail_mass, ent, lse = ctx.saved_tensors
        nothing = (None,) * 7
        grads = (grad_logp, grad_support, grad_tail, grad_entropy)
        if all(g is None for g in grads):
            return (None, *nothing)
        if ctx.kernels is not None:
            args = (logits, sampled, support_ids, lse, tail_mass, ent)
            grad_logits = ctx.kernels.backward(*args, *grads, padded=ctx.padded_rows)
            if grad_logits is not None:  # None: the CPU kernel could not be built
                return (grad_logits, *nothing)
        if grad_support is None and grad_tail is None and grad_entropy is None:
            return (_sampled_only_backward(logits, sampled, lse, grad_logp, ctx.rows), *nothing)
        cdt = compute_dtype(logits.dtype)
        g_y, g_s, g_t, g_h, coef = upstream(
            grad_logp, grad_support, grad_tail, grad_entropy, tail_mass, ent, lse, logits
        )
        n = logits.shape[0]
        grad_logits = torch.empty_like(logits)
        shape = (min(ctx.rows, n), logits.shape[1])
        buffer = logits.new_empty(shape, dtype=cdt)
        z_buffer = logits.new_empty(shape, dtype=cdt) if g_h is not None else None
        # Only chunks where some row has an entropy gradient pay the entropy's dense term (the
        # logits in the compute dtype beside pi, two more sweeps); the others take the plain
        # ``pi_j c`` sweep, exact for them. A recipe whose entropy term acts on some tokens only
        # (``ent-bonus``: the masked ones) pays on those only.
        entropic = _chunks_with(g_h, n, ctx.rows)
        padded = _chunks_with(ctx.padded_rows, n, ctx.rows)
        for chunk, start in enumerate(range(0, n, ctx.rows)):
            stop = min(start + ctx.rows, n)
            ids = support_ids[start:stop]
            if entropic[chunk]:
                # pi_j (c - g_H z_j): z in the compute dtype, pi = exp(z - lse) beside it.
                # (Fused alternatives, an addcmul (broadcast or reading the bf16 logits) or a
                # multiply writing the bf16 gradient, measured slower on CPU: they leave torch's
                # vectorised loops; a broadcast addcmul took 3x a multiply and an add.)
                grad = z_buffer[: stop - start].copy_(logits[start:stop])
                probs = _probs(grad, lse[start:stop], buffer)
                pi_s = probs.gather(1, ids)
                if padded[chunk]:  # z = -inf where pi = 0: the term is 0 there, not inf * 0
                    grad.masked_fill_(probs == 0, 0.0)
                grad.mul_(-g_h[start:stop, None]).add_(coef[start:stop, None]).mul_(probs)
            else:
                grad = _probs(logits[start:stop], lse[start:stop], buffer)
                pi_s = grad.gather(1, ids)
                grad.mul_(coef[start:stop, None])
            if g_t is not None:
                # The tail's dT/dz_j has pi_j only off the support: take g_T pi_j back at each
                # support id once (scatter_, not scatter_add_: duplicate ids write one value).
                at_s = grad.gather(1, ids) - g_t[start:stop, None] * pi_s
                grad.scatter_(1, ids, at_s)
            grad.scatter_add_(1, sampled[start:stop, None], g_y[start:stop, None])
            if g_s is not None:
                grad.scatter_add_(1, ids, g_s[start:stop])
            grad_logits[start:stop] = grad
        return (grad_logits, *nothing)


def _chunks_with(values: torch.Tensor | None, n: int, rows: int) -> list[bool]:
    """Per chunk of ``rows`` rows (of ``n``): whether any row's entry of ``values [n]`` is
    nonzero (None: no chunk)."""
    n_chunks = -(-n // rows)
    if values is None:
        return [False] * n_chunks
    live = torch.zeros(n_chunks * rows, dtype=torch.bool, device=values.device)
    live[:n] = values != 0
    return live.view(n_chunks, rows).any(-1).tolist()


def _fused_forward(ctx, kernels, logits, sampled, support_ids, second_order, entropy, support_grad):
    """The forward by ``kernels`` (``triton_pass`` or ``compiled_pass``), or None where the
    compiled CPU kernels could not be built."""
    if logits.stride(-1) != 1:  # the kernels read each row as one contiguous run (rows may
        logits = logits.contiguous()  # be strided: each kernel takes its tensors' row strides)
    outputs = kernels.statistics(logits, sampled, support_ids, second_order, entropy)
    if outputs is None:
        return None
    logp_sampled, logp_support, tail_mass, tail_sq, tail_cube, ent, lse, padded = outputs
    ctx.padded_rows = padded
    ctx.save_for_backward(logits, sampled, support_ids, tail_mass, ent, lse)
    detached = [tail_sq] + ([tail_cube] if second_order else [])
    if not support_grad:
        detached += [logp_support, tail_mass]
    ctx.mark_non_differentiable(*detached)
    return logp_sampled, logp_support, tail_mass, tail_sq, tail_cube, ent


def fused_kernels(logits: torch.Tensor, chunk_size: int | None):
    """The module whose fused kernels ``chunked_logits_pass`` runs (``triton_pass`` or
    ``compiled_pass``), or None for the chunks (see the module docstring)."""
    if logits.dtype not in FUSED_DTYPES or chunk_size is not None:
        return None
    if logits.is_cuda:
        if importlib.util.find_spec("triton") is None:
            return None
        from . import triton_pass

        return triton_pass
    from . import compiled_pass

    cpu = logits.device.type == "cpu"
    if cpu and logits.shape[-1] >= compiled_pass.MIN_VOCAB and compiled_pass.available():
        return compiled_pass
    return None


def _row_dots(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out[i] = <a[i], b[i]>`` for a chunk's rows. On CPU a BLAS dot per row (a chunk holds one
    row): ``vecdot`` multiplies into a ``[rows, V]`` temporary first (measured at 3 rows of
    151,936: 350 us against 207), a squared ``vector_norm`` takes twice a dot's time and a 2-row
    ``mv`` (pi^2 and pi log pi at once) more than two dots. Elsewhere ``vecdot`` (a GPU chunk has
    hundreds of rows)."""
    if a.device.type != "cpu":
        return torch.linalg.vecdot(a, b, out=out)
    for row in range(a.shape[0]):
        torch.dot(a[row], b[row], out=out[row])
    return out


def _tail_p_log_p(logits: torch.Tensor, support_ids: torch.Tensor, cdt) -> torch.Tensor:
    """``sum pi_j log pi_j`` over each row's tail, 0 where ``pi_j`` is 0 (a logit at -inf)."""
    logp = torch.log_softmax(logits.to(cdt), -1)
    terms = torch.where(logp > float("-inf"), logp.exp() * logp, 0.0)
    return terms.scatter_(1, support_ids, 0.0).sum(-1)


def _support_p_log_p(logp_support: torch.Tensor, support_ids: torch.Tensor) -> torch.Tensor:
    """``sum pi_s log pi_s`` over each row's distinct support ids (a duplicate slot counts once)."""
    terms = torch.special.xlogy(logp_support.exp(), logp_support.exp())
    return terms.where(first_slots(support_ids), 0.0).sum(-1)


def _probs(z: torch.Tensor, lse: torch.Tensor, buffer: torch.Tensor) -> torch.Tensor:
    """``pi = exp(z - lse)`` for a chunk's rows, in ``buffer`` (compute dtype): a copy (or the
    subtraction itself, for logits already in the compute dtype), a subtraction and an exp, each
    one vectorised sweep; torch's softmax from bf16 measured about twice as slow on CPU."""
    out = buffer[: z.shape[0]]
    if z.dtype == out.dtype:
        torch.sub(z, lse[:, None], out=out)
    else:
        out.copy_(z).sub_(lse[:, None])
    return out.exp_()


def _sampled_only_backward(logits, sampled, lse, grad_logp, rows):
    """The common case: only log pi(y) received a gradient, ``-g (pi - e_y)``."""
    grad_logits = torch.empty_like(logits)
    cdt = compute_dtype(logits.dtype)
    grad_logp = grad_logp.to(cdt)
    buffer = logits.new_empty((min(rows, logits.shape[0]), logits.shape[1]), dtype=cdt)
    for start in range(0, logits.shape[0], rows):
        stop = min(start + rows, logits.shape[0])
        probs = _probs(logits[start:stop], lse[start:stop], buffer)
        probs.scatter_add_(1, sampled[start:stop, None], probs.new_full((stop - start, 1), -1.0))
        # In place, then one converting copy: a multiply that writes the bf16 gradient directly
        # leaves torch's vectorised loops (measured 1.1-1.5 times slower).
        grad_logits[start:stop] = probs.mul_(-grad_logp[start:stop, None])
    return grad_logits


def chunked_logits_pass(
    logits: torch.Tensor,
    sampled: torch.Tensor,
    support_ids: torch.Tensor,
    *,
    chunk_size: int | None = None,
    second_order: bool = False,
    entropy: bool = False,
    support_grad: bool = False,
) -> LogitsPass:
    """Run the pass on flat inputs: ``logits [N, V]``, ``sampled [N]``, ``support_ids [N, M]``.

    Every support id must be a real vocabulary id; duplicates are allowed (a duplicate of an id
    already in the support zeroes nothing new), which is how invalid slots are neutralised; with
    ``support_grad`` a duplicate slot's log-prob is differentiable like the first one's.
    """
    rows = rows_per_chunk(logits.shape[-1], chunk_size, logits.device)
    kernels = fused_kernels(logits, chunk_size)
    out = _ChunkedLogitsPass.apply(
        logits, sampled, support_ids, rows, second_order, entropy, support_grad, kernels
    )
    return LogitsPass(*out)
