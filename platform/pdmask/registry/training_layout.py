"""The training engine's parallel layout on verl's Megatron engine, from each model's shapes.

Beside ``engine_rules.rollout_layout`` (vLLM's layout) and in its style: for a model, a precision
and a cluster profile whose setting trains on Megatron (``catalog.training_engine``),
``training_layout`` gives Megatron's tensor, pipeline, expert and expert-tensor parallel sizes,
or refuses the cell with every rule each candidate breaks. The job builder writes the layout
into verl's ``actor.megatron`` config (``backends/verl/megatron_job.py``) and the plan shows it;
both read this module, which imports neither torch nor Megatron.

The rules, with where Megatron-Core (0.16) enforces each:

- ``placement``: TP within one node; ``TP x PP`` and ``EP x ETP x PP`` divide the trial's GPUs
  (``parallel_state.initialize_model_parallel``: the data-parallel and the expert-data-parallel
  sizes must be whole); context parallelism stays 1 (pdmask's logits hook refuses it).
- ``heads``: attention heads and KV heads (query groups) divisible by TP
  (``transformer/attention.py``: ``divide(num_query_groups, world_size)``; unlike vLLM,
  Megatron does not replicate KV heads).
- ``layers``: layers divisible by PP (the even split verl's Megatron config asks for).
- ``experts``: experts divisible by EP (``moe/moe_layer.py``); EP only on a MoE model.
- ``fp8-training-gpu``: FP8 training is Transformer Engine's (without it Megatron's FP8 context
  is ``nullcontext``: a silent no-op); its block-wise recipe (``fp8_recipe=blockwise``, what
  verl-recipe's FP8 end-to-end MoE run uses) needs compute capability 9.0 (Hopper) or newer,
  and never runs on a CPU profile.
- ``fp8-training-dims``: TE's FP8 GEMMs take dimensions divisible by 16
  (``transformer_engine.pytorch.utils.assert_dim_for_fp8_exec``): the hidden size and each
  projection's width per TP rank (an expert's per ETP rank).
- ``train-memory``: the model's state per GPU, *estimated*: bf16 weights and fp32 gradients of
  the rank's model-parallel shard, and, with verl's distributed optimizer, fp32 master weights
  and two Adam moments shared over the data-parallel ranks (the experts' over the expert-data-
  parallel ranks), within ``TRAIN_MEMORY_SHARE`` of a GPU (activations, recomputed per layer,
  take the rest). Not checked on a CPU profile.

Choosing among the layouts that pass: the model's preferred TP (``ModelSpec.train_tp``) when it
passes, else the nearest below, then above; PP as small as passes; EP as large as divides the
experts within one node (the experts' all-to-all stays on a node's links); ETP 1 (whole experts,
as verl's Qwen3-MoE Megatron examples run them).
"""

from __future__ import annotations

from dataclasses import dataclass

from pdmask.registry.catalog import CLUSTERS, MODELS, ClusterProfile, ModelSpec
from pdmask.registry.engine_rules import GIB, GPU_CAPABILITY, Violation
from pdmask.registry.model_shape import ModelShape

FP8_TRAINING_MIN_CAPABILITY = (9, 0)  # TE's block-wise FP8 scaling: Hopper or newer
FP8_GEMM_DIVISOR = 16  # TE: both dimensions of an FP8 GEMM divisible by 16
TRAIN_MEMORY_SHARE = 0.6  # of a GPU's memory for the model's state (*estimate*)
WEIGHT_BYTES, GRAD_BYTES, OPTIMIZER_BYTES = 2, 4, 12  # bf16; fp32; fp32 master + two Adam moments


@dataclass(frozen=True)
class TrainingLayout:
    """Megatron's parallel sizes for one trial (context parallel 1)."""

    tp: int
    pp: int
    ep: int
    etp: int
    fp8: bool  # Transformer Engine's block-wise FP8 training
    state_gib_per_gpu: float | None  # None: a CPU profile
    why: str

    def data_parallel(self, gpus: int) -> int:
        return gpus // (self.tp * self.pp)

    def as_dict(self) -> dict:
        return {
            "engine": "megatron",
            "tensor_parallel": self.tp,
            "pipeline_parallel": self.pp,
            "expert_parallel": self.ep,
            "expert_tensor_parallel": self.etp,
            "context_parallel": 1,
            "fp8_training": self.fp8,
            "state_gib_per_gpu": self.state_gib_per_gpu,
            "why": self.why,
        }


class TrainingRefusal(ValueError):
    """No Megatron layout passes: every candidate's violations."""

    def __init__(self, model: str, precision: str, cluster: str, tried: dict[str, list]):
        self.tried = tried
        lines = "; ".join(f"{k}: {', '.join(map(str, v))}" for k, v in tried.items())
        super().__init__(
            f"no Megatron training layout of {model} in {precision} passes Megatron's rules on "
            f"{cluster} ({lines})"
        )


