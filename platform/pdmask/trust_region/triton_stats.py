"""Every per-token statistic in one Triton kernel forward and one backward: what a GPU runs.

Why: on an H200 (benchmarks/RESULTS.md) the two kernels of ``triton_pass`` took 6.0 ms of
pdm-agg's 11.43 ms at 16,384 x 151,936; the rest was ~470 small kernels on ``[N, K]`` tensors
(the support, its log-probs, the divergences, the directional derivatives) and 35 copies to the
host. Here one program per row builds the row's support from mu's raw top-K (``support``'s
rules: valid, de-duplicated slots, the sampled id once), sweeps the row's logits once
(``triton_pass._row_sums``) and computes every statistic of ``stats.compute_token_stats`` from
registers in its epilogue; the backward is ``triton_pass._backward``, one launch. Nothing is read
back to the host, no shape depends on the data: the pass can be captured in a CUDA graph.

The formulas' home is ``stats.compute_token_stats`` (its docstring and the package's); the
epilogue restates them term for term in Triton, and the tests hold both to the same float64
reference (``tests/trust_region/reference.py``). ``FIELDS`` names the rows of the statistics
buffer in the order the kernel writes them.

What it does not serve (``stats`` runs the pass and torch ops there): ``support="overwrite"``,
vocabulary-parallel shards, float64 logits and an explicit chunk size. An id at or beyond the
logits' width is an invalid slot here (never read); ``support.check_topk_ids`` refuses it where
the ids enter the batch, on the host, so that the pass stays one launch each way.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import triton_pass
from .support import SENTINEL_THRESHOLD
from .triton_pass import BLOCK, WARPS, _m_pad, _row_sums

FIELDS = (
    "mu_logp", "ratio", "kl_topk", "tv_topk", "kl_binary", "tv_binary", "local_term",
    "global_agg", "global_uni", "global_bucket", "ddot_agg", "ddot_uni", "ddot_bucket",
    "tv_deriv_pos", "tv_deriv_neg", "mu_tail", "mu_topk_mass", "pi_topk_mass", "sum_pi_sq",
)  # fmt: skip
"""The detached statistics (``TokenStats`` fields) in the buffer's rows, in the kernel's order."""
SECOND_ORDER_FIELDS = ("tail_sum_cube", "var_v", "var_v_agg", "var_v_uni", "var_v_bucket")
"""The rows after ``FIELDS`` when the second order is asked for."""
_TINY = tl.constexpr(1.1754943508222875e-38)  # float32's smallest normal (stats._safe_log)
_EPS = tl.constexpr(1.1920928955078125e-07)  # float32's eps (stats._sign_beyond_rounding)


@triton.jit
def _expm1(x):
    """``exp(x) - 1`` to a few ulps near 0 (Kahan's: the rounding of ``u = exp(x)`` cancels in
    ``(u - 1) / log u``)."""
    u = tl.exp(x)
    um1 = u - 1.0
    safe = tl.where((u == 1.0) | (um1 == -1.0), 2.0, u)  # no 0/0 in the branch not taken
    return tl.where(u == 1.0, x, tl.where(um1 == -1.0, -1.0, um1 * x / tl.log(safe)))


@triton.jit
def _xlogy_ratio(p, logp, logq):
    """``p (log p - log q)``, 0 where ``p`` is 0."""
    return tl.where(p > 0, p * (logp - logq), 0.0)


@triton.jit
def _safe_log(x):
    return tl.log(tl.maximum(x, _TINY))


@triton.jit
def _sign_beyond_rounding(a, b, scale):
    """sign(a - b), 0 within 8 float32 ulps of ``scale``."""
    d = a - b
    sign = tl.where(d > 0, 1.0, tl.where(d < 0, -1.0, 0.0))
    return tl.where(tl.abs(d) <= 8 * _EPS * scale, 0.0, sign)


@triton.jit
def _variance(pi_k, sq_s, cube_s, tail_sq, tail_cube):
    """``Var_pi(v)`` for ``v = e_k - pi`` given the tail's sums (``stats._second_order``)."""
    mean = pi_k - sq_s - tail_sq
    return tl.maximum(pi_k - 2 * pi_k * pi_k + cube_s + tail_cube - mean * mean, 0.0)


