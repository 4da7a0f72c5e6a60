"""vLLM's CPU linear layers, kept loadable so that verl can sync new weights into them every step.

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
    """Make vLLM's CPU linear layers keep their weights (idempotent); False off CPU."""
    from vllm.model_executor.layers import linear
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    method = linear.UnquantizedLinearMethod
    if getattr(method.process_weights_after_loading, _WRAPPED, False):
        return True
    original = method.process_weights_after_loading

    def process_weights_after_loading(self, layer):
        if getattr(layer, "_cpu_skip_gemm_dispatch", False):  # vLLM's own opt-out (MLA)
            return original(self, layer)
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

        dispatch_cpu_unquantized_gemm(layer, remove_weight=False)

    setattr(process_weights_after_loading, _WRAPPED, True)
    method.process_weights_after_loading = process_weights_after_loading
    return True


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
