"""What a trial costs: its step time, GPU-hours, checkpoint disk and collective timeout.

Every number here is an *estimate* from the formulas below and the stated assumptions; measured
step times replace the step estimate once trials report (``tracking/step_times.py``, ``pdm sweep
--dry-run``). Nothing here ran on a GPU.

**Step time.** Tokens per step from the setup: ``prompts x group x (mean prompt + mean response)``
for training and ``prompts x group x mean response`` for generation (``MEAN_RESPONSE_TOKENS`` and
``MEAN_PROMPT_TOKENS`` are assumptions: Qwen3 base models under DAPO-style RL answer in 1.5k
tokens early and 3k later, the middle is taken; DAPO-Math prompts are short). FLOPs: ``8 x
N_active x tokens`` for training (forward 2, backward 4, checkpoint recompute 2; bypass mode
computes no old log-probs) and ``2 x N_active x tokens`` for generation. Seconds: FLOPs over the
trial's GPUs x peak dense BF16 FLOP/s (``GPU_PEAK_TFLOPS``) x an MFU. Training MFU: 0.50 for a
dense model on FSDP, 0.25 for a MoE under FSDP/HF (no expert parallelism in training), as
scale-path's H20 review states them. Generation MFU from verl's published H20 step times, as the
ratio of generation to actor-update time at the same token count (which needs no mean length):
Qwen2.5-Math-7B, FSDP2 + vLLM, 512 x 16, 32 H20 (verl ``docs/advance/fully_async.md``, colocated
sync): generation 357 s, update 270 s; Qwen3-30B-A3B, Megatron + vLLM, 512 x 16, 128 H20:
generation 348 s, update 86 s (that update's MFU taken as the dense 0.50, Megatron's experts being
parallel). **Per trial**: steps x step time, plus validations (before training and every
``test_freq`` steps: ``val_prompts x val_samples`` responses at generation speed), one start-up
(``STARTUP_SECONDS``: model load, vLLM start, the first weight sync) and the saves (checkpoint
bytes over ``SHARE_WRITE_GB_PER_S``). Retries are not included.

**Checkpoints**, what one save of the actor holds (``save_contents`` model, optimizer, extra), by
the engine that trains it (``Workload.training_engine``):

- verl 0.9.1's FSDP checkpoint: the fp32 model (4 bytes a parameter; verl's FSDP keeps fp32
  master weights) plus Adam's m and v (8 bytes), 12 bytes a parameter, plus 2 when the save
  also writes HF weights (``hf_model``).
- verl 0.9.1's Megatron checkpoint (``utils/checkpoint/megatron_checkpoint_manager.py``, layout
  v2, with the defaults pdmask keeps: ``use_dist_checkpointing=False``, Megatron-Bridge, the
  distributed optimizer in ``dp_reshardable`` shards): ``model/huggingface/``, the weights in HF
  format through the bridge (bf16, 2 bytes: the ``model`` slot *is* the HF weights, so
  ``hf_model`` adds nothing, verl deduplicates it); ``optimizer/dist_ckpt/``, Megatron-Core's
  distributed optimizer's state (``distrib_optimizer.py``): per parameter its fp32 main copy
  and Adam's m and v in fp32 (12 bytes), each parameter's state held once, sharded over the
  data-parallel ranks (the experts' over the expert-data-parallel ranks), every rank writing its
  own shard; ``extra/``, RNG states and the transformer config (kilobytes). 14 bytes a parameter
  with or without ``hf_model``. FP8 training changes none of it: Transformer Engine's block-wise
  recipe quantizes inside the GEMMs and keeps the bf16 weights and the fp32 main copies (no
  ``fp8_param_gather``), so neither the export nor the optimizer's shards hold FP8 tensors.

A running trial holds ``max_actor_ckpt_to_keep`` saves plus the one being written; a finished
trial keeps what its profile's retention policy says once ``pdm clean`` ran
(``finished_keeps``): on FSDP its last save's model shards (4 bytes a parameter) or its HF
weights (2); on Megatron its HF weights (2) either way, the optimizer's and RNG states'
folders going.

**Collective timeout.** A save ends in a barrier over every rank: the ranks that finish first wait
for the slowest. All ranks write at once, so the save takes ``bytes / SHARE_WRITE_GB_PER_S``;
the timeout is three times that, at least ``COLLECTIVE_TIMEOUT_FLOOR`` (verl's FP8 MoE recipe
sets 1,800 s, and torch's default for the process group verl 0.9.1 creates is 30 minutes). On
Megatron the save's bytes are the Megatron save's; Megatron-Core's own tensor-, data- and
expert-parallel groups keep ``distributed_timeout_minutes``' 30 minutes (verl 0.9.1 passes none),
which the paper's cells, at the floor, do not exceed.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field

from pdmask.registry.catalog import CLUSTERS, MODELS, TrainingEngine

GB = 1e9
MEAN_RESPONSE_TOKENS = 2250  # assumption: 1.5k early, 3k late (scale-path section 3)
MEAN_PROMPT_TOKENS = 256  # assumption: DAPO-Math and AIME prompts with the chat template
GPU_PEAK_TFLOPS = {"H20": 148.0, "H100": 989.0, "H200": 989.0}  # dense BF16 (vendors' tables)
TRAIN_MFU = {"dense": 0.50, "moe": 0.25}
# (generation seconds, update seconds) of verl's published H20 runs, and the update's MFU
CALIBRATION = {"dense": (357.0, 270.0, 0.50), "moe": (348.0, 86.0, 0.50)}
STARTUP_SECONDS = 900.0  # assumption: model load from the share, vLLM start, the first sync
SHARE_WRITE_GB_PER_S = 1.0  # assumption: the checkpoint share's aggregate write bandwidth
COLLECTIVE_TIMEOUT_FLOOR = 1800.0
COLLECTIVE_TIMEOUT_SAFETY = 3.0
MODEL_BYTES, ADAM_BYTES, HF_BYTES = 4, 8, 2  # per parameter: fp32 master, fp32 m + v, bf16
# One save, bytes a parameter (module docstring): FSDP's fp32 model shards and Adam state (HF
# weights on top when asked); Megatron's HF export and its optimizer's fp32 main copy and Adam
# state, whatever is asked
SAVE_BYTES: dict[TrainingEngine, int] = {
    "fsdp": MODEL_BYTES + ADAM_BYTES,
    "megatron": HF_BYTES + MODEL_BYTES + ADAM_BYTES,
}


def generation_mfu(kind: str) -> float:
    """Generation MFU implied by a calibration run: its generation took ``gen / update`` times
    its update, whose FLOPs per token are 4x generation's (8N against 2N)."""
    gen_s, update_s, update_mfu = CALIBRATION[kind]
    return update_mfu * (2 / 8) * update_s / gen_s


