"""FP8 (float8 e4m3) emulation: round a tensor through ``torch.float8_e4m3fn`` and back.

This is what FP8 kernels do to their operands: scale into e4m3's range (max 448), round to 3
mantissa bits, compute, rescale. ``per-tensor`` uses one scale for the whole tensor (vLLM's default
for dynamic FP8 weights); ``per-channel`` one scale per row of the last dimension's owner (per
output channel for a weight ``[out, in]``, per token for activations ``[..., d]``).
"""

from __future__ import annotations

import torch

E4M3_MAX = float(torch.finfo(torch.float8_e4m3fn).max)
GRANULARITIES = ("per-tensor", "per-channel")


def fake_quant_fp8(x: torch.Tensor, granularity: str = "per-tensor") -> torch.Tensor:
    """``x`` rounded to e4m3 with the given scaling, returned in ``x``'s dtype (no gradient)."""
    with torch.no_grad():
        xf = x.float()
        if granularity == "per-tensor":
            amax = xf.abs().amax()
        elif granularity == "per-channel":
            amax = xf.abs().amax(dim=-1, keepdim=True)
        else:
            raise ValueError(
                f"unknown FP8 scaling {granularity!r}; expected one of {GRANULARITIES}"
            )
        scale = amax.clamp_min(1e-12) / E4M3_MAX
        rounded = (xf / scale).to(torch.float8_e4m3fn).float() * scale
        return rounded.to(x.dtype)
