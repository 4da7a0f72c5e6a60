"""The rollout engine's rules, read from vLLM's source, applied to each model's own shapes.

For a model, a precision and a cluster profile, ``rollout_layout`` gives the vLLM layout its VeRL
jobs use (tensor-parallel size, expert parallelism, replicas), or refuses the cell with every rule
it breaks. The job builder writes the layout into the job (``backends/verl/job_spec.py``) and the plan
shows it (``pdm sweep --dry-run``); both read this module, which imports neither torch nor verl.

The rules, with where vLLM enforces each (vLLM 0.24.0, the GPU extra's pin, read from its wheel;
the same code in the CPU build 0.31 installed for the tests unless noted):

- ``heads``: attention heads divisible by TP (``vllm/config/model.py``,
  ``ModelConfig.verify_with_parallel_config``).
- ``kv-heads``: KV heads divisible by TP, or TP divisible by KV heads, each KV head then replicated
  on ``tp / kv`` ranks (``vllm/model_executor/layers/linear.py``, ``QKVParallelLinear.__init__``:
  ``divide(total_num_kv_heads, tp_size)`` or ``divide(tp_size, total_num_kv_heads)``).
- ``fp8-block-linear``: with verl's block-wise FP8 (``weight_block_size [128, 128]``, injected by
  verl 0.9.1's ``vllm_async_server._apply_quantization``), every dense linear layer's output
  partitions per rank divisible by block_n = 128 and a row-parallel layer's input partition per
  rank by block_k = 128 (``quantization/utils/fp8_utils.py``, ``validate_fp8_block_shape``, called
  from ``quantization/fp8.py``, ``Fp8LinearMethod.create_weights``).
- ``fp8-block-experts``: an expert's width per rank (``moe_intermediate_size / tp``; whole under
  expert parallelism) divisible by block_n = 128, and by block_k = 128 when TP > 1 (0.24.0:
  ``quantization/fp8.py``, ``Fp8MoEMethod.create_weights``; 0.31: ``fp8_utils.py``,
  ``validate_fp8_block_shape_moe``). vLLM 0.24.0 has no padding here: Qwen3-30B-A3B's 768 / 4 =
  192 is refused at engine start.
- ``expert-parallel``: only a MoE model (``ModelConfig._verify_with_expert_parallelism``); verl
  then sets vLLM's ``enable_expert_parallel`` with ``expert_parallel_size = tp`` (verl 0.9.1
  ``workers/config/rollout.py``: EP must equal TP x DP; DP is 1 here). Experts need not divide
  evenly (``fused_moe/expert_map_manager.py``, ``determine_expert_map``).
- ``fp8-gpu``: FP8 weights need CUDA compute capability >= 7.5 (``Fp8Config.get_min_capability``;
  below 8.9 vLLM runs them as Marlin weight-only kernels, ``platforms/cuda.py``, ``supports_fp8``).
- ``fp8-kv-cache``: an FP8 KV cache needs an attention backend that stores one: FlashAttention 3
  on capability 9.x (``v1/attention/backends/flash_attn.py``,
  ``FlashAttentionBackend.supports_kv_cache_dtype``), Triton attention on any CUDA GPU
  (``triton_attn.py``), the CPU backend (``cpu_attn.py``). A GPU kind of unknown capability is
  refused rather than guessed.
- ``placement``: TP within one node and dividing the trial's GPUs (verl builds
  ``gpus / tp`` replicas on the trial's GPUs).
- ``kv-memory``: vLLM refuses to start unless its share of a GPU (``gpu_memory_utilization``)
  holds the replica's weights and the KV cache of one request of ``max_model_len`` tokens
  (``v1/core/kv_cache_utils.py``, ``check_enough_kv_cache_memory``). ``max_model_len`` is the
  model's ``max_position_embeddings`` (verl sets none). Not checked on a CPU profile (vLLM's CPU
  build sizes its cache from ``VLLM_CPU_KVCACHE_SPACE``).

Choosing among the layouts that pass: the model's preferred TP (``ModelSpec.rollout_tp``: its
throughput choice, as verl's recipes make it) when it passes; else the largest passing TP below
it, then the smallest above it; a layout with expert parallelism only where no plain TP passes
(verl's FP8 re-quantisation after each weight sync is exercised by its recipes without EP). With
no preferred TP, the smallest TP that passes (the most replicas).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from pdmask.registry.catalog import CLUSTERS, MODELS, ClusterProfile, ModelSpec
from pdmask.registry.model_shape import ModelShape

FP8_BLOCK = (128, 128)  # block_n, block_k of verl 0.9.1's FP8 rollout (see the docstring)
GIB = 1024**3

# CUDA compute capability per GPU kind of the cluster profiles (NVIDIA's tables: Hopper = 9.0).
GPU_CAPABILITY: dict[str, tuple[int, int]] = {"H20": (9, 0), "H100": (9, 0), "H200": (9, 0)}
FP8_MIN_CAPABILITY = (7, 5)  # Fp8Config.get_min_capability() == 75


class RolloutNumerics(BaseModel):
    """What a precision setting asks of vLLM: weight format and KV-cache dtype."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    weights: Literal["bf16", "fp8"] = Field(
        description="`fp8`: verl's `rollout.quantization=fp8` (block-wise 128 x 128)."
    )
    kv_cache: Literal["auto", "fp8"] = Field(
        description="vLLM's `kv_cache_dtype` (`auto`: the model's dtype)."
    )


