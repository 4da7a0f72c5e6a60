"""FP8 (float8 e4m3) emulation: round a tensor through ``torch.float8_e4m3fn`` and back.

This is what FP8 kernels do to their operands: scale into e4m3's range (max 448), round to 3
mantissa bits, compute, rescale. ``per-tensor`` uses one scale for the whole tensor (vLLM's default
for dynamic FP8 weights); ``per-channel`` one scale per row of the last dimension's owner (per
output channel for a weight ``[out, in]``, per token for activations ``[..., d]``).

Decoding e4m3 back to float goes through a 256-entry table of every bit pattern's value (the same
numbers as ``.float()``, which on CPU is a slow scalar loop, ~10x slower than the table lookup; the
FP8 settings spent a third of their time there).
"""

from __future__ import annotations

import torch

E4M3_MAX = float(torch.finfo(torch.float8_e4m3fn).max)
GRANULARITIES = ("per-tensor", "per-channel")
# The float32 value of each of the 256 e4m3 bit patterns (NaN for the two NaN patterns).
E4M3_VALUES = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()


def decode_e4m3(codes: torch.Tensor) -> torch.Tensor:
    """``codes.float()`` for a ``float8_e4m3fn`` tensor, by table lookup."""
    flat = codes.reshape(-1).view(torch.uint8).int()
    return E4M3_VALUES.index_select(0, flat).view(codes.shape)


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
        rounded = decode_e4m3((xf / scale).to(torch.float8_e4m3fn)) * scale
        return rounded.to(x.dtype)