class Workload(BaseModel):
    """What one trial computes and saves: the backend's setup, in the cost model's terms."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prompts: int = Field(gt=0, description="Prompts per step (`data.train_batch_size`).")
    group_size: int = Field(gt=0, description="Responses per prompt.")
    steps: int = Field(gt=0, description="RL steps of the trial.")
    val_prompts: int = Field(ge=0, description="Validation prompts (AIME24 + AIME25: 60).")
    val_samples: int = Field(ge=0, description="Samples per validation prompt.")
    test_freq: int = Field(gt=0, description="Validate every this many steps.")
    save_freq: int = Field(gt=0, description="Save every this many steps (and at the last).")
    checkpoints_kept: int = Field(gt=0, description="verl's `max_actor_ckpt_to_keep`.")
    hf_weights: bool = Field(False, description="Every save also writes HF weights.")
    training_engine: TrainingEngine = Field(
        "fsdp",
        description="verl's engine that trains it (`catalog.training_engine`): what a save "
        "holds and what a finished trial keeps.",
    )


def _kind(model: str) -> str:
    shape = MODELS[model].shape
    return "moe" if shape is not None and shape.is_moe else "dense"


def params(model: str) -> tuple[float, float]:
    """(total, active) parameters: from the model's shapes when it has them, else the
    catalog's counts."""
    spec = MODELS[model]
    if spec.shape is not None:
        return float(spec.shape.params_total()), float(spec.shape.params_active())
    return spec.params_total_b * 1e9, spec.params_active_b * 1e9


def save_bytes(model: str, hf_weights: bool = False, engine: TrainingEngine = "fsdp") -> float:
    """Bytes of one verl save of the actor on ``engine`` (the module docstring)."""
    total, _ = params(model)
    extra_hf = HF_BYTES if hf_weights and engine == "fsdp" else 0  # Megatron's model slot is HF
    return total * (SAVE_BYTES[engine] + extra_hf)


def finished_keeps(retention: str, engine: TrainingEngine) -> str:
    """What a finished trial keeps once ``pdm clean`` ran: the profile's ``finished_checkpoint``
    on FSDP; on Megatron its HF weights, which are its saves' model weights."""
    return "hf-weights" if engine == "megatron" else retention


def saves(workload: Workload) -> int:
    return math.ceil(workload.steps / workload.save_freq)  # verl saves at the last step too