# The one home of what each precision means for the rollout engine (the job builder's
# overrides read it too).
ROLLOUT_NUMERICS: dict[str, RolloutNumerics] = {
    "bf16": RolloutNumerics(weights="bf16", kv_cache="auto"),
    "fp8-rollout": RolloutNumerics(weights="fp8", kv_cache="auto"),
    "fp8-e2e": RolloutNumerics(weights="fp8", kv_cache="fp8"),
}


@dataclass(frozen=True)
class Violation:
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.rule}: {self.message}"


@dataclass(frozen=True)
class Layout:
    """A rollout layout of one trial: ``replicas`` vLLM engines of ``tp`` GPUs each."""

    tp: int
    expert_parallel: bool
    replicas: int
    weights_gib_per_gpu: float | None  # None: no shape, or a CPU profile
    kv_tokens_per_replica: int | None
    why: str

    def as_dict(self) -> dict:
        return {
            "tensor_parallel": self.tp,
            "expert_parallel": self.expert_parallel,
            "replicas": self.replicas,
            "weights_gib_per_gpu": self.weights_gib_per_gpu,
            "kv_tokens_per_replica": self.kv_tokens_per_replica,
            "why": self.why,
        }


class EngineRefusal(ValueError):
    """No layout passes: every candidate's violations, by TP."""

    def __init__(self, model: str, precision: str, cluster: str, tried: dict[str, list]):
        self.tried = tried
        lines = "; ".join(f"{k}: {', '.join(map(str, v))}" for k, v in tried.items())
        super().__init__(
            f"no vLLM rollout layout of {model} in {precision} passes vLLM's rules on {cluster} "
            f"({lines})"
        )


def _block_shape(name, tp, input_size, input_per_rank, output_size, outputs) -> list[Violation]:
    """vLLM's ``validate_fp8_block_shape`` for one linear layer, term by term."""
    block_n, block_k = FP8_BLOCK
    out = []
    if tp > 1 and input_size // input_per_rank == tp and input_per_rank % block_k:  # row parallel
        out.append(
            Violation(
                "fp8-block-linear",
                f"{name}'s input per rank {input_per_rank} is not divisible by block_k {block_k}",
            )
        )
    split = tp > 1 and output_size // sum(outputs) == tp
    if split or len(outputs) > 1:  # a merged layer not split by TP may end off the block grid
        for size in outputs if split else outputs[:-1]:
            if size % block_n:
                out.append(
                    Violation(
                        "fp8-block-linear",
                        f"{name}'s output partition per rank {size} is not divisible by "
                        f"block_n {block_n}",
                    )
                )
                break
    return out


