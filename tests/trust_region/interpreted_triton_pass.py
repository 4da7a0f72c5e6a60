"""Run pdmask's fused Triton logits pass on CPU in Triton's interpreter and print, as one JSON
line, its largest errors against a float64 reference (``test_triton_pass.py`` asserts on them).

A script, not a test: ``TRITON_INTERPRET=1`` must be set before triton is first imported, so it
runs in a fresh process. Each case goes through ``_ChunkedLogitsPass`` with ``fused=True``, the
path a GPU takes, forward and backward; the reference is float64 autograd through plain torch ops
(a log-softmax, a mask of the support, sums) on the same rounded logits.
"""

from __future__ import annotations

import json
import os
import sys

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

import torch  # noqa: E402

from pdmask.trust_region.logits_pass import _ChunkedLogitsPass  # noqa: E402


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
    seed: int, n: int, vocab: int, m: int, dtype, *, second_order=False, strided=False,
    entropy=False, support_grad=False,
):  # fmt: skip
    g = torch.Generator().manual_seed(seed)
    wide = torch.randn(n, vocab + (7 if strided else 0), generator=g) * 3
    x = wide.to(dtype)[:, :vocab].requires_grad_(True)  # strided: rows vocab + 7 apart
    sampled = torch.randint(0, vocab, (n,), generator=g)
    support_ids = torch.randint(0, vocab, (n, m), generator=g)
    if n:
        support_ids[:, -1] = sampled  # the sampled id in the support, as build_support puts it
        support_ids[0, 1] = support_ids[0, 0]  # a duplicate slot
        support_ids[-1, :] = torch.arange(vocab - m, vocab)  # ids in the last, partial block
    flags = (second_order, entropy, support_grad, True)
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

    z64 = x.detach().double().requires_grad_(True)
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
    if x.stride(0) != vocab + (7 if strided else 0):
        raise AssertionError(f"the logits' rows are {x.stride(0)} apart")
    grad = x.grad
    if grad.dtype != dtype or grad.shape != x.shape:
        raise AssertionError(f"gradient {grad.dtype} {tuple(grad.shape)}")
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
        "entropy": entropy, "support_grad": support_grad, "strided": strided,
        "outputs": sorted(got), "errors": errors, "eps": info.eps,
        "z_max": float(z64.detach().abs().max()) if n else 0.0,
        "lse_max": float(torch.logsumexp(z64.detach(), -1).abs().max()) if n else 0.0,
    }  # fmt: skip


def main() -> int:
    bf16, f16, f32 = torch.bfloat16, torch.float16, torch.float32
    cases = [
        case(0, 37, 5000, 21, bf16, second_order=True),  # 3 blocks, the last one partial
        case(1, 9, 2048, 6, f32),  # exactly one block
        case(2, 5, 300, 3, f16, second_order=True, strided=True),  # one partial block, strided
        case(3, 0, 300, 3, bf16),  # no rows
        case(4, 23, 5000, 21, bf16, entropy=True),  # a differentiable entropy
        case(5, 23, 5000, 21, bf16, support_grad=True),  # differentiable support and tail
        case(6, 11, 3000, 8, f32, entropy=True, support_grad=True, second_order=True),
    ]
    print(json.dumps(cases))
    return 0


if __name__ == "__main__":
    sys.exit(main())
