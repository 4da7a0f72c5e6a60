"""vLLM's CPU linear layers and MoE experts, kept loadable: verl syncs weights into them each step.

On CPU, vLLM 0.31 hands every unquantized linear layer to ``dispatch_cpu_unquantized_gemm``
(``vllm/model_executor/layers/utils.py``) once its weights are loaded. Which GEMM that picks
depends on the machine, and three of its four paths (``UnquantizedLinearMethod.
process_weights_after_loading`` in ``linear.py`` calls it with ``remove_weight=True``) pack a copy
of the weight and replace ``layer.weight`` by an empty Parameter without a ``weight_loader``:

==============  ============================================================  ===============
path            when                                                          weight after it
==============  ============================================================  ===============
``zentorch``    AMD Zen with zentorch installed (``ZenCpuPlatform``)          removed
``sgl-packed``  AMX tiles and a bf16/fp16/int8 weight up to 1 MiB             removed
``onednn``      vLLM's oneDNN handler built (``ops._supports_onednn``)        removed
``torch``       otherwise, or the oneDNN handler fails; ``F.linear``          kept
==============  ============================================================  ===============

verl pushes the trainer's weights into the running engine with ``model.load_weights`` and then
runs ``process_weights_after_loading`` once more ("some post-load transforms are non-idempotent;
run once after all buckets", ``vllm_rollout/utils.py``). With the weight removed, the first sync
fails (``'Parameter' object has no attribute 'weight_loader'``), so the VeRL-on-CPU path worked on
the machine it was built on (torch path) and failed on others (AVX-512 and AMX CPUs).

The fix keeps vLLM's choice of GEMM and only keeps the weight: linear layers are dispatched with
``remove_weight=False``, as vLLM already does for its embedding and LM head
(``vocab_parallel_embedding.py``). ``load_weights`` then writes into the kept weight, and verl's
post-sync ``process_weights_after_loading`` re-runs the dispatch, which packs the new weight. Cost:
one more copy of each linear weight in the rollout engine's memory (the packed one and the
loadable one; nothing at the tiny model's size, 2x the linear weights at real sizes) and a repack
per sync, no change in rollout speed (the same kernels run; ``benchmarks/bench_vllm_cpu.py``
measures it against the plain torch path).

MoE experts have the same problem in another form. vLLM's CPU fused-MoE kernel
(``CPUUnquantizedExperts`` in ``fused_moe/experts/cpu_moe.py``) prepacks ``w13_weight`` and
``w2_weight`` into its grouped-GEMM layout (same shape, other order) when the experts are first
processed. On a weight update, ``UnquantizedFusedMoEMethod._setup_kernel`` copies the loaded
weights in place but runs the experts' own ``process_weights_after_loading`` (the prepack) only the
first time, so after verl's first sync the kernel reads plain per-expert weights as if they were
packed: measured on a tiny Qwen3-MoE, the synced engine's log-probs were ~29 nats off both the old
and the new weights, silently. ``repack_moe_experts`` re-runs that prepack after every update:
verl streams every expert's full ``gate``/``up``/``down`` each sync, so the whole packed tensor
has been overwritten with plain weights by then (an intermediate width vLLM has to pad, not a
multiple of 32 per tensor-parallel rank, already fails in vLLM's loader, loudly). Cost: one
prepack per sync, as at start-up.

Installed in vLLM's worker processes by pdmask's worker extension (``vllm_worker.py``), only where
vLLM runs on CPU; GPU engines are untouched.
"""

from __future__ import annotations

from enum import StrEnum

_WRAPPED = "pdmask_keeps_weights"


class GemmPath(StrEnum):
    """The GEMM vLLM's CPU dispatch gives a linear layer (the table above)."""

    ZENTORCH = "zentorch"
    SGL_PACKED = "sgl-packed"
    ONEDNN = "onednn"
    TORCH = "torch"


def keep_loadable_weights() -> bool:
    """Make vLLM's CPU linear layers keep their weights and its CPU MoE experts repack synced
    ones (idempotent); False off CPU."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    _keep_linear_weights()
    repack_moe_experts()
    return True


def _keep_linear_weights() -> None:
    from vllm.model_executor.layers import linear

    method = linear.UnquantizedLinearMethod
    if getattr(method.process_weights_after_loading, _WRAPPED, False):
        return
    original = method.process_weights_after_loading

    def process_weights_after_loading(self, layer):
        if getattr(layer, "_cpu_skip_gemm_dispatch", False):  # vLLM's own opt-out (MLA)
            return original(self, layer)
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

        dispatch_cpu_unquantized_gemm(layer, remove_weight=False)

    setattr(process_weights_after_loading, _WRAPPED, True)
    method.process_weights_after_loading = process_weights_after_loading


def repack_moe_experts() -> None:
    """After a weight update, re-run the CPU experts' prepack that vLLM runs only once."""
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts
    from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import (
        UnquantizedFusedMoEMethod,
    )

    method = UnquantizedFusedMoEMethod
    if getattr(method.process_weights_after_loading, _WRAPPED, False):
        return
    original = method.process_weights_after_loading

    def process_weights_after_loading(self, layer):
        # vLLM builds the kernel (and prepacks) on the first call; a later call is an update
        update = getattr(self, "moe_kernel", None) is not None
        original(self, layer)
        experts = getattr(self.moe_kernel, "fused_experts", None)
        if update and isinstance(experts, CPUUnquantizedExperts):
            experts.process_weights_after_loading(layer)

    setattr(process_weights_after_loading, _WRAPPED, True)
    method.process_weights_after_loading = process_weights_after_loading


def layer_path(layer) -> GemmPath:
    """Which path a dispatched layer took, read from what its ``cpu_linear`` closes over."""
    fn = getattr(layer, "cpu_linear", None)
    code = getattr(fn, "__code__", None)
    names = set(code.co_freevars) if code is not None else set()
    if "zen_weight" in names:
        return GemmPath.ZENTORCH
    if "packed_weight" in names:
        return GemmPath.SGL_PACKED
    if "handler" in names:
        return GemmPath.ONEDNN
    return GemmPath.TORCH


def machine_path(dtype_name: str = "bfloat16", n: int = 256, k: int = 128) -> GemmPath:
    """The path this machine's vLLM gives an ``n x k`` linear weight of ``dtype_name``.

    Runs vLLM's own dispatch on a scratch layer (so the answer is what vLLM decides here, oneDNN
    failures included); the default shape is one of the tiny Qwen3's layers."""
    import torch
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(
        torch.zeros(n, k, dtype=getattr(torch, dtype_name)), requires_grad=False
    )
    dispatch_cpu_unquantized_gemm(layer, remove_weight=False)
    return layer_path(layer)
