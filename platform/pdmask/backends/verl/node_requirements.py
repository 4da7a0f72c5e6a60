"""What a node needs for the VeRL backend's jobs to start and to run at speed, in one place.

The job spec asks for these explicitly (``overrides.py``: the attention implementation), the GPU
extra installs them (``pyproject.toml``: ``pdmask[gpu]``), and ``pdm cluster check`` proves them
from every node (``training_nodes``, the check's spec through ``JobBatch.node_inputs``).

**Attention.** verl 0.9.1 loads the actor with ``attn_implementation="flash_attention_2"`` unless
the model's ``override_config`` says otherwise (``verl/workers/config/model.py``), and transformers
then raises ``ImportError: FlashAttention2 has been toggled on, but it cannot be used`` when the
``flash_attn`` package is missing. The package also carries the log-prob path verl takes on GPUs:
``verl.utils.torch_functional.logprobs_from_logits`` uses ``flash_attn``'s Triton cross-entropy
when ``flash_attn.ops.triton.cross_entropy`` imports, and otherwise, silently, a Python loop over
the rows (2,093 ms against 6.41 ms at 16k x 151,936 on an H200, ``benchmarks/RESULTS.md`` a). The
other way out, ``sdpa``, would load the model but keep that loop, and sdpa has no varlen kernel for
the packed sequences of ``use_remove_padding``. So GPU jobs ask for FlashAttention 2 by name and
every training node must import both modules; on CPU (``this-machine``) torch's SDPA is the only
attention there is.

**flash-attn.** PyPI has only its source, which needs the CUDA toolkit and about half an hour to
build. verl 0.9.1 pins ``flash-attn==2.8.3`` for torch 2.11 / CUDA 13.0 (its
``flash-attn-cu130torch211`` extra) and installs it from prebuilt wheels; ``pdmask[gpu]`` takes the
same wheels, one per Python (``pyproject.toml``; ``tests/verl/test_node_requirements.py`` holds
their tags to the versions here).

**Transformer Engine.** FP8 training is TE's: Megatron-Core's FP8 context is
``contextlib.nullcontext`` without it, a silent no-op, and ``transformer_engine.pytorch`` loads a
CUDA library built against one torch, so an install that does not match the node's torch
imports ``transformer_engine`` and fails there. So where some setting of the profile trains in
FP8, every training node must import both (``TRANSFORMER_ENGINE``, the check's ``fp8`` probe).

**CUDA and the driver.** vLLM 0.24.0 pins torch 2.11.0; both are CUDA 13.0 builds (vLLM's
extension links ``libnvrtc.so.13``). A CUDA 13 build needs an R580 or newer NVIDIA driver
(``MIN_DRIVER``, NVIDIA's minor-version-compatibility table).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from pdmask.backends.verl.compat import VERL_VERSION
from pdmask.registry import CLUSTERS

VLLM_VERSION = "0.24.0"  # pdmask[gpu]
TORCH_VERSION = "2.11.0"  # vLLM 0.24.0's pin
CUDA_VERSION = "13.0"  # what torch 2.11.0's default wheels and vLLM 0.24.0 are built for
FLASH_ATTN_VERSION = "2.8.3"  # verl 0.9.1's pin for torch 2.11 / CUDA 13.0
# What verl 0.9.1's Megatron engine imports on a training node (its `megatron` extra): Megatron-
# Bridge pinned there, megatron-core and Transformer Engine unpinned (every node the same).
MEGATRON_BRIDGE_VERSION = "0.5.2"
MEGATRON_PACKAGES = {"megatron-core": None, "megatron-bridge": MEGATRON_BRIDGE_VERSION}

# The oldest Linux driver that runs a CUDA major's builds (NVIDIA, "CUDA Compatibility": minor
# version compatibility, CUDA 11 onwards). Keys: CUDA major versions.
MIN_DRIVER = {"13": "580", "12": "525.60.13", "11": "450.80.02"}

# Where a job's attention implementation is set (verl's HFModelConfig.override_config).
ATTENTION_KEY = "actor_rollout_ref.model.override_config.attn_implementation"

# The Ray resource of a node verl's training and rollout workers run on (logical on a CPU profile).
TRAINING_RESOURCE = "GPU"

INSTALL_GPU = (
    "pip install -e '.[gpu]' from the submitter's pdmask commit (docs/cluster.md, section 2)"
)


@dataclass(frozen=True)
class Attention:
    """An attention implementation a job asks for, and what must import where it trains."""

    implementation: str  # transformers' ``attn_implementation``
    package: str  # the distribution that brings it
    modules: tuple[str, ...]  # importable on every training node, or the job fails or crawls
    fix: str  # what to do on a node where one does not import


FLASH_ATTENTION = Attention(
    "flash_attention_2",
    "flash-attn",
    # the attention kernels, and the Triton cross-entropy of verl's GPU log-prob path
    ("flash_attn", "flash_attn.ops.triton.cross_entropy"),
    f"install flash-attn {FLASH_ATTN_VERSION} built for torch {TORCH_VERSION} / CUDA "
    f"{CUDA_VERSION}: {INSTALL_GPU}",
)
SDPA = Attention("sdpa", "torch", ("torch",), "install torch (pip install -e '.[verl-cpu]')")


@dataclass(frozen=True)
class Fp8Training:
    """What FP8 training imports on every training node, and what to do where it does not."""

    package: str  # the distribution that brings it (its version: the ``versions`` check)
    modules: tuple[str, ...]  # importable on every training node, or FP8 training never runs
    fix: str


TRANSFORMER_ENGINE = Fp8Training(
    "transformer-engine",
    # the package (its version), and its PyTorch extension, loaded against the node's torch
    ("transformer_engine", "transformer_engine.pytorch"),
    f"install Transformer Engine built for torch {TORCH_VERSION} / CUDA {CUDA_VERSION} on this "
    "node (verl 0.9.1's megatron extra brings it: pip install 'verl[megatron]==0.9.1')",
)
# its version unpinned: every training node must only agree (the ``versions`` check)
FP8_TRAINING_PACKAGES = {TRANSFORMER_ENGINE.package: None}


def attention_for(device: str) -> Attention:
    """The attention a job on a cluster profile's ``device`` asks for."""
    return SDPA if device == "cpu" else FLASH_ATTENTION


