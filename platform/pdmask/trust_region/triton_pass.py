"""The logits pass as two fused Triton kernels: what ``logits_pass`` runs on a GPU.

Why: the chunked pass is a dozen torch kernels per chunk (a float32 log-softmax, gathers, an
exponential, a scatter, three reductions; a softmax, a scatter and a multiply backward), each a
full sweep over the chunk. On an H200 that was 65 ms for 16,384 x 151,936 bf16 logits, 18 times
the memory floor and 10 times verl's fused log-prob (benchmarks/RESULTS.md). Here one program per
row reads its logits once in the forward and once more in the backward, and writes the gradient
once: the least traffic any loss over the logits can make.

Forward (one program per row, float32 throughout): an online log-sum-exp, per lane, of the row's
logits in blocks of ``BLOCK`` columns, and in the same sweep the tail's sums of ``pi``, ``pi**2``
and ``pi**3`` over the ids *not* in the support, rescaled as the running maximum moves, and on
request the entropy's ``E[z]``. A column is in the support when it equals one of the row's ``M``
support ids: the ids, sorted, are walked with the blocks, so a block costs one scalar compare
beyond the ids it holds (a first version compared every id in every block: its forward took 20 ms
where the backward took 2.6). The tail is summed directly, never as ``1 - sum over the support``,
as the chunked pass does. ``log pi`` at the sampled and support ids are the gathered logits minus
the log-sum-exp.

Backward (one program per row and block): the chunked pass's gradient, term for term (see
``logits_pass``): ``pi_j (c - g_H z_j)`` plus ``g_y`` at the sampled id and, when the support's
log-probs or the tail's mass receive a gradient, their sparse terms at the support ids (a scalar
test per id decides whether the block holds it), all in float32 and rounded once into the
logits' dtype. The coefficient ``c`` is computed in the kernel from the upstream gradients: the
backward is one launch, with no torch op on the rows.

Every output of the chunked pass comes from these kernels, the differentiable entropy and support
included, so every recipe runs them on a GPU. ``triton_stats`` shares the forward's sweep
(``_row_sums``) and this backward, and computes the statistics themselves in the same kernel.

This module imports triton: ``logits_pass`` imports it only when the kernels can run.
Status: the two kernels ran on an H200 (benchmarks/RESULTS.md); the one-kernel backward and
``triton_stats`` have run in the interpreter and compiled for Hopper only (GPU-unverified).
``TRITON_INTERPRET=1`` (set before triton is imported) runs both kernels on CPU tensors in
Triton's interpreter, which is how the tests hold them to float64 on machines without a GPU;
``triton_stats.compile_for`` compiles them, with its own, for a GPU architecture without one.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

NAME = "fused"  # how benchmarks and reports name the pass these kernels make
# ``triton_stats`` computes every per-token statistic with this module's sweep and backward (it
# imports this module, never the other way round); ``stats.compute_token_stats`` asks this.
FUSED_STATISTICS = True
BLOCK = 2048  # columns per step: 8 per thread at 8 warps
WARPS = 8
BACKWARD_BLOCK = 4096
# A finite "minus infinity" for the running maxima (exp(-inf - (-inf)) would be NaN); a kernel may
# read no global but a constexpr.
_NEG = tl.constexpr(-1e30)


@triton.jit
def _row_sums(
    base, vocab, sorted_base, m_ids, BLOCK: tl.constexpr, CUBE: tl.constexpr,
    ENTROPY: tl.constexpr,
):  # fmt: skip
    """One row's sweep (``base``: its logits; ``sorted_base``: its ``m_ids`` support ids in
    ascending order): ``(lse, tail, tail_sq, tail_cube, entropy)``, the last two 0 unless asked
    for. Shared by the pass's forward and the fused statistics (``triton_stats``)."""
    # The row's support ids in ascending order, consumed as the blocks pass them: one scalar
    # compare per block, one load per id. Past the last id, a sentinel no block reaches.
    beyond = vocab + BLOCK
    slot = 0
    next_id = tl.load(sorted_base + slot, mask=slot < m_ids, other=beyond)
    lanes = tl.arange(0, BLOCK)
    run_max = tl.full([BLOCK], _NEG, tl.float32)
    total = tl.zeros([BLOCK], tl.float32)  # sum exp(z - run_max), per lane
    tail1 = tl.zeros([BLOCK], tl.float32)  # the same over the tail, and its squares, cubes
    tail2 = tl.zeros([BLOCK], tl.float32)
    tail3 = tl.zeros([BLOCK], tl.float32)
    # sum exp(z - run_max) (z - run_max), per lane: the entropy's E[z], shifted so that it stays of
    # the order of log V (not of |z|) and loses less to the final subtraction
    shifted = tl.zeros([BLOCK], tl.float32)
    for start in range(0, vocab, BLOCK):
        cols = start + lanes
        z = tl.load(base + cols, mask=cols < vocab, other=-float("inf")).to(tl.float32)
        new_max = tl.maximum(run_max, z)
        scale = tl.exp(run_max - new_max)
        e = tl.exp(z - new_max)
        in_support = cols < 0  # all False
        while next_id < start + BLOCK:
            in_support = in_support | (cols == next_id)
            slot += 1
            next_id = tl.load(sorted_base + slot, mask=slot < m_ids, other=beyond)
        et = tl.where(in_support, 0.0, e)
        if ENTROPY:  # z = -inf (past the row's end, or padding): e (z - new_max) is 0 * -inf
            ez = tl.where(e > 0, e * (z - new_max), 0.0)
            shifted = scale * (shifted + (run_max - new_max) * total) + ez
        total = total * scale + e
        tail1 = tail1 * scale + et
        tail2 = tail2 * (scale * scale) + et * et
        if CUBE:
            tail3 = tail3 * (scale * scale * scale) + et * et * et
        run_max = new_max
    row_max = tl.max(run_max, 0)
    w = tl.exp(run_max - row_max)
    s = tl.sum(total * w, 0)
    lse = row_max + tl.log(s)
    tail = tl.sum(tail1 * w, 0) / s
    tail_sq = tl.sum(tail2 * (w * w), 0) / (s * s)
    tail_cube = 0.0
    if CUBE:
        tail_cube = tl.sum(tail3 * (w * w * w), 0) / (s * s * s)
    ent = 0.0
    if ENTROPY:  # H = lse - E[z] = log s - E[z - row_max]
        mean_shifted = tl.sum(w * (shifted + (run_max - row_max) * total), 0) / s
        ent = tl.log(s) - mean_shifted
    return lse, tail, tail_sq, tail_cube, ent


