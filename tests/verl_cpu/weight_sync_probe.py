"""One weight-sync round trip through a vLLM CPU engine, with vLLM's GEMM dispatch forced to a path.

``python weight_sync_probe.py MODEL_DIR OUT.json PATH [DTYPE [TP]]`` (PATH: ``auto``, ``torch``,
``onednn``, ``sgl-packed``, ``zentorch``; DTYPE ``bfloat16`` by default; TP the engine's tensor
parallel size, 1 by default), in its own process (vLLM pins threads and keeps engine state for
the life of a process). What runs is what a VeRL job runs, minus Ray: vLLM's engine with verl's
worker extension as pdmask's vLLM server configures it (``vllm_worker.WORKER_EXTENSION``), verl's
own receiver (``update_weights_from_ipc``, shared memory, as on pdmask's CPU platform) fed by
verl's own ``BucketedWeightSender`` from one thread per tensor-parallel rank, as each trainer rank
feeds its rank of the engine, MoE experts unfused as verl's FSDP engine streams them
(``unfuse_moe_params``). Records, for a fixed batch of prompts, vLLM's top-20 log-probs of the
next token:

- ``before``: the engine on the model's own weights (``old``);
- ``synced``: after syncing ``new`` weights (``old`` plus noise), as the trainer would;
- ``back``: after syncing ``old`` again, which must reproduce ``before`` exactly (the same engine,
  kernels and weights);

and the float32 Hugging Face log-softmax of ``old`` and ``new`` at the same positions.

Forcing a path patches the capability checks vLLM's dispatch reads
(``vllm/model_executor/layers/utils.py``): ``check_cpu_sgl_kernel`` with AMX taken as present or
absent (sgl-packed; other kernels keep reading the real AMX flag),
``vllm._custom_ops._supports_onednn`` (oneDNN), ``current_platform.is_zen_cpu`` (zentorch). A path
runs vLLM's own kernels where this CPU can execute them; where it cannot (vLLM's packed sgl kernel
needs AMX tiles and dies with SIGILL elsewhere, zentorch is an AMD add-on no CI machine has,
vLLM's oneDNN handler may refuse bf16 on an AVX2 CPU) the path's kernels are replaced by a
*stand-in* with the same contract (``record["kernels"]`` says which): the weight is copied at
dispatch ("packed") and the GEMM reads only the copy, so vLLM's branch and pdmask's handling of its
weights run for real, and a sync that left the packed copy stale would show. Forcing a path
patches this process, so it needs TP 1 (the engine's worker in this process); at TP > 1 vLLM
spawns its workers, which run ``auto``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process: starts in seconds
os.environ.setdefault("VERL_PLATFORM", "pdmask-cpu")  # verl's device helpers on CPU
# A private ZMQ socket name, set once: vLLM's spawned TP workers run this module's top again.
os.environ.setdefault("VERL_RAY_JOB_ID", f"probe{os.getpid()}")

NOISE = 0.02  # new = old + NOISE * N(0, 1): logits move by O(1) nats, far beyond bf16 rounding
PROMPTS = [[1, 5 + i, 7 + 2 * i, 9 + i, 3] for i in range(16)]
TOPK = 20


def force(path: str) -> str:
    """Steer vLLM's dispatch to ``path``; returns whose kernels that path runs here."""
    import torch
    import vllm._custom_ops as ops
    from vllm.platforms import current_platform

    if path == "auto":
        return "vLLM's"
    import vllm.model_executor.layers.utils as dispatch

    # Only the GEMM dispatch's own check is steered: the AMX flag is also read by other CPU
    # kernels (attention), which must keep running what this CPU has.
    sgl_check = dispatch.check_cpu_sgl_kernel
    has_amx = torch.cpu._is_amx_tile_supported()

    def check_sgl(n, k, dtype):
        if path != "sgl-packed":
            return False
        real = torch.cpu._is_amx_tile_supported
        torch.cpu._is_amx_tile_supported = lambda: True
        try:
            return sgl_check(n, k, dtype)
        finally:
            torch.cpu._is_amx_tile_supported = real

    dispatch.check_cpu_sgl_kernel = check_sgl
    if path == "torch":
        ops._supports_onednn = False
        return "torch's"
    if path == "zentorch":
        type(current_platform).is_zen_cpu = lambda self: True
        try:
            import zentorch  # noqa: F401

            return "zentorch's"
        except ImportError:
            _zentorch_stand_in()
            return "stand-in (zentorch is not installed)"
    if path == "sgl-packed":
        if has_amx and hasattr(torch.ops._C, "convert_weight_packed"):
            return "vLLM's"
        _sgl_stand_in(ops)
        return "stand-in (no AMX tiles on this CPU: vLLM's packed kernel would be SIGILL)"
    if path == "onednn":
        ops._supports_onednn = True
        try:
            ops.create_onednn_mm(torch.zeros(128, 256, dtype=torch.bfloat16).t(), 32)
            return "vLLM's"
        except (RuntimeError, AttributeError):
            _onednn_stand_in(ops)
            return "stand-in (vLLM's oneDNN handler is not available for bf16 on this CPU)"
    raise SystemExit(f"unknown path {path!r}")


# Stand-ins keep each kernel's contract as the dispatch sees it: the weight is copied ("packed")
# when the layer is dispatched and the GEMM reads only that copy, so a sync that skipped the
# repack would leave the engine on the old weights and show.
def _linear(x, weight, bias):
    import torch

    return torch.nn.functional.linear(x, weight.to(x.dtype), bias)


