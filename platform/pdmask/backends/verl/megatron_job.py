"""A trial's actor keys on verl's Megatron engine: the layout, FP8 training, recompute, checkpoints.

A setting trains on Megatron where ``catalog.training_engine`` says so (``fp8-e2e`` on the
paper's profile: verl 0.9.1 trains in FP8 only there). The job is then verl's ``ppo_trainer``
with ``model_engine=megatron`` (what verl's deprecated ``ppo_megatron_trainer.yaml`` selects), and
its actor carries, instead of the FSDP keys:

- the parallel layout ``training_layout`` derives from the model's shapes and the node shape:
  ``tensor/pipeline/expert/expert_tensor_model_parallel_size``, context parallel 1 (pdmask's
  logits hook refuses more), sequence parallel with TP > 1 (verl's and Megatron-Bridge's rule);
- FP8 training where the precision asks for it (``PrecisionSpec.megatron_fp8``), the keys of
  verl-recipe's ``low_precision/run_dapo_qwen3_moe_30b_megatron_fp8e2e.sh``: Transformer
  Engine's ``fp8=e4m3`` with ``fp8_recipe=blockwise`` in the transformer config and the
  optimizer's, dropout 0, and ``NVTE_FP8_BLOCK_SCALING_FP32_SCALES=1`` in every process's
  environment (``job_env``); the rollout's FP8 keys are the precision's as on FSDP;
- for a MoE, the router in FP32 (``moe_router_dtype=fp32``, the same recipe);
- full recompute, one layer at a time (``recompute_granularity=full``, ``uniform``, 1);
- verl's default bridge (Megatron-Bridge, ``vanilla_mbridge=False``) loading the HF weights, and
  Megatron's distributed optimizer; verl's Megatron checkpoint manager then saves Megatron's
  distributed checkpoint format (per-rank shards of the model and optimizer; ``hf_model`` in the
  save contents adds HF weights through the bridge, as on FSDP).
"""

from __future__ import annotations

from typing import Any

from pdmask.registry.catalog import MODELS, PRECISIONS
from pdmask.registry.training_layout import TrainingLayout

_A = "actor_rollout_ref.actor"
_M = f"{_A}.megatron"
_TC = f"{_M}.override_transformer_config"
ENGINE_KEY = "model_engine"
FP8_ENV = {"NVTE_FP8_BLOCK_SCALING_FP32_SCALES": "1"}  # TE's block-wise FP8 with FP32 scales


def megatron_keys(model: str, layout: TrainingLayout, seed: int, grad_clip) -> dict[str, Any]:
    """The actor's Megatron keys of one trial (``extra`` of ``verl_overrides``); the gradient
    clip is the optimizer's there (``McoreOptimizerConfig.clip_grad``)."""
    spec = MODELS[model]
    keys: dict[str, Any] = {
        f"{_M}.tensor_model_parallel_size": layout.tp,
        f"{_M}.pipeline_model_parallel_size": layout.pp,
        f"{_M}.expert_model_parallel_size": layout.ep,
        f"{_M}.expert_tensor_parallel_size": layout.etp,
        f"{_M}.context_parallel_size": 1,
        f"{_M}.sequence_parallel": layout.tp > 1,
        f"{_M}.use_distributed_optimizer": True,
        f"{_M}.use_mbridge": True,
        f"{_M}.vanilla_mbridge": False,
        f"{_M}.param_offload": spec.param_offload,
        f"{_M}.optimizer_offload": spec.param_offload,
        f"{_M}.seed": seed,
        f"{_A}.optim.clip_grad": grad_clip,
        f"{_TC}.recompute_granularity": "full",
        f"{_TC}.recompute_method": "uniform",
        f"{_TC}.recompute_num_layers": 1,
    }
    if spec.shape is not None and spec.shape.is_moe:
        keys[f"+{_TC}.moe_router_dtype"] = "fp32"
    if layout.fp8:
        keys.update(
            {
                f"+{_TC}.fp8": "e4m3",
                f"+{_TC}.fp8_recipe": "blockwise",
                f"+{_A}.optim.override_optimizer_config.fp8_recipe": "blockwise",
                f"+{_TC}.attention_dropout": 0.0,
                f"+{_TC}.hidden_dropout": 0.0,
            }
        )
    return keys


def precision_description(precision: str, layout: TrainingLayout | None) -> str:
    """What the job runs in ``precision``: on Megatron its own description (FP8 training)."""
    return PRECISIONS[precision].on_engine("megatron" if layout else "fsdp")[1]