@triton.jit
def _forward(
    logits_ptr, stride, vocab, sampled_ptr, ids_ptr, sorted_ids_ptr, m_ids,
    logp_sampled_ptr, logp_support_ptr, tail_ptr, tail_sq_ptr, tail_cube_ptr, lse_ptr, ent_ptr,
    BLOCK: tl.constexpr, M_PAD: tl.constexpr, CUBE: tl.constexpr, ENTROPY: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * stride
    lse, tail, tail_sq, tail_cube, ent = _row_sums(
        base, vocab, sorted_ids_ptr + row * m_ids, m_ids, BLOCK, CUBE, ENTROPY
    )
    tl.store(lse_ptr + row, lse)
    tl.store(tail_ptr + row, tail)
    tl.store(tail_sq_ptr + row, tail_sq)
    if CUBE:
        tl.store(tail_cube_ptr + row, tail_cube)
    if ENTROPY:
        tl.store(ent_ptr + row, ent)
    y = tl.load(sampled_ptr + row)
    tl.store(logp_sampled_ptr + row, tl.load(base + y).to(tl.float32) - lse)
    slots = tl.arange(0, M_PAD)
    inside = slots < m_ids
    sids = tl.load(ids_ptr + row * m_ids + slots, mask=inside, other=0)
    z_s = tl.load(base + sids, mask=inside, other=0.0).to(tl.float32)
    tl.store(logp_support_ptr + row * m_ids + slots, z_s - lse, mask=inside)


@triton.jit
def _backward(
    logits_ptr, stride, vocab, sampled_ptr, lse_ptr, tail_ptr, ent_ptr, ids_ptr, valid_ptr,
    m_ids, grad_y_ptr, grad_s_ptr, grad_t_ptr, grad_h_ptr, grad_ptr, grad_stride,
    BLOCK: tl.constexpr, M_PAD: tl.constexpr, HAS_Y: tl.constexpr, SUPPORT: tl.constexpr,
    TAIL: tl.constexpr, ENTROPY: tl.constexpr, VALID: tl.constexpr,
):  # fmt: skip
    """Every term of the gradient in one kernel, each entry rounded once: the dense
    ``pi_j (c - g_H z_j)``, ``g_y`` at the sampled id, and at the support ids (a scalar test per
    id and program: only the ids inside this block cost a vector compare) every slot's ``g_s``
    and the tail's ``-g_T pi_j`` once per distinct id. ``c`` is ``pass_terms.upstream``'s
    coefficient, computed here per row. ``VALID``: the slots' ``valid`` flags gate ``g_s`` (the
    fused statistics' invalid slots hold ``-inf``, which no gradient reaches)."""
    row = tl.program_id(0).to(tl.int64)
    start = tl.program_id(1) * BLOCK
    cols = start + tl.arange(0, BLOCK)
    inside = cols < vocab
    z = tl.load(logits_ptr + row * stride + cols, mask=inside, other=0.0).to(tl.float32)
    lse = tl.load(lse_ptr + row)
    p = tl.exp(z - lse)
    slots = tl.arange(0, M_PAD)
    counted = slots < m_ids
    if VALID:
        counted = counted & (tl.load(valid_ptr + row * m_ids + slots, mask=counted, other=0) != 0)
    coef = 0.0
    g_y = 0.0
    if HAS_Y:
        g_y = tl.load(grad_y_ptr + row)
        coef = -g_y
    if SUPPORT:
        g_s = tl.load(grad_s_ptr + row * m_ids + slots, mask=counted, other=0.0)
        coef -= tl.sum(g_s, 0)
    g_t = 0.0
    if TAIL:
        g_t = tl.load(grad_t_ptr + row)
        coef += g_t * (1 - tl.load(tail_ptr + row))
    dense = tl.zeros([BLOCK], tl.float32) + coef
    if ENTROPY:  # a compile-time branch: the kernel without it reads no entropy gradient
        g_h = tl.load(grad_h_ptr + row)
        dense = dense + g_h * (lse - tl.load(ent_ptr + row)) - g_h * z
    grad = tl.where(p > 0, p * dense, 0.0)  # 0 at z = -inf, where g_H z is infinite
    if HAS_Y:
        grad = grad + tl.where(cols == tl.load(sampled_ptr + row), g_y, 0.0)
    if SUPPORT or TAIL:
        on_support = cols < 0  # all False
        for slot in range(0, m_ids):
            sid = tl.load(ids_ptr + row * m_ids + slot)
            if (sid >= start) & (sid < start + BLOCK):
                hit = cols == sid
                on_support = on_support | hit
                if SUPPORT:
                    g = tl.load(grad_s_ptr + row * m_ids + slot)
                    if VALID:
                        g = tl.where(tl.load(valid_ptr + row * m_ids + slot) != 0, g, 0.0)
                    grad = grad + tl.where(hit, g, 0.0)
        if TAIL:  # the tail's dT/dz_j has pi_j only off the support: once per distinct id
            grad = grad - tl.where(on_support, g_t * p, 0.0)
    out = grad_ptr + row * grad_stride + cols
    tl.store(out, grad.to(grad_ptr.dtype.element_ty), mask=inside)


def _m_pad(m: int) -> int:
    return max(1, 1 << (max(m, 1) - 1).bit_length())


def statistics(logits, sampled, support_ids, second_order: bool, entropy: bool):
    """The pass's forward, float32: ``(logp_sampled, logp_support, tail_mass, tail_sq, tail_cube,
    entropy, lse, None)`` for contiguous-row ``logits [N, V]``, ``sampled [N]``, ``support_ids
    [N, M]`` (``tail_cube`` and ``entropy`` None unless asked for; no padded rows to report:
    the kernels guard every entry)."""
    n, vocab = logits.shape
    m = support_ids.shape[1]
    f32 = dict(dtype=torch.float32, device=logits.device)
    logp_sampled, tail, tail_sq, lse = (torch.empty(n, **f32) for _ in range(4))
    logp_support = torch.empty(n, m, **f32)
    tail_cube = torch.empty(n, **f32) if second_order else None
    ent = torch.empty(n, **f32) if entropy else None
    if n:
        ids = support_ids.contiguous().long()
        sorted_ids = torch.sort(ids, dim=1).values  # the kernel walks them with the blocks
        _forward[(n,)](
            logits, logits.stride(0), vocab, sampled.contiguous().long(), ids, sorted_ids, m,
            logp_sampled, logp_support, tail, tail_sq,
            tail_sq if tail_cube is None else tail_cube,  # written only when asked for
            lse, tail_sq if ent is None else ent,
            BLOCK=BLOCK, M_PAD=_m_pad(m), CUBE=second_order, ENTROPY=entropy, num_warps=WARPS,
        )  # fmt: skip
    return logp_sampled, logp_support, tail, tail_sq, tail_cube, ent, lse, None


def backward(
    logits, sampled, support_ids, lse, tail_mass, ent, g_y, g_s, g_t, g_h, padded=None, valid=None
):
    """The gradient of the pass's differentiable outputs, in the logits' dtype (contiguous: the
    logits' rows may be a strided view), from the upstream gradients of ``log pi(y)`` (``g_y``),
    ``log pi`` at the support (``g_s [N, M]``), the tail's mass (``g_t``) and the entropy
    (``g_h``); any may be None (``padded`` is not needed: the kernel guards every entry).
    ``valid [N, M]``: which slots' ``g_s`` count (None: all). The same terms as
    ``logits_pass``'s chunked backward, every one in one kernel (``_backward``): no torch op
    runs on the rows, so the backward is one launch and reads nothing back to the host."""
    n, vocab = logits.shape
    grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
    if not n:
        return grad
    m = 0 if support_ids is None else support_ids.shape[1]
    f32 = [None if g is None else g.float().contiguous() for g in (g_y, g_s, g_t, g_h)]
    given = [g for g in f32 if g is not None]
    anyone = given[0] if given else lse  # a pointer for the absent ones (never read)
    g_y, g_s, g_t, g_h = (anyone if g is None else g for g in f32)
    grid = (n, -(-vocab // BACKWARD_BLOCK))
    _backward[grid](
        logits, logits.stride(0), vocab, sampled.contiguous().long(), lse,
        lse if tail_mass is None else tail_mass, lse if ent is None else ent,
        sampled if support_ids is None else support_ids.contiguous().long(),
        sampled if valid is None else valid.contiguous(), m,
        g_y, g_s, g_t, g_h, grad, grad.stride(0),
        BLOCK=BACKWARD_BLOCK, M_PAD=_m_pad(m), HAS_Y=f32[0] is not None,
        SUPPORT=f32[1] is not None, TAIL=f32[2] is not None, ENTROPY=f32[3] is not None,
        VALID=valid is not None, num_warps=WARPS,
    )  # fmt: skip
    return grad


def sampled_backward(logits, sampled, lse, grad_logp):
    """``backward`` when only ``log pi(y)`` has a gradient: ``g (e_y - pi)``."""
    return backward(logits, sampled, None, lse, None, None, grad_logp, None, None, None)


# Argument types as Triton's compiler takes them (bf16 logits), for ``triton_stats.compile_for``.
_SIGNATURES = {
    "_forward": (
        {
            "logits_ptr": "*bf16", "stride": "i32", "vocab": "i32", "sampled_ptr": "*i64",
            "ids_ptr": "*i64", "sorted_ids_ptr": "*i64", "m_ids": "i32", "logp_sampled_ptr": "*fp32",
            "logp_support_ptr": "*fp32", "tail_ptr": "*fp32", "tail_sq_ptr": "*fp32",
            "tail_cube_ptr": "*fp32", "lse_ptr": "*fp32", "ent_ptr": "*fp32",
            "BLOCK": "constexpr", "M_PAD": "constexpr", "CUBE": "constexpr",
            "ENTROPY": "constexpr",
        },
        {"BLOCK": BLOCK, "M_PAD": 32, "CUBE": True, "ENTROPY": True},
    ),
    "_backward": (
        {
            "logits_ptr": "*bf16", "stride": "i32", "vocab": "i32", "sampled_ptr": "*i64",
            "lse_ptr": "*fp32", "tail_ptr": "*fp32", "ent_ptr": "*fp32", "ids_ptr": "*i64",
            "valid_ptr": "*i1", "m_ids": "i32", "grad_y_ptr": "*fp32", "grad_s_ptr": "*fp32",
            "grad_t_ptr": "*fp32", "grad_h_ptr": "*fp32", "grad_ptr": "*bf16",
            "grad_stride": "i32", "BLOCK": "constexpr", "M_PAD": "constexpr",
            "HAS_Y": "constexpr", "SUPPORT": "constexpr", "TAIL": "constexpr",
            "ENTROPY": "constexpr", "VALID": "constexpr",
        },
        {
            "BLOCK": BACKWARD_BLOCK, "M_PAD": 32, "HAS_Y": True, "SUPPORT": True, "TAIL": True,
            "ENTROPY": True, "VALID": True,
        },
    ),
}  # fmt: skip


def compile_kernels(
    kernels: dict[str, tuple[object, dict, dict]], arch: int = 90, num_warps: int = WARPS
) -> dict[str, list[str]]:
    """Compile jitted kernels, ``{name: (kernel, signature, constexprs)}``, for an NVIDIA GPU of
    compute capability ``arch`` (90: Hopper) on any machine: Triton's compiler and its bundled
    ptxas need no GPU. Triton's CPU interpreter accepts code the compiler refuses (a plain global
    read inside a kernel ran there and failed on an H200), so the tests compile every kernel of
    the project too. Returns the stages each kernel reached (``cubin`` last)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target = GPUTarget("cuda", arch, 32)
    stages = {}
    for name, (kernel, signature, constexprs) in kernels.items():
        source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
        compiled = triton.compile(source, target=target, options={"num_warps": num_warps})
        stages[name] = list(compiled.asm)
    return stages
