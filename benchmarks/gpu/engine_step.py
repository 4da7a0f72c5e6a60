"""Part (c): optimizer steps of a Qwen3-0.6B-shaped model through verl's FSDP engine.

verl 0.9.1's own ``FSDPEngineWithLMHead`` is built as its actor builds it (``initialize``: the
model loaded from a folder, wrapped in FSDP2 with verl's mixed precision, AdamW), in a process
group of one; the model's weights are random, saved from a config (no tokenizer, no download).
Each step is the actor's update of one mini-batch: ``forward_backward_batch`` with pdmask's actor
loss (``pdm_ppo_loss``: the logits hook, then the ``pdm_agg`` recipe's mask and loss inside verl's
``ppo_loss``) over packed micro-batches with mu's top-K and non-zero advantages, then
``optimizer_step`` (clip, AdamW). Two steps: the first pays for warm-up, the second is the figure.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from functools import partial

import torch

from .batches import packed_batch
from .measure import gb, say, sync
from .models import QWEN3_0_6B, TINY, qwen3_config
from .recipes import DELTA, recipe_with_params

RECIPE = "pdm-agg"


@dataclass(frozen=True)
class Size:
    shape: dict
    sequences: int
    prompt: int
    response: int
    micro_batch: int
    topk: int


FULL = Size(QWEN3_0_6B, sequences=8, prompt=256, response=1792, micro_batch=2, topk=20)
SMALL = Size(TINY, sequences=4, prompt=8, response=24, micro_batch=2, topk=4)


def _carry_recipe() -> str:
    """The recipe goes into this process's environment the way a VeRL job carries it
    (``file_recipes``), so that pdmask's plugin registers its loss name in verl."""
    from pdmask.backends.verl.file_recipes import FileRecipe, declared

    recipe, params = recipe_with_params(RECIPE)
    os.environ.update(FileRecipe.of(recipe, params, "bf16").env())
    declared.cache_clear()  # `import verl` read the (then empty) environment already
    from pdmask.backends.verl.plugin import register_losses

    register_losses()
    return recipe.verl_name


def _process_group(device: torch.device) -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        return
    if device.type == "cpu":
        from pdmask.backends.verl import cpu_platform

        cpu_platform.register_engine()
        cpu_platform.init_process_group()
        return
    store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "pg"), 1)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1)


def build_engine(device: torch.device, size: Size, folder: str):
    from transformers import Qwen3ForCausalLM
    from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig
    from verl.workers.config.checkpoint import CheckpointConfig
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    torch.manual_seed(0)
    Qwen3ForCausalLM(qwen3_config(size.shape)).save_pretrained(folder)
    model = HFModelConfig(
        path=folder,
        load_tokenizer=False,
        use_remove_padding=True,
        override_config={"attn_implementation": "sdpa"},
    )
    engine = FSDPEngineWithLMHead(
        model,
        FSDPEngineConfig(strategy="fsdp2", use_torch_compile=False),
        FSDPOptimizerConfig(lr=1e-6, clip_grad=1.0),
        CheckpointConfig(),
    )
    engine.initialize()
    return engine


def run(device: torch.device, size: Size) -> dict:
    from verl.utils.metric import reduce_metrics
    from verl.workers.config import ActorConfig

    from pdmask.backends.verl.config import PDMPolicyLossConfig
    from pdmask.backends.verl.loss import pdm_ppo_loss

    loss_mode = _carry_recipe()
    _process_group(device)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        engine = build_engine(device, size, folder)
    init_s = time.perf_counter() - started
    params = sum(p.numel() for p in engine.module.parameters())
    actor = ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=size.micro_batch,
        policy_loss=PDMPolicyLossConfig(loss_mode=loss_mode, pdm_delta=DELTA, pdm_topk=size.topk),
    )
    loss_fn = partial(pdm_ppo_loss, config=actor)
    vocab = size.shape["vocab_size"]
    steps = []
    for step in range(2):
        data = packed_batch(
            vocab, size.topk, size.sequences, size.prompt, size.response, size.micro_batch, step
        )
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        sync(device)
        start = time.perf_counter()
        with engine.train_mode():
            engine.optimizer_zero_grad()
            out = engine.forward_backward_batch(data, loss_fn)
            grad_norm = engine.optimizer_step()
        sync(device)
        metrics = reduce_metrics(out["metrics"])  # verl's own reduction of its Metric lists
        steps.append(
            {
                "seconds": round(time.perf_counter() - start, 3),
                "peak_gb": gb(torch.cuda.max_memory_allocated(device))
                if device.type == "cuda"
                else None,
                "loss": float(sum(out["loss"]) / len(out["loss"])),
                "grad_norm": float(grad_norm),
                "masked_frac": _value(metrics.get("actor/pdm/masked_frac")),
                "pg_clipfrac": _value(metrics.get("actor/pg_clipfrac")),
            }
        )
    tokens = size.sequences * (size.prompt + size.response)
    record = {
        "recipe": RECIPE,
        "params": params,
        "layers": size.shape["num_hidden_layers"],
        "tokens_per_step": tokens,
        "micro_batches": size.sequences // size.micro_batch,
        "init_s": round(init_s, 2),
        "steps": steps,
        "tokens_per_s": round(tokens / steps[-1]["seconds"], 1),
    }
    last = steps[-1]
    say(
        f"\n(c) verl FSDP engine step, {params / 1e6:.1f}M-parameter Qwen3 ({record['layers']} "
        f"layers), {tokens} tokens in {record['micro_batches']} micro-batches, {RECIPE}: init "
        f"{record['init_s']} s, step {last['seconds']} s ({record['tokens_per_s']} tokens/s), "
        f"peak {last['peak_gb']} GB, loss {last['loss']:.4g}, grad norm {last['grad_norm']:.4g}, "
        f"masked {last['masked_frac']}"
    )
    return record


def _value(value) -> float | None:
    return None if value is None else round(float(value), 4)
