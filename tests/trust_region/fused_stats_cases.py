"""The fused statistics kernel (``trust_region.triton_stats``) in Triton's interpreter: its largest
errors against float64, and what the pass launches and reads back per direction.

Imported by ``interpreted_triton_pass.py`` (the fresh process ``TRITON_INTERPRET=1`` needs);
``test_triton_pass.py`` asserts on what it returns. Tiny shapes: the interpreter runs a kernel's
every block in numpy.
"""

from __future__ import annotations

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pdmask.trust_region import compute_token_stats, triton_pass, triton_stats
from pdmask.trust_region.stats import ENTROPY, SECOND_ORDER, SUPPORT_LOG_PROBS

try:
    from .cases import make_case
    from .reference import token_reference
except ImportError:  # imported by interpreted_triton_pass.py, a script beside this file
    from cases import make_case
    from reference import token_reference

EVERY_INPUT = (SECOND_ORDER, ENTROPY, SUPPORT_LOG_PROBS)
# Allocations and views launch no kernel; everything else a torch op does on a GPU does.
_NO_KERNEL = {"empty.memory_format", "empty_strided.default", "empty_like.default"}


def _loss(stats, upstream):
    """A loss with an upstream gradient on every differentiable output."""
    support = stats.support
    return (
        (stats.logp * upstream[0]).sum()
        + (stats.entropy * upstream[1]).sum()
        + (support.log_prob.where(support.valid, 0.0) * upstream[2]).sum()
        + (support.tail_mass * upstream[3]).sum()
    )


def stats_case(seed: int, n: int, vocab: int, k: int, dtype, topk: bool = True) -> dict:
    """``compute_token_stats`` with every input, on ``dtype`` logits through the fused kernels
    (the caller points ``logits_pass.fused_kernels`` at ``triton_pass``), against the float64
    reference of the same rounded logits: the brute-force ``token_reference`` per row where it
    has the statistic, the float64 path (which ``test_stats.py`` holds to it) elsewhere; the
    gradient of a loss on every differentiable output against float64 autograd.
    ``make_case``'s corruptions (sentinels, NaN and -inf log-probs, missing and duplicated ids)
    exercise the kernel's own support building."""
    case = make_case(seed, n=n, vocab=vocab, k=k)
    z = case.logits.to(dtype)
    ids, lps = (case.topk_ids, case.topk_logp) if topk else (None, None)
    g = torch.Generator().manual_seed(seed)
    upstream = [torch.randn(n, generator=g) for _ in range(2)]
    upstream += [torch.randn(n, k + 1, generator=g), torch.randn(n, generator=g)]
    x = z.clone().requires_grad_(True)
    got = compute_token_stats(x, case.sampled, ids, lps, case.mu_logp.float(), inputs=EVERY_INPUT)
    _loss(got, upstream).backward()
    x64 = z.double().requires_grad_(True)
    want = compute_token_stats(
        x64, case.sampled, ids, lps, case.mu_logp.float().double(), inputs=EVERY_INPUT
    )
    _loss(want, [u.double() for u in upstream]).backward()

    errors, scale = {}, {}
    for name, value in got.tensors().items():
        ref = want.tensors()[name].detach().double()
        if value.dtype.is_floating_point and value.dtype != torch.float32:
            raise AssertionError(f"{name}: {value.dtype}, not float32")
        errors[name] = float((value.detach().double() - ref).abs().max())
        scale[name] = float(ref.abs().max())
    for row in range(n):
        brute = token_reference(
            z[row].double(), int(case.sampled[row]), float(case.mu_logp[row].float()),
            [] if ids is None else ids[row].tolist(), [] if lps is None else lps[row].tolist(),
        )  # fmt: skip
        for name, ref in brute.items():
            value = float(getattr(got, name)[row].detach())
            errors["brute/" + name] = max(errors.get("brute/" + name, 0.0), abs(value - ref))
            scale["brute/" + name] = max(scale.get("brute/" + name, 0.0), abs(ref))
    support = {"ids": got.support.ids, "valid": got.support.valid}
    same_support = all(bool((v == getattr(want.support, f)).all()) for f, v in support.items())
    log_prob = got.support.log_prob.detach().double()
    on = want.support.valid
    support_error = float((log_prob[on] - want.support.log_prob.detach()[on]).abs().max())
    exact = x64.grad
    row_scale = exact.abs().amax(-1, keepdim=True).clamp_min(1e-300)
    return {
        "seed": seed, "n": n, "vocab": vocab, "k": k, "dtype": str(dtype), "topk": topk,
        "errors": errors, "scale": scale, "same_support": same_support,
        "support_log_prob_error": support_error,
        "invalid_slots_at_minus_inf": bool((log_prob[~on] == float("-inf")).all()),
        "grad_row_relative": float(((x.grad.double() - exact).abs() / row_scale).max()),
        "grad_dtype": str(x.grad.dtype), "eps": torch.finfo(dtype).eps,
        "z_max": float(z.double().abs().max()),
        "lse_max": float(torch.logsumexp(z.double(), -1).abs().max()),
    }  # fmt: skip


