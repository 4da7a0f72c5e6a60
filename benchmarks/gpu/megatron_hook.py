"""Part ``megatron``: Megatron-Core's tensor-parallel group and pdmask's hook inside verl's
Megatron engine (``backends/verl/megatron_processor.py``), TP 2 on one device.

On the two ranks of ``tp_ranks``, ``parallel_state.initialize_model_parallel`` makes a TP-2 group
(megatron-core 0.16.1, carried as a wheel: ``wheels.txt``), and the groups it reports are
recorded. Then one packed micro-batch as verl's actor hands it over (``batches.packed_batch``:
mu's top-K rows, the sampled ids), with bf16 logits for its rows on the device, goes through
pdmask's hook twice: the FSDP hook (``processor.statistics_outputs``) on the full logits, and the
Megatron hook on this rank's vocabulary shard of the logits as verl's Megatron engine lays them
out: packed ``thd`` (each sequence padded to a multiple of TP), ``thd`` with FP8 padding (to 16)
and padded ``bshd``, mu's rows placed by verl's own ``preprocess_*_engine`` and the outputs taken
back to the samples by its ``postprocess_*_engine``. Every statistic must equal the FSDP hook's
on the rows that predict a token (the last row of a sequence predicts nothing), up to the
float32 roundings of adding the two shards' sums in another order (``TOLERANCE``, relative to
``1 + |value|``). Forward only: each rank's
gradient columns are part ``shard``'s.

What this does not run: verl's ``MegatronEngineWithLMHead`` itself (a model built by
Megatron-Bridge, Transformer Engine's layers, FP8 training), whose packages cannot travel to the
lent machine.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from .measure import say

LAYOUTS = {"thd": ("thd", False), "thd-fp8-padding": ("thd", True), "bshd": ("bshd", False)}


@dataclass(frozen=True)
class Size:
    vocab: int
    topk: int
    sequences: int
    prompt: int
    response: int  # prompt + response odd: the packed layout pads every sequence


FULL = Size(vocab=151_936, topk=20, sequences=8, prompt=128, response=895)
TINY = Size(vocab=64, topk=4, sequences=4, prompt=3, response=6)


def _groups() -> dict:
    from megatron.core import parallel_state as mpu

    return {
        "tensor_parallel": mpu.get_tensor_model_parallel_world_size(),
        "tensor_parallel_rank": mpu.get_tensor_model_parallel_rank(),
        "tensor_parallel_ranks": dist.get_process_group_ranks(
            mpu.get_tensor_model_parallel_group()
        ),
        "data_parallel": mpu.get_data_parallel_world_size(),
        "pipeline_parallel": mpu.get_pipeline_model_parallel_world_size(),
        "context_parallel": mpu.get_context_parallel_world_size(),
    }


def _placed(full: torch.Tensor, data, data_format: str, fp8_padding: bool):
    """The full logits in the engine's layout, and how to take a ``(1, T)`` / ``(B, S)`` output
    back to the packed rows of the samples."""
    from verl.models.mcore.util import (
        postprocess_bshd_engine,
        postprocess_thd_engine,
        preprocess_bshd_engine,
        preprocess_thd_engine,
    )

    input_ids = data["input_ids"].to(full.device)
    offsets = input_ids.offsets()
    rows = torch.nested.nested_tensor_from_jagged(full, offsets)
    if data_format == "thd":
        logits = preprocess_thd_engine(rows, use_fp8_padding=fp8_padding)[0]
        params = preprocess_thd_engine(input_ids, use_fp8_padding=fp8_padding)[1]

        def back(out):
            return postprocess_thd_engine(out, params, input_ids, len(offsets) - 1).values()

    else:
        logits, mask, _ = preprocess_bshd_engine(rows)

        def back(out):
            return postprocess_bshd_engine(out, mask.to(out.device)).values()

    return logits, back


def _logits(tokens: int, size: Size, device: torch.device) -> torch.Tensor:
    """Seeded bf16 logits for the micro-batch's rows, the same on every rank."""
    from .loss_paths import Size as LossSize
    from .loss_paths import make_inputs

    return make_inputs(LossSize(tokens, size.vocab, size.topk, chunk_rows=()), device, seed=5)[
        "logits"
    ].detach()


