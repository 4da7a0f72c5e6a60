"""A fused log-prob kernel in Triton: verl's GPU baseline, written here.

On GPU nodes verl 0.9.1's ``logprobs_from_logits`` runs flash-attn's Triton cross-entropy
(``flash_attn.ops.triton.cross_entropy``) when flash-attn is installed; a lent GPU machine has no
flash-attn, so this module is the same computation, written for the check: one program per row
streams the row's logits once in the forward (an online log-sum-exp and the label's logit, in
float32), and in the backward one program per (row, block) writes ``g * (e_y - softmax(z))``
(pdmask's own sampled-token backward kernel, ``trust_region.triton_pass``: the same math). That is the least traffic a log-prob can make: read the logits twice, write their gradient once.

flash-attn can also write the gradient into the logits' own storage (``inplace_backward``), which
saves one logits-sized buffer of peak memory and no time; this kernel writes a new tensor so that
the check can reuse its logits across repeats.

On CPU (the CI's code check) the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``,
set before triton is imported).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import triton
import triton.language as tl

# Columns per program step: large enough to keep a GPU's memory system busy, small enough to
# live in registers (4096 float32 over 8 warps = 16 per thread).
BLOCK = 4096
WARPS = 8
# A finite "minus infinity" for the running maximum: exp(-inf - (-inf)) would be NaN. A constexpr:
# a compiled kernel may read no other kind of global (the interpreter does not check this).
_NEG = tl.constexpr(-1e30)


@triton.jit
def _forward(logits_ptr, labels_ptr, logp_ptr, lse_ptr, vocab, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * stride
    cols = tl.arange(0, BLOCK)
    run_max = tl.full([BLOCK], _NEG, tl.float32)
    run_sum = tl.zeros([BLOCK], tl.float32)
    for start in range(0, vocab, BLOCK):
        z = tl.load(base + start + cols, mask=start + cols < vocab, other=-float("inf"))
        z = z.to(tl.float32)
        new_max = tl.maximum(run_max, z)
        run_sum = run_sum * tl.exp(run_max - new_max) + tl.exp(z - new_max)
        run_max = new_max
    row_max = tl.max(run_max, 0)
    lse = row_max + tl.log(tl.sum(run_sum * tl.exp(run_max - row_max), 0))
    label = tl.load(labels_ptr + row)
    z_label = tl.load(base + label).to(tl.float32)
    tl.store(logp_ptr + row, z_label - lse)
    tl.store(lse_ptr + row, lse)


class _FusedLogprob(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, labels):
        n, vocab = logits.shape
        logp = torch.empty(n, dtype=torch.float32, device=logits.device)
        lse = torch.empty_like(logp)
        _forward[(n,)](
            logits, labels, logp, lse, vocab, logits.stride(0), BLOCK=BLOCK, num_warps=WARPS
        )  # fmt: skip
        ctx.save_for_backward(logits, labels, lse)
        return logp

    @staticmethod
    def backward(ctx, grad_logp):
        # flash-attn's backward is pdmask's sampled-token backward: g (e_y - pi), written once
        from pdmask.trust_region.triton_pass import sampled_backward

        logits, labels, lse = ctx.saved_tensors
        return sampled_backward(logits, labels, lse, grad_logp), None


# The kernel's argument types as Triton's compiler takes them (bf16 logits, int64 labels), for
# ``compile_for``: the launches above pass the same arguments in the same order.
SIGNATURES = {
    "_forward": {
        "logits_ptr": "*bf16", "labels_ptr": "*i64", "logp_ptr": "*fp32", "lse_ptr": "*fp32",
        "vocab": "i32", "stride": "i32", "BLOCK": "constexpr",
    },
}  # fmt: skip


def compile_for(arch: int = 90) -> dict[str, list[str]]:
    """The forward kernel compiled for compute capability ``arch`` without a GPU (pdmask's
    ``compile_kernels``): the interpreter the tiny CPU run uses accepts code the compiler refuses."""
    from pdmask.trust_region.triton_pass import compile_kernels

    kernels = {name: (globals()[name], sig, {"BLOCK": BLOCK}) for name, sig in SIGNATURES.items()}
    return compile_kernels(kernels, arch, WARPS)


def fused_logprob(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``log softmax(logits)[labels]`` in float32 for ``logits [N, V]`` (contiguous rows)."""
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    return _FusedLogprob.apply(logits, labels.contiguous())


def _flash_attn_cross_entropy(logits, labels, inplace_backward=True):
    """flash-attn's ``cross_entropy_loss`` signature and result: ``(losses, z_losses)``."""
    del inplace_backward  # this kernel always writes a new gradient tensor (see the docstring)
    losses = -fused_logprob(logits, labels)
    return losses, torch.zeros_like(losses)


@contextmanager
def as_verls_flash_attn():
    """verl's ``logprobs_from_logits`` takes the flash-attn branch, served by this kernel, as on a
    GPU node with flash-attn installed (verl reads the flag and the function at call time)."""
    import verl.utils.torch_functional as verl_F

    saved = (
        verl_F.FLAH_ATTN_CROSS_ENTROPY_LOSS_AVAILABLE,
        getattr(verl_F, "cross_entropy_loss", None),
    )
    verl_F.FLAH_ATTN_CROSS_ENTROPY_LOSS_AVAILABLE = True
    verl_F.cross_entropy_loss = _flash_attn_cross_entropy
    try:
        yield
    finally:
        verl_F.FLAH_ATTN_CROSS_ENTROPY_LOSS_AVAILABLE = saved[0]
        if saved[1] is None:
            del verl_F.cross_entropy_loss
        else:
            verl_F.cross_entropy_loss = saved[1]