def _zentorch_stand_in() -> None:
    import torch

    lib = torch.library.Library("zentorch", "DEF")
    lib.define(
        "zentorch_linear_unary(Tensor x, Tensor w, Tensor? b, *, bool is_weight_prepacked) "
        "-> Tensor"
    )
    lib.define("zentorch_weight_prepack_for_linear(Tensor w) -> Tensor")
    lib.impl(
        "zentorch_linear_unary", lambda x, w, b, *, is_weight_prepacked: _linear(x, w, b), "CPU"
    )
    lib.impl("zentorch_weight_prepack_for_linear", lambda w: w.clone(), "CPU")
    _zentorch_stand_in.lib = lib  # the library lives as long as the process


def _sgl_stand_in(ops) -> None:
    import torch

    torch.ops._C.convert_weight_packed = lambda weight: weight.detach().clone()
    ops.weight_packed_linear_cpu = lambda x, packed, n, bias: _linear(x, packed, bias)


def _onednn_stand_in(ops) -> None:
    class Handler:
        pass

    def create(weight_kn, cache_size):
        handler = Handler()
        handler.weight = weight_kn.t().detach().clone()
        return handler

    ops.create_onednn_mm = create
    ops.onednn_mm = lambda handler, x, bias: _linear(x, handler.weight, bias)


def _linear_paths(model) -> list[str]:
    """The GEMM paths of the engine's linear layers (at module level: vLLM pickles it to its
    workers at TP > 1)."""
    from pdmask.backends.verl.vllm_cpu_gemm import layer_path

    return sorted(
        {
            layer_path(m).value
            for m in model.modules()
            if hasattr(m, "cpu_linear")
            and getattr(m, "weight", None) is not None
            and m.weight.ndim == 2
            and type(m).__name__ != "VocabParallelEmbedding"
        }
    )


def main() -> int:
    model_dir, out_path, path = sys.argv[1], sys.argv[2], sys.argv[3]
    # bf16 by default: the VeRL jobs' rollout dtype, and the sgl path's only one
    dtype = sys.argv[4] if len(sys.argv) > 4 else "bfloat16"
    tp = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    if tp > 1 and path != "auto":
        raise SystemExit("forcing a GEMM path needs TP 1 (see the docstring)")
    from pdmask.backends.verl.cpu_profile import CPU_ENV, VLLM_CPU_KV_CACHE_BYTES

    for key, value in CPU_ENV.items():  # as a CPU job's processes get them (TP's thread binding)
        os.environ.setdefault(key, value)
    kernels = force(path)
    import torch
    from transformers import AutoModelForCausalLM
    from verl.workers.engine.fsdp.utils import unfuse_moe_params
    from verl.workers.rollout.vllm_rollout.bucketed_weight_transfer import BucketedWeightSender
    from vllm import LLM, SamplingParams

    from pdmask.backends.verl import cpu_platform
    from pdmask.backends.verl.vllm_worker import WORKER_EXTENSION

    cpu_platform.register()
    llm = LLM(
        model=model_dir,
        dtype=dtype,
        enforce_eager=True,
        kv_cache_memory_bytes=VLLM_CPU_KV_CACHE_BYTES,
        max_model_len=64,
        max_logprobs=TOPK,
        seed=0,
        worker_extension_cls=WORKER_EXTENSION,
        tensor_parallel_size=tp,
        # verl's server runs vLLM's multiprocessing executor; at TP 1 the worker stays here
        distributed_executor_backend="mp" if tp > 1 else None,
    )
    engine_paths = llm.apply_model(_linear_paths)[0]

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    old = {n: p.detach().clone() for n, p in hf.named_parameters()}
    gen = torch.Generator().manual_seed(1)
    new = {n: p + NOISE * torch.randn(p.shape, generator=gen) for n, p in old.items()}

    def reference(weights) -> list[list[float]]:
        hf.load_state_dict(weights, strict=False)
        with torch.no_grad():
            return torch.log_softmax(hf(torch.tensor(PROMPTS)).logits[:, -1].float(), -1).tolist()

    params = SamplingParams(max_tokens=1, temperature=0.0, logprobs=TOPK)

    def engine_logprobs() -> list[dict[str, float]]:
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
        return [{str(t): lp.logprob for t, lp in o.outputs[0].logprobs[0].items()} for o in outs]

    def sync(weights) -> None:
        errors: list[BaseException] = []

        def send(rank: int) -> None:
            sender = BucketedWeightSender(
                zmq_handle=(
                    f"ipc:///tmp/rl-colocate-zmq-{os.environ['VERL_RAY_JOB_ID']}-replica-0-"
                    f"rank-{rank}.sock"
                ),
                bucket_size_mb=64,
                use_shm=True,
            )
            stream = unfuse_moe_params(iter(list(weights.items())), hf.config.model_type)
            try:
                asyncio.run(sender.async_send_weights(stream))
            except BaseException as err:  # reported below, after the receivers returned
                errors.append(err)

        threads = [threading.Thread(target=send, args=(r,), daemon=True) for r in range(tp)]
        for thread in threads:
            thread.start()
        llm.collective_rpc("update_weights_from_ipc", kwargs={"use_shm": True})
        for thread in threads:
            thread.join(timeout=60)
        if errors:
            raise errors[0]
        llm.reset_prefix_cache()  # as verl's server does after a sync (clear_kv_cache)

    record = {
        "path": path,
        "kernels": kernels,
        "engine_paths": engine_paths,
        "model_type": hf.config.model_type,
        "old": reference(old),
    }
    record["new"] = reference(new)
    record["before"] = engine_logprobs()
    try:
        sync(new)
        record["synced"] = engine_logprobs()
        sync(old)
        record["back"] = engine_logprobs()
    except Exception as err:  # the failure this probe exists to catch: recorded, not hidden
        record["error"] = f"{type(err).__name__}: {err}"
    with open(out_path, "w") as fh:
        json.dump(record, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