@triton.jit
def _token_stats(
    logits_ptr, stride, vocab, sampled_ptr, mu_k_ptr, top_ids_ptr, top_lp_ptr, k_ids,
    ids_ptr, valid_ptr, mu_lp_ptr, sorted_ptr, logp_s_ptr, logp_ptr, tail_ptr, ent_ptr,
    lse_ptr, size_ptr, out_ptr, n_rows,
    BLOCK: tl.constexpr, M_PAD: tl.constexpr, SENTINEL: tl.constexpr, CUBE: tl.constexpr,
    ENTROPY: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * stride
    m_ids = k_ids + 1
    slots = tl.arange(0, M_PAD)
    inside = slots < m_ids
    y = tl.load(sampled_ptr + row).to(tl.int64)
    mu_k_logp = tl.load(mu_k_ptr + row).to(tl.float32)

    # The support (support.build_support, mode "union"): slots 0..K-1 the valid, de-duplicated
    # top-K, slot K the sampled id unless the top-K holds it; invalid slots hold the sampled id.
    top = slots < k_ids
    tid = tl.load(top_ids_ptr + row * k_ids + slots, mask=top, other=-1).to(tl.int64)
    tlp = tl.load(top_lp_ptr + row * k_ids + slots, mask=top, other=0.0).to(tl.float32)
    ok = top & (tid >= 0) & (tid < vocab) & (tlp > SENTINEL) & (tlp < float("inf"))
    earlier = tl.expand_dims(slots, 0) < tl.expand_dims(slots, 1)  # [i, j]: j before i
    same = tl.expand_dims(tid, 1) == tl.expand_dims(tid, 0)
    repeat = same & earlier & tl.expand_dims(ok, 0)
    ok = ok & (tl.max(repeat.to(tl.int32), 1) == 0)
    is_y = ok & (tid == y)
    y_in_top = tl.max(is_y.to(tl.int32), 0) > 0
    last = slots == k_ids
    valid = ok | (last & ~y_in_top)
    ids = tl.where(valid & ~last, tid, y)
    logmu_s = tl.where(is_y | last, mu_k_logp, tlp)  # mu_k is the sampled id's, also in top-K
    logmu_s = tl.where(valid, logmu_s, -float("inf"))
    size = tl.sum(valid.to(tl.int64), 0)
    row_slots = row * m_ids + slots
    tl.store(ids_ptr + row_slots, ids, mask=inside)
    tl.store(valid_ptr + row_slots, valid, mask=inside)
    tl.store(mu_lp_ptr + row_slots, logmu_s, mask=inside)
    tl.store(size_ptr + row, size)
    # The sweep walks the ids in ascending order: sorted here, read back by this program alone.
    beyond = vocab + BLOCK
    sorted_base = sorted_ptr + row * M_PAD
    tl.store(sorted_base + slots, tl.sort(tl.where(inside, ids, beyond), 0))
    tl.debug_barrier()

    lse, pi_tail, tail_sq, tail_cube, ent = _row_sums(
        base, vocab, sorted_base, m_ids, BLOCK, CUBE, ENTROPY
    )
    tl.store(lse_ptr + row, lse)
    tl.store(tail_ptr + row, pi_tail)
    if ENTROPY:
        tl.store(ent_ptr + row, ent)
    logp = tl.load(base + y).to(tl.float32) - lse
    tl.store(logp_ptr + row, logp)
    z_s = tl.load(base + ids, mask=inside, other=0.0).to(tl.float32)
    logpi_s = tl.where(valid, z_s - lse, -float("inf"))
    tl.store(logp_s_ptr + row_slots, logpi_s, mask=inside)

    # The statistics (stats.compute_token_stats, term for term; invalid slots weigh 0).
    pi_s = tl.exp(logpi_s)
    mu_s = tl.exp(logmu_s)
    mu_mass = tl.sum(mu_s, 0)
    pi_mass = tl.sum(pi_s, 0)
    mu_tail = tl.maximum(1.0 - mu_mass, 0.0)
    mu_tail = tl.where(size >= vocab, 0.0, mu_tail)  # an empty tail holds nothing
    kl_topk = tl.sum(tl.where(valid, _xlogy_ratio(mu_s, logmu_s, logpi_s), 0.0), 0)
    kl_topk += _xlogy_ratio(mu_tail, _safe_log(mu_tail), _safe_log(pi_tail))
    tv_topk = 0.5 * (tl.sum(tl.abs(mu_s - pi_s), 0) + tl.abs(mu_tail - pi_tail))

    pi_k = tl.exp(logp)
    mu_k = tl.exp(mu_k_logp)
    rest_mu = -_expm1(mu_k_logp)
    is_k = ids == y
    pi_rest = pi_tail + tl.sum(tl.where(valid & ~is_k, pi_s, 0.0), 0)
    kl_binary = _xlogy_ratio(mu_k, mu_k_logp, logp)
    kl_binary += _xlogy_ratio(rest_mu, _safe_log(rest_mu), _safe_log(pi_rest))
    tv_binary = tl.abs(pi_k - mu_k)
    ratio = tl.exp(logp - mu_k_logp)

    local = pi_k - mu_k
    sigma = tl.sum(tl.where(valid, pi_s * (mu_s - pi_s), 0.0), 0)
    tail_gap = mu_tail - pi_tail
    unseen = (vocab - size).to(tl.float32)
    global_agg = sigma + pi_tail * tail_gap
    global_uni = sigma + tl.where(unseen > 0, pi_tail * tail_gap / tl.maximum(unseen, 1.0), 0.0)
    rho_tail = tl.where(pi_tail > 0, tail_sq / tl.maximum(pi_tail, _TINY), 0.0)
    global_bucket = sigma + rho_tail * tail_gap

    sum_pi_sq = tl.sum(pi_s * pi_s, 0) + tail_sq
    vbar = pi_k - sum_pi_sq
    dpi_s = tl.where(valid, pi_s * (is_k.to(tl.float32) - pi_s - vbar), 0.0)
    dpi_tail = -tail_sq - pi_tail * vbar
    sign_s = _sign_beyond_rounding(pi_s, mu_s, tl.maximum(pi_s, mu_s))
    sign_tail = _sign_beyond_rounding(pi_tail, mu_tail, 1.0)
    smooth = tl.sum(sign_s * dpi_s, 0) + sign_tail * dpi_tail
    kink = tl.sum(tl.where(valid & (sign_s == 0), tl.abs(dpi_s), 0.0), 0)
    kink += tl.where(sign_tail == 0, tl.abs(dpi_tail), 0.0)

    out = out_ptr + row  # one row of the buffer per statistic, in FIELDS' order
    tl.store(out, mu_k_logp)
    tl.store(out + n_rows, ratio)
    tl.store(out + 2 * n_rows, kl_topk)
    tl.store(out + 3 * n_rows, tv_topk)
    tl.store(out + 4 * n_rows, kl_binary)
    tl.store(out + 5 * n_rows, tv_binary)
    tl.store(out + 6 * n_rows, local)
    tl.store(out + 7 * n_rows, global_agg)
    tl.store(out + 8 * n_rows, global_uni)
    tl.store(out + 9 * n_rows, global_bucket)
    tl.store(out + 10 * n_rows, local + global_agg)
    tl.store(out + 11 * n_rows, local + global_uni)
    tl.store(out + 12 * n_rows, local + global_bucket)
    tl.store(out + 13 * n_rows, 0.5 * (smooth + kink))
    tl.store(out + 14 * n_rows, 0.5 * (-smooth + kink))
    tl.store(out + 15 * n_rows, mu_tail)
    tl.store(out + 16 * n_rows, mu_mass)
    tl.store(out + 17 * n_rows, pi_mass)
    tl.store(out + 18 * n_rows, sum_pi_sq)
    if CUBE:  # SECOND_ORDER_FIELDS
        on_s = tl.where(valid, pi_s, 0.0)
        sq_s = tl.sum(on_s * on_s, 0)
        cube_s = tl.sum(on_s * on_s * on_s, 0)
        var_v = _variance(pi_k, sq_s, cube_s, tail_sq, tail_cube)
        spread = tl.maximum(unseen, 1.0)
        some = unseen > 0
        uni_sq = tl.where(some, pi_tail * pi_tail / spread, 0.0)
        uni_cube = tl.where(some, pi_tail * pi_tail * pi_tail / (spread * spread), 0.0)
        # the tail bucket's own variance of pi_j under q_j = pi_j / pi_tail
        c3_over = tail_cube / tl.maximum(pi_tail, _TINY)
        within = tl.maximum(tl.where(pi_tail > 0, c3_over - rho_tail * rho_tail, 0.0), 0.0)
        tl.store(out + 19 * n_rows, tail_cube)
        tl.store(out + 20 * n_rows, var_v)
        agg = _variance(pi_k, sq_s, cube_s, pi_tail * pi_tail, pi_tail * pi_tail * pi_tail)
        tl.store(out + 21 * n_rows, agg)
        tl.store(out + 22 * n_rows, _variance(pi_k, sq_s, cube_s, uni_sq, uni_cube))
        tl.store(out + 23 * n_rows, var_v - mu_tail * within)


class _FusedTokenStats(torch.autograd.Function):
    """The statistics' autograd node: ``log pi(y)`` differentiable, and on request the entropy
    and the support's log-probs and tail mass; the backward is ``triton_pass.backward``."""

    @staticmethod
    def forward(ctx, logits, sampled, top_ids, top_lp, mu_k, second_order, entropy, support_grad):
        ctx.set_materialize_grads(False)
        n, vocab = logits.shape
        k = 0 if top_ids is None else top_ids.shape[1]
        m = k + 1
        dev = logits.device
        f32 = dict(dtype=torch.float32, device=dev)
        ids = torch.empty(n, m, dtype=torch.long, device=dev)
        valid = torch.empty(n, m, dtype=torch.bool, device=dev)
        mu_lp, logp_s = torch.empty(n, m, **f32), torch.empty(n, m, **f32)
        logp, tail, lse = (torch.empty(n, **f32) for _ in range(3))
        ent = torch.empty(n, **f32) if entropy else None
        size = torch.empty(n, dtype=torch.long, device=dev)
        stats = torch.empty(len(FIELDS) + (len(SECOND_ORDER_FIELDS) if second_order else 0), n, **f32)  # fmt: skip
        if n:
            sorted_ids = torch.empty(n, _m_pad(m), dtype=torch.long, device=dev)  # scratch
            _token_stats[(n,)](
                logits, logits.stride(0), vocab, sampled, mu_k,
                sampled if top_ids is None else top_ids, mu_k if top_lp is None else top_lp, k,
                ids, valid, mu_lp, sorted_ids, logp_s, logp, tail, lse if ent is None else ent,
                lse, size, stats, n,
                BLOCK=BLOCK, M_PAD=_m_pad(m), SENTINEL=SENTINEL_THRESHOLD, CUBE=second_order,
                ENTROPY=entropy, num_warps=WARPS,
            )  # fmt: skip
        ctx.save_for_backward(logits, sampled, ids, valid, tail, ent, lse)
        detached = [ids, valid, mu_lp, size, stats]
        if not support_grad:
            detached += [logp_s, tail]
        ctx.mark_non_differentiable(*detached)
        return logp, logp_s, tail, ent, ids, valid, mu_lp, size, stats

    @staticmethod
    def backward(ctx, g_y, g_s, g_t, g_h, *_detached):
        logits, sampled, ids, valid, tail, ent, lse = ctx.saved_tensors
        nothing = (None,) * 7
        if g_y is None and g_s is None and g_t is None and g_h is None:
            return (None, *nothing)
        from .triton_pass import backward

        grad = backward(logits, sampled, ids, lse, tail, ent, g_y, g_s, g_t, g_h, valid=valid)
        return (grad, *nothing)


def fused_token_stats(
    logits, sampled, top_ids, top_lp, mu_k, *, second_order: bool, entropy: bool,
    support_grad: bool,
) -> dict[str, torch.Tensor | None]:  # fmt: skip
    """The statistics of flat ``logits [N, V]`` (rows contiguous), ``sampled [N]``, mu's raw
    top-K ``[N, K]`` (None: K = 0) and ``mu_k [N]``, each a flat tensor by ``TokenStats``'s field
    names, plus ``support_ids``, ``support_valid``, ``support_mu_log_prob``, ``support_log_prob``
    (``-inf`` on invalid slots) and ``tail_mass`` (differentiable with ``support_grad``)."""
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    args = [t if t is None else t.contiguous() for t in (sampled, top_ids, top_lp, mu_k)]
    flags = (second_order, entropy, support_grad)
    logp, logp_s, tail, ent, ids, valid, mu_lp, size, stats = _FusedTokenStats.apply(
        logits, *args, *flags
    )
    names = FIELDS + (SECOND_ORDER_FIELDS if second_order else ())
    out = dict(zip(names, stats.unbind(0), strict=True))
    return out | {
        "logp": logp, "entropy": ent, "pi_tail": tail.detach(), "tail_mass": tail,
        "support_size": size, "support_ids": ids, "support_valid": valid,
        "support_mu_log_prob": mu_lp, "support_log_prob": logp_s,
    }  # fmt: skip


_SIGNATURES = {
    "_token_stats": (
        {
            "logits_ptr": "*bf16", "stride": "i32", "vocab": "i32", "sampled_ptr": "*i64",
            "mu_k_ptr": "*fp32", "top_ids_ptr": "*i64", "top_lp_ptr": "*fp32", "k_ids": "i32",
            "ids_ptr": "*i64", "valid_ptr": "*i1", "mu_lp_ptr": "*fp32", "sorted_ptr": "*i64",
            "logp_s_ptr": "*fp32", "logp_ptr": "*fp32", "tail_ptr": "*fp32", "ent_ptr": "*fp32",
            "lse_ptr": "*fp32", "size_ptr": "*i64", "out_ptr": "*fp32", "n_rows": "i32",
            "BLOCK": "constexpr", "M_PAD": "constexpr", "SENTINEL": "constexpr",
            "CUBE": "constexpr", "ENTROPY": "constexpr",
        },
        {"BLOCK": BLOCK, "M_PAD": 32, "SENTINEL": SENTINEL_THRESHOLD, "CUBE": True, "ENTROPY": True},
    ),
}  # fmt: skip
"""Argument types as Triton's compiler takes them, for ``compile_for``."""


def compile_for(arch: int = 90) -> dict[str, list[str]]:
    """The pass's two kernels and this module's through ``triton_pass.compile_kernels``: what a
    GPU of ``arch`` runs for ``compute_token_stats``."""
    kernels = {name: (globals()[name], *spec) for name, spec in _SIGNATURES.items()}
    kernels |= {
        name: (getattr(triton_pass, name), *spec) for name, spec in triton_pass._SIGNATURES.items()
    }
    return triton_pass.compile_kernels(kernels, arch)