def _fp8_linear(shape: ModelShape, tp: int) -> list[Violation]:
    """The block rule over each linear layer of the Qwen3 layout at ``tp`` (the partitions vLLM's
    ``QKVParallelLinear``, ``MergedColumnParallelLinear`` and ``RowParallelLinear`` give it)."""
    h, d = shape.hidden_size, shape.head_dim
    q = shape.num_attention_heads * d
    kv_rank = max(1, shape.num_kv_heads // tp) * d
    qkv_size = q + 2 * shape.num_kv_heads * d
    out = _block_shape("qkv_proj", tp, h, h, qkv_size, [q // tp, kv_rank, kv_rank])
    out += _block_shape("o_proj", tp, q, q // tp, h, [h])
    if not shape.is_moe:
        mlp = shape.intermediate_size
        out += _block_shape("gate_up_proj", tp, h, h, 2 * mlp, [mlp // tp, mlp // tp])
        out += _block_shape("down_proj", tp, mlp, mlp // tp, h, [h])
    return out


def _fp8_experts(shape: ModelShape, tp: int, ep: bool) -> list[Violation]:
    block_n, block_k = FP8_BLOCK
    moe_tp = 1 if ep else tp  # under expert parallelism each rank holds whole experts
    width = shape.moe_intermediate_size // moe_tp
    out = []
    if width % block_n:
        out.append(
            Violation(
                "fp8-block-experts",
                f"expert width per rank {shape.moe_intermediate_size} / {moe_tp} = {width} is "
                f"not divisible by block_n {block_n}",
            )
        )
    elif tp > 1 and width % block_k:  # vLLM asks the TP world size, even under EP
        out.append(
            Violation(
                "fp8-block-experts",
                f"expert width per rank {width} is not divisible by block_k {block_k}",
            )
        )
    return out


def weight_bytes_per_gpu(shape: ModelShape, weights: str, tp: int, ep: bool) -> float:
    """Rollout weight bytes on one rank: quantised linear layers at 1 byte (FP8) or 2 (BF16),
    embeddings, lm head, norms and the router at 2 (verl keeps the router in BF16:
    ``ignored_layers``); the vocabulary, heads and experts split over the ranks."""
    linear_bytes = 1 if weights == "fp8" else 2
    h, d = shape.hidden_size, shape.head_dim
    kv_per_rank = max(1, shape.num_kv_heads // tp)
    attention = h * d * (2 * shape.num_attention_heads // tp + 2 * kv_per_rank)
    if shape.is_moe:
        experts = shape.num_experts * 3 * h * shape.moe_intermediate_size / tp  # EP or TP alike
        router = h * shape.num_experts * 2
        mlp = experts * linear_bytes + router
    else:
        mlp = 3 * h * shape.intermediate_size / tp * linear_bytes
    embeddings = shape.vocab_size * h * (1 if shape.tie_word_embeddings else 2) / tp * 2
    return shape.num_layers * (attention * linear_bytes + mlp) + embeddings


def check_layout(
    shape: ModelShape,
    numerics: RolloutNumerics,
    profile: ClusterProfile,
    trial_gpus: int,
    tp: int,
    expert_parallel: bool,
    gpu_memory_utilization: float,
) -> list[Violation]:
    """Every rule the layout breaks (empty: vLLM accepts it, as far as its source says)."""
    out = []
    if tp > profile.gpus_per_node or trial_gpus % tp:
        out.append(
            Violation(
                "placement",
                f"TP {tp} must fit one {profile.gpus_per_node}-GPU node and divide the trial's "
                f"{trial_gpus} GPUs",
            )
        )
    if shape.num_attention_heads % tp:
        out.append(Violation("heads", f"{shape.num_attention_heads} attention heads / TP {tp}"))
    kv = shape.num_kv_heads
    if (tp >= kv and tp % kv) or (tp < kv and kv % tp):
        out.append(Violation("kv-heads", f"{kv} KV heads and TP {tp}: neither divides the other"))
    if expert_parallel and not shape.is_moe:
        out.append(Violation("expert-parallel", "expert parallelism needs a MoE model"))
    capability = GPU_CAPABILITY.get(profile.gpu_kind)
    on_gpu = profile.device == "gpu"
    if on_gpu and capability is None and (numerics.weights == "fp8" or numerics.kv_cache == "fp8"):
        out.append(
            Violation(
                "fp8-gpu",
                f"compute capability of {profile.gpu_kind} unknown: add it to GPU_CAPABILITY",
            )
        )
    if numerics.weights == "fp8":
        if on_gpu and capability is not None and capability < FP8_MIN_CAPABILITY:
            out.append(Violation("fp8-gpu", f"{profile.gpu_kind} is below capability 7.5"))
        out += _fp8_linear(shape, tp)
        if shape.is_moe:
            out += _fp8_experts(shape, tp, expert_parallel)
    if on_gpu and not out:
        weights = weight_bytes_per_gpu(shape, numerics.weights, tp, expert_parallel)
        share = profile.gpu_memory_gb * 1e9 * gpu_memory_utilization
        kv_bytes = 1 if numerics.kv_cache == "fp8" else 2
        one_request = shape.kv_bytes_per_token(kv_bytes, tp) * shape.max_position_embeddings
        if weights + one_request > share:
            out.append(
                Violation(
                    "kv-memory",
                    f"{weights / GIB:.1f} GiB of weights + {one_request / GIB:.1f} GiB of KV "
                    f"for one {shape.max_position_embeddings}-token request exceed vLLM's "
                    f"{share / GIB:.1f} GiB share per GPU",
                )
            )
    return out


def _candidates(model: ModelSpec, profile: ClusterProfile, gpus: int) -> list[int]:
    tps = [t for t in range(1, min(gpus, profile.gpus_per_node) + 1) if gpus % t == 0]
    preferred = model.rollout_tp
    if preferred is None:
        return tps
    below = sorted((t for t in tps if t <= preferred), reverse=True)
    return below + [t for t in tps if t > preferred]


def rollout_layout(
    model_name: str,
    precision: str,
    cluster: str,
    *,
    gpu_memory_utilization: float = 0.6,
) -> Layout:
    """The rollout layout of a (model, precision) cell on a cluster profile; raises
    ``EngineRefusal`` naming every rule each candidate breaks."""
    model, profile = MODELS[model_name], CLUSTERS[cluster]
    numerics = ROLLOUT_NUMERICS[precision]
    need = model.gpu_needs.get(profile.gpu_kind)
    if need is None:
        tried = {
            "any TP": [Violation("placement", f"{model_name} has no need on {profile.gpu_kind}")]
        }
        raise EngineRefusal(model_name, precision, cluster, tried)
    gpus = need.gpus
    shape = model.shape
    if shape is None:  # a model pdmask builds itself: its hand-set TP, no shapes to check
        tp = model.rollout_tp or 1
        return Layout(tp, False, gpus // tp, None, None, "set by hand (no shapes to check)")
    tried: dict[str, list] = {}
    candidates = _candidates(model, profile, gpus)
    layouts = [(t, False) for t in candidates]
    if shape.is_moe:
        layouts += [(t, True) for t in candidates if t > 1]
    for tp, ep in layouts:
        broken = check_layout(shape, numerics, profile, gpus, tp, ep, gpu_memory_utilization)
        if broken:
            tried[f"TP {tp}" + (" + EP" if ep else "")] = broken
            continue
        return _layout(shape, numerics, profile, gpus, tp, ep, gpu_memory_utilization, tried)
    raise EngineRefusal(model_name, precision, cluster, tried)


def _layout(shape, numerics, profile, gpus, tp, ep, utilization, tried) -> Layout:
    why = "passes every rule"
    if tried:
        why += "; refused: " + "; ".join(f"{k} ({v[0]})" for k, v in tried.items())
    if profile.device != "gpu":
        return Layout(tp, ep, gpus // tp, None, None, why)
    weights = weight_bytes_per_gpu(shape, numerics.weights, tp, ep)
    share = profile.gpu_memory_gb * 1e9 * utilization
    per_token = shape.kv_bytes_per_token(1 if numerics.kv_cache == "fp8" else 2, tp)
    return Layout(
        tp,
        ep,
        gpus // tp,
        round(weights / GIB, 1),
        int((share - weights) // per_token),
        why,
    )