def node_versions() -> dict[str, str]:
    """What every node, the head included, must run: the job's driver imports verl there."""
    return {"verl": VERL_VERSION}


def trains_in_fp8(cluster: str) -> bool:
    """Whether some setting of ``cluster`` trains in FP8 (on verl's Megatron engine)."""
    from pdmask.registry.catalog import PRECISIONS

    return any(PRECISIONS[p].megatron_fp8 for p in CLUSTERS[cluster].megatron_precisions)


def megatron_packages(cluster: str) -> dict[str, str | None]:
    """The packages a training node needs where some setting of ``cluster`` trains on verl's
    Megatron engine (``catalog.training_engine``), Transformer Engine too where one trains in
    FP8: name -> version, None where every node must only agree."""
    if not CLUSTERS[cluster].megatron_precisions:
        return {}
    needs = dict(MEGATRON_PACKAGES)
    if trains_in_fp8(cluster):
        needs.update(FP8_TRAINING_PACKAGES)
    return needs


def training_nodes(cluster: str) -> dict[str, Any]:
    """What a node that runs a job's workers (one with Ray's ``GPU`` resource) must have on
    ``cluster``, as ``pdm cluster check``'s spec takes it (``orchestration/cluster/probe.py``).

    ``packages``: name -> version, None where the submitter's own install is the reference (the
    CPU profile: nodes and submitter are one machine); ``gpus`` and ``min_driver``: None on a CPU
    profile (not checked); ``fp8_training``: what FP8 training imports, None where no setting
    trains in FP8; ``collective``: the backend of the cross-node all-reduce."""
    profile = CLUSTERS[cluster]
    on_gpu = profile.device != "cpu"
    attention = attention_for(profile.device)
    packages = (
        {"vllm": VLLM_VERSION, "torch": TORCH_VERSION, attention.package: FLASH_ATTN_VERSION}
        if on_gpu
        else {"vllm": None, "torch": None}
    )
    packages.update(megatron_packages(cluster))
    return {
        "resource": TRAINING_RESOURCE,
        "packages": packages,
        "attention": asdict(attention),
        "gpus": (
            {
                "count": profile.gpus_per_node,
                "memory_gb": profile.gpu_memory_gb,
                "kind": profile.gpu_kind,
            }
            if on_gpu
            else None
        ),
        "min_driver": dict(MIN_DRIVER) if on_gpu else None,
        "fp8_training": asdict(TRANSFORMER_ENGINE) if trains_in_fp8(cluster) else None,
        "collective": "nccl" if on_gpu else "gloo",
    }
