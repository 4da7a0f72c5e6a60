"""pdmask's logits hook inside verl's Megatron engine: the same statistics as on FSDP
(``processor``), from vocabulary-parallel logits.

verl 0.9.1's ``MegatronEngineWithLMHead._lm_head_logits_processor`` calls the actor's loss
function as ``loss_fn(student_logits=logits, data=micro_batch, data_format=...)`` when the
micro-batch carries ``distillation_use_topk``, the FSDP engine's hook, with two differences:

- the logits are this tensor-parallel rank's ``V / TP`` columns of the (padded) vocabulary,
  so the pass runs on the shard with the TP group (``trust_region.vocab_parallel``): every
  statistic is the full vocabulary's, the same on every rank, and each rank's gradient is its
  columns' (verl's loss is the same on every TP rank);
- the rows are Megatron's micro-batch layout, which the hook must reproduce for mu's top-K rows
  and the sampled ids: ``thd`` (``use_remove_padding``, the default) packs the sequences, each
  padded to a multiple of TP (and, with FP8 training, of 16, the last up to the FP8 total
  alignment), as ``(1, T, V/TP)``; ``bshd`` pads every sequence to the longest as
  ``(B, S, V/TP)``. verl's own ``preprocess_thd_engine`` / ``preprocess_bshd_engine`` place the
  rows here exactly as they place the labels (``need_roll`` for the sampled ids), and its
  ``postprocess_*_engine`` take the hook's outputs back to the samples.

Context parallelism (each rank a slice of every sequence, zigzagged) is refused: the hook would
need mu's rows cut the same way and the pass's statistics of a row are complete on one rank
only. So is the old-policy pass (``pdm_mu_source=recompute``): pi_old's top-K over a vocabulary
split across ranks needs a top-K merge across the group, not written yet.
"""

from __future__ import annotations

import torch

from pdmask.backends.verl.layout import SENTINEL, packed_rows
from pdmask.backends.verl.processor import StatsSettings, row_outputs
from pdmask.errors import ConfigError
from pdmask.trust_region.stats import GRADIENT_INPUTS
from pdmask.trust_region.vocab_parallel import VocabShard

FORMATS = ("thd", "bshd")


def refuse_unsupported(cp_size: int, old_phase: bool) -> None:
    """A clear error where the hook cannot compute on Megatron (module docstring)."""
    if cp_size > 1:
        raise ConfigError(
            f"actor_rollout_ref.actor.megatron.context_parallel_size={cp_size}: pdmask's logits "
            "hook needs each sequence whole on one rank; set context_parallel_size=1"
        )
    if old_phase:
        raise ConfigError(
            "pdm_mu_source=recompute on verl's Megatron engine: pi_old's top-K over a "
            "vocabulary split across tensor-parallel ranks is not supported; use "
            "pdm_mu_source=rollout"
        )


def aligned_rows(data, k: int, data_format: str, fp8_padding: bool, device):
    """``(sampled [N], top-K ids [N, K+1], log-probs [N, K+1], shape)`` in the rows of the
    engine's logits (``shape``: the logits' leading dims, ``(1, T)`` or ``(B, S)``): verl's own
    preprocessing of the micro-batch (padding rows: id 0, log-prob ``SENTINEL``)."""
    from verl.models.mcore.util import preprocess_bshd_engine, preprocess_thd_engine

    if data_format not in FORMATS:
        raise ValueError(f"data_format must be one of {FORMATS}, got {data_format!r}")
    preprocess = preprocess_thd_engine if data_format == "thd" else preprocess_bshd_engine
    input_ids = data["input_ids"]
    ids, lps = packed_rows(data, k)
    offsets = input_ids.offsets()

    def placed(values: torch.Tensor, *, roll: bool = False) -> torch.Tensor:
        nested = torch.nested.nested_tensor_from_jagged(values, offsets)
        return preprocess(nested, pre_process=True, need_roll=roll, use_fp8_padding=fp8_padding)[0]

    sampled = placed(input_ids.values(), roll=True)  # the engine's labels: token i + 1
    shape = tuple(sampled.shape)
    top_ids = placed(ids.to(input_ids.device))
    # the padding rows (zeros) hold invalid slots: SENTINEL log-probs
    real = placed(torch.ones(len(ids), 1, dtype=torch.bool, device=input_ids.device))
    top_lps = torch.where(real, placed(lps.to(input_ids.device)), SENTINEL)
    flat = (-1, k + 1)
    return (
        sampled.reshape(-1).to(device),
        top_ids.reshape(flat).to(device),
        top_lps.reshape(flat).to(device),
        shape,
    )


def megatron_statistics_outputs(
    student_logits: torch.Tensor,
    data,
    settings: StatsSettings,
    *,
    data_format: str,
    fp8_padding: bool,
    tp_group=None,
) -> dict[str, torch.Tensor]:
    """The math API's statistics for every row of the engine's vocabulary-parallel logits
    (``(1, T, V/TP)`` or ``(B, S, V/TP)``), shaped like its rows. ``tp_group``: the tensor-
    parallel group (None: Megatron's, ``parallel_state``)."""
    if tp_group is None:
        from megatron.core import parallel_state as mpu

        refuse_unsupported(mpu.get_context_parallel_world_size(), old_phase=False)
        tp_group = mpu.get_tensor_model_parallel_group()
    width = student_logits.shape[-1]
    sampled, ids, lps, shape = aligned_rows(
        data, settings.topk, data_format, fp8_padding, student_logits.device
    )
    if shape != tuple(student_logits.shape[:-1]):
        raise ValueError(
            f"mu's top-K rows in Megatron's {data_format} layout are {shape}, the logits' "
            f"{tuple(student_logits.shape[:-1])} (FP8 padding {fp8_padding})"
        )
    differentiable = set(settings.inputs) & set(GRADIENT_INPUTS)
    shard = VocabShard.of(width, tp_group)
    with torch.set_grad_enabled(torch.is_grad_enabled() and bool(differentiable)):
        logits = student_logits.reshape(-1, width)
        out = row_outputs(logits, sampled, ids, lps, settings, differentiable, shard)
    return {name: value.reshape(shape) for name, value in out.items()}
