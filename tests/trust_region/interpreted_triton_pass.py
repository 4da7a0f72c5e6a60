"""Run pdmask's fused Triton logits pass on CPU in Triton's interpreter and print, as one JSON
line, its largest errors against a float64 reference (``test_triton_pass.py`` asserts on them).

A script, not a test: ``TRITON_INTERPRET=1`` must be set before triton is first imported, so it
runs in a fresh process. Each case goes through ``_ChunkedLogitsPass`` with ``fused=True``, the
path a GPU takes, forward and backward.
"""

from __future__ import annotations

import json
import os
import sys

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

import torch  # noqa: E402

from pdmask.trust_region.logits_pass import _ChunkedLogitsPass  # noqa: E402


def reference(z64: torch.Tensor, sampled, support_ids):
    """float64 statistics of the same (already rounded) logits, by plain torch ops."""
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
    }


def case(seed: int, n: int, vocab: int, m: int, dtype, second_order: bool, strided: bool):
    g = torch.Generator().manual_seed(seed)
    wide = torch.randn(n, vocab + (7 if strided else 0), generator=g) * 3
    logits = wide.to(dtype)[:, :vocab]  # strided: rows vocab + 7 apart
    sampled = torch.randint(0, vocab, (n,), generator=g)
    support_ids = torch.randint(0, vocab, (n, m), generator=g)
    if n:
        support_ids[:, -1] = sampled  # the sampled id in the support, as build_support puts it
        support_ids[0, 1] = support_ids[0, 0]  # a duplicate slot
        support_ids[-1, :] = torch.arange(vocab - m, vocab)  # ids in the last, partial block
    x = logits.requires_grad_(True)
    out = _ChunkedLogitsPass.apply(x, sampled, support_ids, 1, second_order, False, False, True)
    logp_sampled, logp_support, tail_mass, tail_sq, tail_cube, _ = out
    upstream = torch.randn(n, generator=g)
    (logp_sampled * upstream).sum().backward()

    z64 = x.detach().double().requires_grad_(True)
    ref = reference(z64, sampled, support_ids)
    (ref["logp_sampled"] * upstream.double()).sum().backward()
    got = {
        "logp_sampled": logp_sampled,
        "logp_support": logp_support,
        "tail_mass": tail_mass,
        "tail_sum_sq": tail_sq,
    }
    if second_order:
        got["tail_sum_cube"] = tail_cube
    errors = {}
    for name, value in got.items():
        want = ref[name].detach()
        if value.dtype != torch.float32:
            raise AssertionError(f"{name}: {value.dtype}, not float32")
        err = (value.detach().double() - want).abs()
        # log-probs: absolute error; sums of probabilities: relative to the value
        scale = 1.0 if name.startswith("logp") else want.abs().clamp_min(1e-30)
        errors[name] = float((err / scale).max()) if n else 0.0
    if x.stride(0) != vocab + (7 if strided else 0):
        raise AssertionError(f"the logits' rows are {x.stride(0)} apart")
    grad = x.grad
    if grad.dtype != dtype or grad.shape != x.shape:
        raise AssertionError(f"gradient {grad.dtype} {tuple(grad.shape)}")
    # the gradient in units of the logits dtype's spacing at each entry (subnormals included)
    exact = z64.grad
    info = torch.finfo(dtype)
    spacing = info.eps * torch.exp2(torch.floor(torch.log2(exact.abs().clamp_min(info.tiny))))
    errors["grad_spacings"] = float(((grad.double() - exact).abs() / spacing).max()) if n else 0.0
    return {
        "n": n, "vocab": vocab, "m": m, "dtype": str(dtype), "second_order": second_order,
        "strided": strided, "cube": tail_cube is not None, "errors": errors,
        "eps": info.eps, "z_max": float(z64.detach().abs().max()) if n else 0.0,
        "lse_max": float(torch.logsumexp(z64.detach(), -1).abs().max()) if n else 0.0,
    }  # fmt: skip


def main() -> int:
    cases = [
        case(0, 37, 5000, 21, torch.bfloat16, True, False),  # 3 blocks, the last one partial
        case(1, 9, 2048, 6, torch.float32, False, False),  # exactly one block
        case(2, 5, 300, 3, torch.float16, True, True),  # one partial block, strided rows
        case(3, 0, 300, 3, torch.bfloat16, False, False),  # no rows
    ]
    print(json.dumps(cases))
    return 0


if __name__ == "__main__":
    sys.exit(main())