class TrialCost(BaseModel):
    """A trial's estimate, each part in seconds (``basis`` says where the step time is from)."""

    step_seconds: float
    basis: str = Field(description="`estimate` (FLOP model), `measured` or `catalog`.")
    train_seconds: float
    validation_seconds: float
    startup_seconds: float
    save_seconds: float
    gpus: int
    gpu_hours: float
    save_gb: float = Field(description="One save of the actor (`save_bytes`).")
    running_disk_gb: float = Field(description="Checkpoint bytes while the trial runs (peak).")
    finished_keeps: str = Field(description="What it keeps after `pdm clean` (`finished_keeps`).")
    finished_disk_gb: float = Field(description="Checkpoint bytes it keeps after `pdm clean`.")
    uncleaned_disk_gb: float = Field(
        description="What verl leaves when nothing cleans: its kept saves."
    )
    collective_timeout_s: int


def _seconds(flops: float, gpus: int, gpu_kind: str, mfu: float) -> float:
    return flops / (gpus * GPU_PEAK_TFLOPS[gpu_kind] * 1e12 * mfu)


def collective_timeout(
    model: str, hf_weights: bool = False, engine: TrainingEngine = "fsdp"
) -> int:
    """Seconds a collective may wait (the barrier after a save on ``engine``), with the floor."""
    save_s = save_bytes(model, hf_weights, engine) / (SHARE_WRITE_GB_PER_S * GB)
    return int(max(COLLECTIVE_TIMEOUT_FLOOR, COLLECTIVE_TIMEOUT_SAFETY * save_s))


def trial_cost(
    model: str,
    cluster: str,
    workload: Workload,
    measured_step_seconds: float | None = None,
) -> TrialCost | None:
    """The trial's cost on a cluster profile; None where the model does not run there."""
    profile = CLUSTERS[cluster]
    need = MODELS[model].gpu_needs.get(profile.gpu_kind)
    if need is None:
        return None
    gpus, kind = need.gpus, _kind(model)
    _, active = params(model)
    responses = workload.prompts * workload.group_size
    val_responses = workload.val_prompts * workload.val_samples
    validations = workload.steps // workload.test_freq + 1  # and one before training
    peak = GPU_PEAK_TFLOPS.get(profile.gpu_kind)
    if peak is None:  # a CPU profile: the catalog's measured seconds per step, no FLOP model
        step, basis, train_s, val_s = need.seconds_per_step, "catalog", 0.0, 0.0
    else:
        gen_mfu = generation_mfu(kind)
        train_flops = 8 * active * responses * (MEAN_PROMPT_TOKENS + MEAN_RESPONSE_TOKENS)
        gen_flops = 2 * active * responses * MEAN_RESPONSE_TOKENS
        train_s = _seconds(train_flops, gpus, profile.gpu_kind, TRAIN_MFU[kind])
        step = train_s + _seconds(gen_flops, gpus, profile.gpu_kind, gen_mfu)
        basis = "estimate"
        val_flops = 2 * active * val_responses * MEAN_RESPONSE_TOKENS
        val_s = validations * _seconds(val_flops, gpus, profile.gpu_kind, gen_mfu)
    if measured_step_seconds is not None:
        # the median step of verl's `timing_s/step`: a save falls on one step in `save_freq`
        step, basis = measured_step_seconds, "measured"
    engine = workload.training_engine
    one_save = save_bytes(model, workload.hf_weights, engine)
    save_s = saves(workload) * one_save / (SHARE_WRITE_GB_PER_S * GB)
    startup = STARTUP_SECONDS if peak is not None else 0.0
    total = workload.steps * step + val_s + startup + save_s
    total_params, _ = params(model)
    keeps = finished_keeps(profile.finished_checkpoint, engine)
    kept = {"last-weights": MODEL_BYTES, "hf-weights": HF_BYTES}[keeps]
    return TrialCost(
        step_seconds=round(step, 1),
        basis=basis,
        train_seconds=round(workload.steps * train_s, 1),
        validation_seconds=round(val_s, 1),
        startup_seconds=startup,
        save_seconds=round(save_s, 1),
        gpus=gpus,
        gpu_hours=round(gpus * total / 3600, 1),
        save_gb=round(one_save / GB, 1),
        running_disk_gb=round((workload.checkpoints_kept + 1) * one_save / GB, 1),
        finished_keeps=keeps,
        finished_disk_gb=round(total_params * kept / GB, 1),
        uncleaned_disk_gb=round(workload.checkpoints_kept * one_save / GB, 1),
        collective_timeout_s=collective_timeout(model, workload.hf_weights, engine),
    )
