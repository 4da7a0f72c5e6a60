"""The logits pass as two fused CPU kernels compiled by torch's inductor: what ``logits_pass`` runs
on a CPU at a real LLM's vocabulary.

Why: the chunked pass is a dozen torch kernels per row on a CPU (a copy, a log-softmax, an
exponential, reductions), each one more sweep over the row. Compiled, the forward is one loop
nest per row (its maximum, then every sum in one sweep of ``exp``) and the backward one
elementwise sweep that writes the gradient once: pdm-agg's loss path took 0.65 of its time on the
chunks at 151,936 columns, and a differentiable entropy costs one more multiply-add per element in
each sweep instead of two to three more sweeps (1-4 % of the path; benchmarks/README.md).

The tail's sums (over the ids *not* in the support) are summed directly, never as ``1 - sum over
the support``: for the duration of the forward kernel, the support's logits are set to the
dtype's lowest finite value (``exp`` of it is 0, and unlike ``-inf`` it makes no ``0 * -inf`` in
the entropy's sum) in the caller's tensor, written through an alias of its storage (autograd's
version counter does not move), and restored, bit for bit, before the kernel's results are used,
also when it raises. The kernel thus sees the tail alone; the support's terms, gathered
beforehand, are added to the row's log-sum-exp and entropy in float32 with the tail's maximum
rescaled (as the fused Triton kernels rescale their running sums). Another thread reading those
logits during the forward would see that value at the support ids.

The kernels are compiled on first use in a process (about 3 s with inductor's on-disk cache warm,
20 s cold, per process), so ``logits_pass`` takes them only from ``MIN_VOCAB`` columns on: for
the embedded backend's vocabularies of a few hundred ids the chunked pass is cheaper than the
compilation. Compiling needs a C++ compiler (inductor's ``cpp.cxx``, ``$CXX`` or ``g++``); where
there is none, or compiling fails, ``statistics`` and ``backward`` return None, the pass falls
back to its chunked ops and a warning says so once per process.
"""

from __future__ import annotations

import functools
import shutil
import types
import warnings

import torch

from .pass_terms import first_slots, sparse_entries, upstream

# The first vocabulary size the compiled kernels serve on CPU: a real LLM's (Qwen3 151,936,
# Llama 3 128,256, GPT-2 50,257). Below it compiling (seconds per process) costs more than the
# chunked pass's extra sweeps save (0.15 ms per token at Qwen3's vocabulary, on one core).
MIN_VOCAB = 2**15
NAME = "compiled"  # how benchmarks and reports name the pass these kernels make
# No kernel of its own for the statistics: on a CPU the [N, K] arithmetic is torch ops on the
# pass's outputs (``stats``), a few percent of the pass (benchmarks/README.md).
FUSED_STATISTICS = False

_failure: str | None = None  # why the kernels cannot be built in this process, once known


def available() -> bool:
    """Whether the kernels can be built here: no earlier failure and a C++ compiler on PATH."""
    global _failure
    if _failure is None and not _compiler_found(_compiler()):
        _failure = f"no C++ compiler {_compiler()!r} on PATH (inductor's cpp.cxx)"
    return _failure is None


def _compiler() -> str:
    from torch._inductor import config

    return config.cpp.cxx[-1]


@functools.cache
def _compiler_found(name: str) -> bool:  # asked once per name: every pass asks available()
    return shutil.which(name) is not None


def _give_up(error: BaseException) -> None:
    global _failure
    _failure = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    warnings.warn(
        f"pdmask: the compiled CPU logits pass is unavailable ({_failure}); the chunked pass "
        "runs instead (about 1.6 times slower at a 151,936-token vocabulary)",
        RuntimeWarning,
        stacklevel=3,
    )


def _tail_sums(z: torch.Tensor, *, entropy: bool, cube: bool, padded: bool):
    """Per row of ``z`` (the tail: the support's entries are the dtype's lowest value): the
    maximum, the shift used (the maximum, or float32's lowest where it is ``-inf``),
    and the sums of ``e = exp(z - shift)``, ``e**2``, ``e**3`` and ``e (z - shift)``, float32.
    ``e (z - shift)`` is ``0 * -inf`` (NaN) at a logit at ``-inf`` unless ``padded`` (rows of a
    padded vocabulary, found by that NaN) asks for the guard (on every element it had cost ~5 %
    of pdm-agg's path, so only those rows take it)."""
    zf = z.float()
    peak = zf.amax(-1, keepdim=True)
    shift = peak.clamp_min(torch.finfo(torch.float32).min)
    d = zf - shift
    e = d.exp()
    sums = [e.sum(-1), (e * e).sum(-1)]
    sums.append((e * e * e).sum(-1) if cube else None)
    if entropy:
        sums.append((e * (d.clamp_min(_EXP_UNDERFLOW) if padded else d)).sum(-1))
    else:
        sums.append(None)
    return peak.squeeze(-1), shift.squeeze(-1), *sums