class _Launches(TorchDispatchMode):
    """Counts the torch ops that launch a kernel, and refuses every read back to the host
    (``item``, ``bool``, ``int``, ``float`` of a tensor, data-dependent shapes)."""

    HOST_READS = {"_local_scalar_dense.default", "nonzero.default", "masked_select.default"}

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__ if hasattr(func, "__name__") else str(func)
        if name in self.HOST_READS:
            raise AssertionError(f"the pass reads a tensor back to the host: aten.{name}")
        if not (func.is_view or name in _NO_KERNEL):
            self.ops.append(name)
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def _counted(direction: str, counts: dict):
    """Within: every Triton launch counted per kernel, every torch op counted, every host read
    refused; ``.cpu()``, ``.tolist()`` and ``.numpy()`` too (on CPU tensors torch dispatches
    nothing for them). The interpreter's own launch reads its arguments into numpy: it runs
    with the checks lifted (on a GPU it is one kernel launch)."""
    refused = {}

    def refuse(method):
        def call(self, *a, **kw):
            raise AssertionError(f"the pass calls Tensor.{method}()")

        return call

    for method in ("cpu", "tolist", "numpy"):
        refused[method] = getattr(torch.Tensor, method)
    kernels = {
        (triton_stats, "_token_stats"): triton_stats._token_stats,
        (triton_pass, "_forward"): triton_pass._forward,
        (triton_pass, "_backward"): triton_pass._backward,
    }
    mode = _Launches()

    class Launch:
        def __init__(self, name, kernel):
            self.name, self.kernel = name, kernel

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                counts[direction]["triton"].append(self.name)
                with _lifted(mode, refused):
                    return self.kernel[grid](*args, **kwargs)

            return launch

    for (module, name), kernel in kernels.items():
        setattr(module, name, Launch(name, kernel))
    for method in refused:
        setattr(torch.Tensor, method, refuse(method))
    try:
        with mode:
            yield
    finally:
        for method, original in refused.items():
            setattr(torch.Tensor, method, original)
        for (module, name), kernel in kernels.items():
            setattr(module, name, kernel)
        counts[direction]["torch"] += mode.ops


@contextlib.contextmanager
def _lifted(mode, refused):
    patched = {method: getattr(torch.Tensor, method) for method in refused}
    for method, original in refused.items():
        setattr(torch.Tensor, method, original)
    try:
        with torch.utils._python_dispatch._disable_current_modes():
            yield
    finally:
        for method, call in patched.items():
            setattr(torch.Tensor, method, call)


def launches(seed: int, n: int, vocab: int, k: int, dtype, inputs) -> dict:
    """What the pass launches per direction (Triton kernels by name, torch ops by name) on a
    loss with an upstream on every differentiable output, every host read refused (a read
    raises, and the JSON holds no counts)."""
    case = make_case(seed, n=n, vocab=vocab, k=k)
    x = case.logits.to(dtype).requires_grad_(True)
    args = (case.sampled, case.topk_ids, case.topk_logp, case.mu_logp.float())
    counts = {d: {"triton": [], "torch": []} for d in ("forward", "backward")}
    g = torch.Generator().manual_seed(seed)
    upstream = [torch.randn(n, generator=g) for _ in range(2)]
    upstream += [torch.randn(n, k + 1, generator=g), torch.randn(n, generator=g)]
    with _counted("forward", counts):
        stats = compute_token_stats(x, *args, inputs=inputs)
    loss = (
        _loss(stats, upstream) if SUPPORT_LOG_PROBS in inputs else (stats.logp * upstream[0]).sum()
    )
    original = triton_stats._FusedTokenStats.backward

    def counted_backward(ctx, *grads):
        with _counted("backward", counts):
            return original(ctx, *grads)

    triton_stats._FusedTokenStats.backward = staticmethod(counted_backward)
    try:
        loss.backward()
    finally:
        triton_stats._FusedTokenStats.backward = staticmethod(original)
    return {"inputs": sorted(inputs), "counts": counts, "grad": x.grad is not None}


def beyond_the_logits(vocab: int = 300) -> dict:
    """The fused path's reading of an id at the logits' width: an invalid slot, never an index
    (``support.check_topk_ids`` refuses it where the ids enter). The largest difference between
    the statistics with that id and with the slot marked missing (id -1), and whether either run
    produced a NaN."""
    case = make_case(4, n=3, vocab=vocab, k=5)
    z = case.logits.to(torch.bfloat16)
    args = (case.topk_logp, case.mu_logp.float())
    beyond, missing = case.topk_ids.clone(), case.topk_ids.clone()
    beyond[1, 2], missing[1, 2] = vocab, -1
    read = compute_token_stats(z, case.sampled, beyond, *args).tensors()
    marked = compute_token_stats(z, case.sampled, missing, *args).tensors()
    return {
        "largest_difference": max(
            float((read[name].double() - marked[name].double()).abs().nan_to_num(0).max())
            for name in read
        ),
        "nan": any(bool(t.isnan().any()) for t in [*read.values(), *marked.values()]),
        "fields": len(read),
    }
