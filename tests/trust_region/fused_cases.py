"""The fused logits-pass kernels' cases and their float64 checks, shared by the Triton kernels
(run in Triton's interpreter, ``interpreted_triton_pass.py``) and the CPU kernels inductor
compiles (``test_compiled_pass.py``): each case goes through ``_ChunkedLogitsPass`` with the given
kernels, forward and backward; the reference is float64 autograd through plain torch ops (a
log-softmax, a mask of the support, sums) on the same rounded logits."""

from __future__ import annotations

import torch

from pdmask.trust_region import compute_token_stats
from pdmask.trust_region.logits_pass import _ChunkedLogitsPass
from pdmask.trust_region.stats import SECOND_ORDER

try:
    from .reference import token_reference
except ImportError:  # imported by interpreted_triton_pass.py, a script beside this file
    from reference import token_reference

EPS32 = torch.finfo(torch.float32).eps
SECOND_ORDER_FIELDS = ("tail_sum_cube", "var_v", "var_v_agg", "var_v_uni", "var_v_bucket")


def reference(z64: torch.Tensor, sampled, support_ids):
    """float64 outputs of the same (already rounded) logits, by plain torch ops."""
    logp = torch.log_softmax(z64, -1)
    p = logp.exp()
    in_support = torch.zeros_like(p, dtype=torch.bool).scatter_(1, support_ids, True)
    tail = torch.where(in_support, 0.0, p)
    return {
        "logp_sampled": logp.gather(1, sampled[:, None]).squeeze(1),
        "logp_support": logp.gather(1, support_ids),
        "tail_mass": tail.sum(-1),
        "tail_sum_sq": tail.square().sum(-1),
        "tail_sum_cube": tail.pow(3).sum(-1),
        "entropy": -(p * logp).sum(-1),
    }


def case(
    kernels, seed: int, n: int, vocab: int, m: int, dtype, *, second_order=False, strided=False,
    entropy=False, support_grad=False, padded=0,
):  # fmt: skip
    """One case's largest errors against float64. ``padded`` columns at ``-inf`` follow the
    ``vocab`` real ones (a padded vocabulary): the reference sees the real ones only, and the
    gradient must be exactly 0 on the padding."""
    g = torch.Generator().manual_seed(seed)
    width = vocab + padded
    wide = torch.randn(n, width + (7 if strided else 0), generator=g) * 3
    wide[:, vocab:width] = float("-inf")
    x = wide.to(dtype)[:, :width].requires_grad_(True)  # strided: rows width + 7 apart
    sampled = torch.randint(0, vocab, (n,), generator=g)
    support_ids = torch.randint(0, vocab, (n, m), generator=g)
    if n:
        support_ids[:, -1] = sampled  # the sampled id in the support, as build_support puts it
        support_ids[0, 1] = support_ids[0, 0]  # a duplicate slot
        support_ids[-1, :] = torch.arange(vocab - m, vocab)  # ids in the last, partial block
    flags = (second_order, entropy, support_grad, kernels)
    out = _ChunkedLogitsPass.apply(x, sampled, support_ids, 1, *flags)
    names = ("logp_sampled", "logp_support", "tail_mass", "tail_sum_sq", "tail_sum_cube", "entropy")
    got = {k: v for k, v in zip(names, out, strict=True) if v is not None}
    # an upstream gradient on every differentiable output
    upstream = {"logp_sampled": torch.randn(n, generator=g)}
    if support_grad:
        upstream["logp_support"] = torch.randn(n, m, generator=g)
        upstream["tail_mass"] = torch.randn(n, generator=g)
    if entropy:
        upstream["entropy"] = torch.randn(n, generator=g)
    sum(((got[k] * u).sum() for k, u in upstream.items()), torch.zeros(())).backward()

    z64 = x.detach()[:, :vocab].double().requires_grad_(True)
    ref = reference(z64, sampled, support_ids)
    sum(((ref[k] * u.double()).sum() for k, u in upstream.items()), torch.zeros((), dtype=torch.float64)).backward()  # fmt: skip
    errors = {}
    for name, value in got.items():
        if value.dtype != torch.float32:
            raise AssertionError(f"{name}: {value.dtype}, not float32")
        want = ref[name].detach()
        err = (value.detach().double() - want).abs()
        # log-probs and the entropy: absolute error; sums of probabilities: relative to the value
        relative = name.startswith("tail")
        scale = want.abs().clamp_min(1e-30) if relative else 1.0
        errors[name] = float((err / scale).max()) if n else 0.0
    if x.stride(0) != width + (7 if strided else 0):
        raise AssertionError(f"the logits' rows are {x.stride(0)} apart")
    if x.grad.dtype != dtype or x.grad.shape != x.shape:
        raise AssertionError(f"gradient {x.grad.dtype} {tuple(x.grad.shape)}")
    grad = x.grad[:, :vocab]
    errors["padding_grad"] = float(x.grad[:, vocab:].double().abs().max()) if n and padded else 0.0
    # the gradient in units of the logits dtype's spacing at each entry (subnormals included),
    # and relative to the row's largest entry (where an entry cancels to nearly 0, float32
    # arithmetic on the row's larger terms decides its last bits)
    exact = z64.grad
    info = torch.finfo(dtype)
    spacing = info.eps * torch.exp2(torch.floor(torch.log2(exact.abs().clamp_min(info.tiny))))
    diff = (grad.double() - exact).abs()
    errors["grad_spacings"] = float((diff / spacing).max()) if n else 0.0
    row_scale = exact.abs().amax(-1, keepdim=True).clamp_min(1e-300)
    errors["grad_row_relative"] = float((diff / row_scale).max()) if n else 0.0
    return {
        "n": n, "vocab": vocab, "m": m, "dtype": str(dtype), "second_order": second_order,
        "entropy": entropy, "support_grad": support_grad, "strided": strided, "padded": padded,
        "outputs": sorted(got), "errors": errors, "eps": info.eps,
        "z_max": float(z64.detach().abs().max()) if n else 0.0,
        "lse_max": float(torch.logsumexp(z64.detach(), -1).abs().max()) if n else 0.0,
    }  # fmt: skip