def state_bytes_per_gpu(shape: ModelShape, gpus: int, tp: int, pp: int, ep: int, etp: int):
    """The model's state on one GPU (the module docstring's estimate)."""
    experts = (
        shape.num_layers * shape.num_experts * 3 * shape.hidden_size * shape.moe_intermediate_size
    )
    dense = shape.params_total() - experts
    dense_rank = dense / (tp * pp)
    expert_rank = experts / (ep * etp * pp)
    per_param = WEIGHT_BYTES + GRAD_BYTES
    optimizer = dense_rank / (gpus // (tp * pp)) + expert_rank / (gpus // (ep * etp * pp))
    return (dense_rank + expert_rank) * per_param + optimizer * OPTIMIZER_BYTES


def _fp8_dims(shape: ModelShape, tp: int, etp: int) -> list[Violation]:
    widths = {
        "hidden": shape.hidden_size,
        "query per rank": shape.num_attention_heads * shape.head_dim // tp,
        "key/value per rank": shape.num_kv_heads * shape.head_dim // tp,
    }
    if shape.is_moe:
        widths["expert width per ETP rank"] = shape.moe_intermediate_size // etp
    else:
        widths["MLP width per rank"] = shape.intermediate_size // tp
    return [
        Violation("fp8-training-dims", f"{name} {size} is not divisible by {FP8_GEMM_DIVISOR}")
        for name, size in widths.items()
        if size % FP8_GEMM_DIVISOR
    ]


def check_training_layout(
    shape: ModelShape, profile: ClusterProfile, gpus: int, tp, pp, ep, etp, fp8: bool
) -> list[Violation]:
    """Every rule the layout breaks (empty: Megatron accepts it, as far as its source says)."""
    out = []
    if tp > profile.gpus_per_node or gpus % (tp * pp) or gpus % (ep * etp * pp):
        out.append(
            Violation(
                "placement",
                f"TP {tp} within one {profile.gpus_per_node}-GPU node, TP {tp} x PP {pp} and "
                f"EP {ep} x ETP {etp} x PP {pp} dividing the trial's {gpus} GPUs",
            )
        )
    if shape.num_attention_heads % tp or shape.num_kv_heads % tp:
        out.append(
            Violation(
                "heads",
                f"{shape.num_attention_heads} heads and {shape.num_kv_heads} KV heads / TP {tp}",
            )
        )
    if shape.num_layers % pp:
        out.append(Violation("layers", f"{shape.num_layers} layers / PP {pp}"))
    if (shape.is_moe and shape.num_experts % ep) or (not shape.is_moe and ep > 1):
        out.append(Violation("experts", f"{shape.num_experts} experts / EP {ep}"))
    if fp8:
        capability = GPU_CAPABILITY.get(profile.gpu_kind)
        if profile.device != "gpu":
            out.append(
                Violation("fp8-training-gpu", "FP8 training needs Transformer Engine on a GPU")
            )
        elif capability is None or capability < FP8_TRAINING_MIN_CAPABILITY:
            out.append(
                Violation(
                    "fp8-training-gpu",
                    f"block-wise FP8 training needs compute capability 9.0; {profile.gpu_kind} "
                    f"has {capability or 'an unknown one (add it to GPU_CAPABILITY)'}",
                )
            )
        out += _fp8_dims(shape, tp, etp)
    if profile.device == "gpu" and not out:
        state = state_bytes_per_gpu(shape, gpus, tp, pp, ep, etp)
        share = profile.gpu_memory_gb * 1e9 * TRAIN_MEMORY_SHARE
        if state > share:
            out.append(
                Violation(
                    "train-memory",
                    f"{state / GIB:.1f} GiB of weights, gradients and optimizer state per GPU "
                    f"exceed {share / GIB:.1f} GiB ({TRAIN_MEMORY_SHARE:.0%} of a GPU)",
                )
            )
    return out


def _tp_candidates(model: ModelSpec, profile: ClusterProfile, gpus: int) -> list[int]:
    tps = [t for t in range(1, min(gpus, profile.gpus_per_node) + 1) if gpus % t == 0]
    if model.train_tp is None:
        return tps
    below = sorted((t for t in tps if t <= model.train_tp), reverse=True)
    return below + [t for t in tps if t > model.train_tp]


def _ep_candidates(shape: ModelShape, profile: ClusterProfile, gpus: int) -> list[int]:
    if not shape.is_moe:
        return [1]
    eps = [e for e in range(1, profile.gpus_per_node + 1) if gpus % e == 0]
    return sorted((e for e in eps if shape.num_experts % e == 0), reverse=True)


def training_layout(model_name: str, precision: str, cluster: str, *, fp8: bool) -> TrainingLayout:
    """The Megatron layout of a (model, precision) cell on a cluster profile; raises
    ``TrainingRefusal`` naming every rule each candidate breaks. ``fp8``: the setting trains in
    FP8 (``catalog.PrecisionSpec.megatron_fp8``)."""
    model, profile = MODELS[model_name], CLUSTERS[cluster]
    need = model.gpu_needs.get(profile.gpu_kind)
    shape = model.shape
    if need is None or shape is None:
        why = "no need on this GPU kind" if need is None else "no shapes to derive a layout from"
        tried = {"any layout": [Violation("placement", f"{model_name}: {why}")]}
        raise TrainingRefusal(model_name, precision, cluster, tried)
    gpus = need.gpus
    tried: dict[str, list] = {}
    pps = [p for p in range(1, shape.num_layers + 1) if shape.num_layers % p == 0 and gpus % p == 0]
    for pp in pps:
        for tp in _tp_candidates(model, profile, gpus):
            for ep in _ep_candidates(shape, profile, gpus // pp):
                broken = check_training_layout(shape, profile, gpus, tp, pp, ep, 1, fp8)
                if broken:
                    tried[f"TP {tp} PP {pp} EP {ep}"] = broken
                    continue
                return _layout(shape, profile, gpus, tp, pp, ep, fp8, tried)
    raise TrainingRefusal(model_name, precision, cluster, tried)


def _layout(shape, profile, gpus, tp, pp, ep, fp8, tried) -> TrainingLayout:
    why = "passes every rule"
    if tried:
        shown = list(tried.items())[:3]  # the nearest refusals: the full list is the refusal's
        why += "; refused: " + "; ".join(f"{k} ({v[0]})" for k, v in shown)
    state = None
    if profile.device == "gpu":
        state = round(state_bytes_per_gpu(shape, gpus, tp, pp, ep, 1) / GIB, 1)
    return TrainingLayout(tp, pp, ep, 1, fp8, state, why)