# Padded rows summed again per block (a bf16 copy of 64 Qwen3 rows: 19 MB).
_RERUN_ROWS = 64
# Below this exp underflows to 0 in float32: the guard clamps z - shift here (e is 0 anyway).
_EXP_UNDERFLOW = -200.0


def _dense_gradient(z, lse, coef, g_h, *, entropy: bool, padded: bool):
    """``pi_j (c - g_H z_j)`` in ``z``'s dtype, computed in float32 (``g_H`` read only with
    ``entropy``); with ``padded``, 0 where ``z_j`` is ``-inf`` (``pi_j`` is 0 there, ``g_H z_j``
    infinite)."""
    zf = z.float()
    p = torch.exp(zf - lse[:, None])
    if not entropy:
        return (p * coef[:, None]).to(z.dtype)
    if padded:
        zf = zf.clamp_min(lse[:, None] + _EXP_UNDERFLOW)
    return (p * (coef[:, None] - g_h[:, None] * zf)).to(z.dtype)


def _compiled(fn, dtype: torch.dtype, **flags):
    """``torch.compile`` of ``fn`` with ``flags`` bound, for logits of ``dtype``, on its own copy
    of ``fn``'s code: dynamo allows a code object 8 recompilations, then runs it eagerly (here:
    float32 ``[N, V]`` temporaries), and every flag set and dtype would be one more."""
    tag = "_".join([str(dtype).removeprefix("torch.")] + [f"{k}{int(v)}" for k, v in flags.items()])
    code = fn.__code__.replace(co_name=f"{fn.__name__}__{tag}")
    copy = types.FunctionType(code, fn.__globals__, code.co_name)
    copy.__kwdefaults__ = flags  # (a functools.partial would be traced through one shared frame)
    return torch.compile(copy, dynamic=True)


@functools.cache
def _forward_kernel(dtype: torch.dtype, entropy: bool, cube: bool, padded: bool = False):
    return _compiled(_tail_sums, dtype, entropy=entropy, cube=cube, padded=padded)


@functools.cache
def _backward_kernel(dtype: torch.dtype, entropy: bool, padded: bool = False):
    return _compiled(_dense_gradient, dtype, entropy=entropy, padded=padded)


