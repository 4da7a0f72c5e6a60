"""The training/inference mismatch of each precision setting.

The trainer is the fp32 model being optimised; the behaviour copy is what a rollout engine (vLLM)
would serve after a weight sync. Settings (the paper's):

- ``bf16``: behaviour = the trainer's weights cast to bf16, forward in bf16.
- ``fp8-rollout``: behaviour weights rounded to float8 e4m3 (``fp8_scaling``: per tensor or per
  output channel) and its block inputs rounded per token (W8A8, as vLLM's dynamic FP8), bf16
  otherwise. The trainer stays fp32.
- ``fp8-e2e``: as ``fp8-rollout``, and the *training* forward is FP8-emulated as well, with the
  finer per-channel weight scaling of FP8 training recipes (straight-through gradients). Both sides
  round, differently, so the mismatch remains.

Embeddings, norms and ``lm_head`` are never rounded to FP8 (serving engines keep them high
precision).
"""

from __future__ import annotations

import copy

import torch

from pdmask.backends.sim.fp8 import fake_quant_fp8
from pdmask.backends.sim.model import TinyDecoder

TRAINER_FP8_SCALING = "per-channel"
FP8_ROLLOUT = ("fp8-rollout", "fp8-e2e")  # settings whose behaviour copy runs in FP8


def configure_trainer(trainer: TinyDecoder, precision: str) -> TinyDecoder:
    """Switch the trainer's FP8 emulation on for ``fp8-e2e`` (off otherwise)."""
    e2e = precision == "fp8-e2e"
    for layer in trainer.quant_linears():
        layer.weight_fp8 = TRAINER_FP8_SCALING if e2e else None
        layer.activation_fp8 = e2e
    return trainer


def make_behaviour(trainer: TinyDecoder, precision: str) -> TinyDecoder:
    """A bf16 behaviour copy set up for ``precision`` (weights: call :func:`sync_behaviour`)."""
    behaviour = copy.deepcopy(trainer).to(torch.bfloat16)
    behaviour.requires_grad_(False)
    behaviour.eval()
    for layer in behaviour.quant_linears():
        # Weights are rounded once at sync (as an engine stores them); activations per forward.
        layer.weight_fp8 = None
        layer.activation_fp8 = precision in FP8_ROLLOUT
    return behaviour


@torch.no_grad()
def sync_behaviour(
    trainer: TinyDecoder, behaviour: TinyDecoder, precision: str, fp8_scaling: str = "per-tensor"
) -> None:
    """Copy the trainer's weights into the behaviour copy the way the setting's engine holds them."""
    fp8 = precision in FP8_ROLLOUT
    quantised = {id(m.weight) for m in trainer.quant_linears()} if fp8 else set()
    for (_, src), (_, dst) in zip(
        trainer.named_parameters(), behaviour.named_parameters(), strict=True
    ):
        value = fake_quant_fp8(src.detach(), fp8_scaling) if id(src) in quantised else src
        dst.copy_(value.to(dst.dtype))