def assert_matches_float64(c: dict) -> None:
    """The tolerances a case's errors (``case``'s result) must meet."""
    errors = c["errors"]
    # float32 throughout: log pi = z - lse and H = lse - E[z] are off by a few float32
    # roundings of |lse|
    tol = 16 * EPS32 * (1 + c["lse_max"])
    assert errors["logp_sampled"] <= tol and errors["logp_support"] <= tol, c
    if c["entropy"]:
        assert errors["entropy"] <= tol, c
    # the tail's sums, summed directly (never 1 - the support's mass): relative float32 error
    tails = ["tail_mass", "tail_sum_sq"] + (["tail_sum_cube"] if c["second_order"] else [])
    assert [k for k in c["outputs"] if k.startswith("tail")] == sorted(tails), c
    for name in tails:
        assert errors[name] <= 64 * EPS32, (name, c)
    # the gradient: float32 terms (pi = exp(z - lse), off by a few roundings of |z| + |lse|)
    # rounded once into the logits' dtype (<= 1 spacing: the interpreter may truncate)
    assert errors["padding_grad"] == 0, c  # pi is 0 there: so is every term of the gradient
    float32_terms = 4 * (1 + c["z_max"] + c["lse_max"]) * EPS32
    assert errors["grad_row_relative"] <= c["eps"] + 2 * float32_terms, c
    if not (c["entropy"] or c["support_grad"]):
        # g (e_y - pi) cancels nowhere here: every entry is within its own spacing
        assert errors["grad_spacings"] <= 1 + float32_terms / c["eps"], c


def second_order_case(seed: int, n: int, vocab: int, k: int, dtype) -> dict:
    """``compute_token_stats(inputs=("second_order",))`` on ``dtype`` logits through whichever
    pass serves them, against the float64 reference (``reference.token_reference``) of the same
    rounded logits: the largest absolute error of each second-order statistic."""
    g = torch.Generator().manual_seed(seed)
    z = (torch.randn(n, vocab, generator=g, dtype=torch.float64) * 3).to(dtype)
    logmu = torch.log_softmax(z.double() + torch.randn(n, vocab, generator=g), -1)
    top_lp, top_ids = logmu.topk(k, -1)
    sampled = torch.multinomial(logmu.exp(), 1, generator=g).squeeze(1)
    mu_k = logmu.gather(1, sampled[:, None]).squeeze(1)
    stats = compute_token_stats(
        z, sampled, top_ids, top_lp.float(), mu_k.float(), inputs=(SECOND_ORDER,)
    )
    errors = dict.fromkeys(SECOND_ORDER_FIELDS, 0.0)
    for row in range(n):
        # the reference of the float32 behaviour inputs the pass read
        ref = token_reference(
            z[row].double(), int(sampled[row]), float(mu_k[row].float()),
            top_ids[row].tolist(), top_lp[row].float().double().tolist(),
        )  # fmt: skip
        for name in SECOND_ORDER_FIELDS:
            got = float(getattr(stats, name)[row])
            errors[name] = max(errors[name], abs(got - ref[name]))
    lse_max = float(torch.logsumexp(z.double(), -1).abs().max())
    return {"dtype": str(stats.var_v.dtype), "errors": errors, "lse_max": lse_max}


def assert_second_order_matches_float64(c: dict) -> None:
    """Every second-order statistic is a few float32 products of probabilities (each within
    16 eps32 (1 + |lse|) relative, as the log-probs) summed to at most a few units: absolute."""
    assert c["dtype"] == "torch.float32", c
    tol = 8 * 16 * EPS32 * (1 + c["lse_max"])
    for name, error in c["errors"].items():
        assert error <= tol, (name, c)