def _flat_positions(t: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """Storage positions of ``t[i, cols[i, k]]`` (``cols [N, K]``), flattened."""
    rows = torch.arange(t.shape[0], device=t.device)[:, None] * t.stride(0)
    return (t.storage_offset() + rows + cols * t.stride(1)).reshape(-1)


def _storage_alias(t: torch.Tensor) -> torch.Tensor:
    """A flat tensor over ``t``'s whole storage with its own version counter: writes through it
    are invisible to autograd (the forward restores what it writes)."""
    size = t.untyped_storage().nbytes() // t.element_size()
    return t.new_empty(0).set_(t.untyped_storage(), 0, (size,), (1,))


def _rows_overlap(t: torch.Tensor) -> bool:
    return t.shape[0] > 1 and t.stride(0) < t.shape[1] * t.stride(1)


def _tail_kernel(logits, ids, z_s, entropy: bool, cube: bool):
    """``_tail_sums`` of ``logits`` with its support ``ids`` (whose logits are ``z_s``) at the
    dtype's lowest value for the kernel's duration, and the padded rows (a logit at ``-inf``: NaN
    in the entropy's sum, taken again with the guard; None where there are none); None where
    the kernel cannot be built."""
    if not logits.shape[0]:  # no rows: nothing to compile for
        empty = logits.new_empty(0, dtype=torch.float32)
        sums = empty, empty, empty, empty, empty if cube else None, empty if entropy else None
        return sums, None
    raw, at = _storage_alias(logits), _flat_positions(logits, ids)
    raw[at] = torch.finfo(logits.dtype).min
    try:
        sums = _forward_kernel(logits.dtype, entropy, cube)(logits.detach())
        padded = None
        if entropy and (nan := torch.isnan(sums[-1])).any():
            padded = nan
            guarded = _forward_kernel(logits.dtype, entropy, cube, True)
            # copied a block of rows at a time: every row padded must not mean a second logits
            for rows in padded.nonzero().squeeze(1).split(_RERUN_ROWS):
                again = guarded(logits.detach()[rows])
                for total, value in zip(sums, again, strict=True):
                    if total is not None:
                        total[rows] = value
        return sums, padded
    except torch._dynamo.exc.BackendCompilerFailed as error:
        _give_up(error)
        return None
    finally:
        raw[at] = z_s.reshape(-1)


def statistics(logits, sampled, support_ids, second_order: bool, entropy: bool):
    """The pass's forward, float32: ``(logp_sampled, logp_support, tail_mass, tail_sq, tail_cube,
    entropy, lse, padded)`` for ``logits [N, V]`` (as ``triton_pass.statistics``; ``padded``
    marks the rows with a logit at ``-inf``, found with the entropy only, else None), or None
    where the kernels cannot be built (see the module docstring)."""
    if _rows_overlap(logits):  # an expanded view: its rows share entries, so a copy
        logits = logits.contiguous()
    ids = support_ids.long()
    z_s = logits.gather(1, ids)
    z_y = logits.gather(1, sampled.long()[:, None]).squeeze(1).float()
    result = _tail_kernel(logits, ids, z_s, entropy, second_order)
    if result is None:
        return None
    (peak, shift, s_t, sq_t, cube_t, ez_t), padded = result
    # A tail with nothing above the support's stand-in value is empty (or all -inf): no sums.
    empty = peak <= torch.finfo(logits.dtype).min
    if empty.any():
        peak = peak.masked_fill(empty, float("-inf"))
        s_t, sq_t, cube_t, ez_t = (
            None if t is None else t.masked_fill(empty, 0.0) for t in (s_t, sq_t, cube_t, ez_t)
        )
    z_s = z_s.float()
    top = torch.maximum(peak, z_s.amax(-1)) if ids.shape[1] else peak
    e_s = torch.exp(z_s - top[:, None]) * first_slots(ids)  # each distinct support id once
    w = torch.exp(shift - top)  # the tail's sums rescaled from its shift to the row's maximum
    total = s_t * w + e_s.sum(-1)
    lse = top + total.log()
    ent = None
    if entropy:  # H = log(total) - E[z - top], both parts shifted by the row's maximum
        support_part = torch.where(e_s > 0, e_s * (z_s - top[:, None]), 0.0).sum(-1)
        ent = total.log() - (w * (ez_t + (shift - top) * s_t) + support_part) / total
    tail_cube = cube_t * (w / total) ** 3 if second_order else None
    return (
        z_y - lse,
        z_s - lse[:, None],
        s_t * w / total,
        sq_t * (w / total) ** 2,
        tail_cube,
        ent,
        lse,
        padded,
    )


def backward(logits, sampled, support_ids, lse, tail_mass, ent, g_y, g_s, g_t, g_h, padded=None):
    """The gradient in the logits' dtype, term for term as ``triton_pass.backward``: the dense
    ``pi_j (c - g_H z_j)`` by the compiled kernel, then the exact entries at the sampled id (and
    the support ids where they carry a gradient), each rounded once. ``padded``: the forward's
    rows with a logit at ``-inf``. None where the kernel cannot be built."""
    if not logits.shape[0]:
        return torch.empty_like(logits)
    g_y, g_s, g_t, g_h, coef = upstream(g_y, g_s, g_t, g_h, tail_mass, ent, lse, lse)
    try:
        # padded rows (from the forward) need the guard: then all rows take it
        entropic = g_h is not None
        kernel = _backward_kernel(logits.dtype, entropic, entropic and padded is not None)
        grad = kernel(logits.detach(), lse, coef, coef if g_h is None else g_h)
    except torch._dynamo.exc.BackendCompilerFailed as error:
        _give_up(error)
        return None
    grad = grad.contiguous()
    at = sampled.long()[:, None]
    if g_s is not None or g_t is not None:
        at = torch.cat([support_ids.long(), at], 1)
    z_at = logits.gather(1, at).float()
    p_at = torch.exp(z_at - lse[:, None])
    value = sparse_entries(at, support_ids, sampled, p_at, z_at, coef, g_y, g_s, g_t, g_h)
    # an indexed write on the flat gradient (fresh, contiguous: its storage is its view):
    # scatter_ along the rows of an [N, V] CPU tensor took 0.5 s at 1,024 x 151,936 (duplicate
    # ids write one value either way)
    grad.view(-1)[_flat_positions(grad, at)] = value.to(grad.dtype).reshape(-1)
    return grad