def _difference(got: torch.Tensor, want: torch.Tensor) -> float:
    """The largest difference relative to ``1 + |want|`` (absolute for log-probs and sums of
    probabilities, relative for large values such as a ratio)."""
    want = want.double()
    return float(((got.double() - want).abs() / (1 + want.abs())).max())


def run_rank(rank: int, device: torch.device, tiny: bool, repeats: int) -> dict:
    """This rank's groups, and the Megatron hook's largest difference from the FSDP hook per
    layout and statistic (``repeats``: unused, nothing is timed)."""
    from megatron.core import parallel_state as mpu

    from pdmask.backends.verl.megatron_processor import megatron_statistics_outputs
    from pdmask.backends.verl.processor import StatsSettings, statistics_outputs

    from .batches import packed_batch

    size = TINY if tiny else FULL
    tp = dist.get_world_size()
    mpu.initialize_model_parallel(tensor_model_parallel_size=tp)
    try:
        groups = _groups()
        data = packed_batch(
            size.vocab, size.topk, size.sequences, size.prompt, size.response, size.sequences
        )
        lengths = data["input_ids"].offsets().diff()
        full = _logits(int(lengths.sum()), size, device)
        settings = StatsSettings(
            method="pdm-agg", topk=size.topk, inputs=("entropy", "support_log_probs")
        )
        predicting = torch.ones(len(full), dtype=torch.bool, device=device)
        predicting[lengths.cumsum(0).to(device) - 1] = False  # a sequence's last row
        width = size.vocab // tp
        cols = slice(rank * width, (rank + 1) * width)
        with torch.no_grad():
            want = statistics_outputs(full.unsqueeze(0), data, settings)
            layouts = {}
            for name, (data_format, fp8_padding) in LAYOUTS.items():
                logits, back = _placed(full, data, data_format, fp8_padding)
                got = megatron_statistics_outputs(
                    logits[..., cols].contiguous(),
                    data,
                    settings,
                    data_format=data_format,
                    fp8_padding=fp8_padding,
                )
                errors = {
                    key: _difference(back(got[key])[predicting], value[0][predicting])
                    for key, value in want.items()
                }
                layouts[name] = {
                    "rows": list(got[next(iter(got))].shape),
                    "same_statistics": sorted(got) == sorted(want),
                    "errors": errors,
                }
        return {
            "groups": groups,
            "tokens": len(full),
            "vocab": size.vocab,
            "statistics": sorted(want),
            "layouts": layouts,
        }
    finally:
        mpu.destroy_model_parallel()


# float32 statistics of bf16 logits: log-probs near |lse| ~ 14 (V = 151,936) carry float32
# roundings of ~1e-6, and the two shards' sums added in another order than the full row's move
# them by a few of those; a row out of place or a shard's sum missing moves them by O(1)
TOLERANCE = 1e-4


def combine(ranks: list[dict]) -> dict:
    layouts = {
        name: {
            "rows": ranks[0]["layouts"][name]["rows"],
            "same_statistics": all(r["layouts"][name]["same_statistics"] for r in ranks),
            "max_difference": max(max(r["layouts"][name]["errors"].values()) for r in ranks),
        }
        for name in LAYOUTS
    }
    record = {
        "groups": [r["groups"] for r in ranks],
        "tokens": ranks[0]["tokens"],
        "vocab": ranks[0]["vocab"],
        "statistics": ranks[0]["statistics"],
        "layouts": layouts,
        "tolerance": TOLERANCE,
        "matches": all(
            v["same_statistics"] and v["max_difference"] <= TOLERANCE for v in layouts.values()
        ),
    }
    say(
        f"\nmegatron: parallel_state TP {ranks[0]['groups']['tensor_parallel']} (ranks "
        f"{ranks[0]['groups']['tensor_parallel_ranks']}); the hook on shards against the FSDP "
        f"hook on full logits, {record['tokens']} tokens x V = {record['vocab']}"
    )
    for name, v in layouts.items():
        say(f"{name:>16}: rows {v['rows']}, largest difference {v['max_difference']:.3e}")
    say(f"    matches (<= {TOLERANCE:g}): {record['matches']}")
    return record
