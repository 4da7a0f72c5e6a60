"""Part (b): pdmask's logits hook inside verl's engine output path, time and peak memory.

A Qwen3 (random weights, the real 151,936-wide head, bf16) runs forward on a packed micro-batch of
~16k tokens; verl 0.9.1's ``FSDPEngineWithLMHead.prepare_model_inputs`` / ``prepare_model_outputs``
wrap the forward exactly as in training, once with verl's own log-prob path only and once with
pdmask's hook (``processor.statistics_outputs``) switched on; then backward through the
log-probs. The peak is absolute (model, activations, logits and all), as a training step sees it.
The model runs unsharded: on one GPU, FSDP would hold all of it anyway.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import torch

from .batches import packed_batch
from .measure import gb, interleaved, say
from .models import QWEN3_0_6B, TINY, qwen3_config


@dataclass(frozen=True)
class Size:
    shape: dict
    layers: int
    sequences: int
    prompt: int
    response: int
    topk: int


FULL = Size(QWEN3_0_6B, layers=4, sequences=8, prompt=256, response=1792, topk=20)
SMALL = Size(TINY, layers=2, sequences=2, prompt=8, response=24, topk=4)


def _engine():
    """verl's engine object for its input/output methods only (they read these attributes)."""
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    engine = object.__new__(FSDPEngineWithLMHead)
    engine.pad_to_length = False
    engine.use_ulysses_sp = False
    engine.ulysses_sequence_parallel_size = 1
    engine.use_remove_padding = True
    engine.use_fused_kernels = False
    return engine


def run(device: torch.device, size: Size, repeats: int) -> dict:
    from transformers import Qwen3ForCausalLM
    from verl.utils import tensordict_utils as tu

    from pdmask.backends.verl.processor import StatsSettings, statistics_outputs

    config = qwen3_config(size.shape, num_hidden_layers=size.layers)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).to(device=device, dtype=torch.bfloat16)
    data = packed_batch(
        config.vocab_size, size.topk, size.sequences, size.prompt, size.response, size.sequences
    ).to(device)
    tokens = size.sequences * (size.prompt + size.response)
    engine = _engine()
    settings = StatsSettings(method="pdm-agg", topk=size.topk)

    def hook(student_logits, data):
        return statistics_outputs(student_logits, data, settings)

    def step(with_hook: bool):
        def call():
            tu.assign_non_tensor_data(data, "distillation_use_topk", with_hook)
            inputs, output_args = engine.prepare_model_inputs(data)
            out = model(
                input_ids=inputs["input_ids"], position_ids=inputs["position_ids"], use_cache=False
            )
            outputs = engine.prepare_model_outputs(
                SimpleNamespace(logits=out.logits), output_args, data, hook if with_hook else None
            )
            outputs["log_probs"].values().sum().backward()
            return sorted(k for k in outputs if k.startswith("pdm_stat_"))

        return call

    stat_keys = step(True)()
    if not stat_keys:
        raise RuntimeError("the hook produced no pdmask statistics")

    def drop_gradients():  # the last call's gradients are not this call's memory
        model.zero_grad(set_to_none=True)

    timed = interleaved(
        {"verl": step(False), "verl+pdmask": step(True)}, device, repeats, drop_gradients
    )
    base, hooked = timed["verl"], timed["verl+pdmask"]
    record = {
        "layers": size.layers,
        "hidden": config.hidden_size,
        "vocab": config.vocab_size,
        "tokens": tokens,
        "repeats": repeats,
        "verl_ms": round(base.median_s * 1e3, 2),
        "pdmask_ms": round(hooked.median_s * 1e3, 2),
        "time_ratio": round(hooked.median_s / base.median_s, 3),
        "verl_peak_gb": gb(base.absolute_peak_bytes),
        "pdmask_peak_gb": gb(hooked.absolute_peak_bytes),
        "peak_ratio": None
        if base.absolute_peak_bytes is None
        else round(hooked.absolute_peak_bytes / base.absolute_peak_bytes, 3),
        "stat_outputs": len(stat_keys),
    }
    say(
        f"\n(b) logits hook in verl's engine output path: {size.layers}-layer Qwen3 (hidden "
        f"{config.hidden_size}, V={config.vocab_size}, bf16), {tokens} packed tokens, fwd+bwd, "
        f"median of {repeats}\n    verl only: {record['verl_ms']} ms, peak {record['verl_peak_gb']} GB"
        f"\n    with pdmask's hook: {record['pdmask_ms']} ms, peak {record['pdmask_peak_gb']} GB"
        f" (time x{record['time_ratio']}, peak x{record['peak_ratio']})"
    )
    return record
