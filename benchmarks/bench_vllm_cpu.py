"""What keeping vLLM's CPU linear weights loadable costs: rollout speed, sync time and memory.

    python benchmarks/bench_vllm_cpu.py [--size tiny|small] [--dtype bfloat16|float32]
                                        [--prompts 256] [--tokens 8]

pdmask dispatches vLLM's CPU linear layers with ``remove_weight=False`` so that verl can sync
weights into them (``platform/pdmask/backends/verl/vllm_cpu_gemm.py``). Each mode runs in its own
process (vLLM pins threads and keeps engine state per process), side by side on the same model:

- ``vllm``: vLLM's own dispatch (the weight removed after packing): rollouts only, since a weight
  sync into it fails;
- ``pdmask``: the same GEMM path with the weight kept (what VeRL jobs run), plus one weight sync
  through verl's own sender and receiver (shared memory, as on pdmask's CPU platform);
- ``torch``: every linear layer on ``torch.nn.functional.linear`` (vLLM's ``_cpu_skip_gemm_dispatch``),
  the other way to keep weights loadable, for comparison.

Printed per mode: the GEMM path, rollout seconds (best of 3: ``--prompts`` prompts x ``--tokens``
tokens with 20 log-probs), the sync's seconds, peak RSS, and rollout ratios against ``vllm``.
``tiny`` is the verl-smoke model (0.36 M parameters); ``small`` a random Qwen3 of ~110 M
(hidden 1024, 8 layers), where GEMM speed matters more. ``--dtype`` picks the engine's dtype: the
GEMM path vLLM picks depends on it and on the CPU (``python -m pdmask.backends.verl.cpu_setup``
prints both), e.g. an AVX2-only CPU runs bf16 on torch's linear and fp32 on oneDNN.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

MODES = ("vllm", "pdmask", "torch")
SMALL = {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 8,
         "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 64}  # fmt: skip


def build_model(size: str, folder: Path) -> Path:
    """The benchmark's model folder: the tiny verl-smoke model, or a random ~110 M Qwen3 on its
    tokenizer (built from a config, nothing downloaded)."""
    from pdmask.backends.verl import tiny_model

    os.environ["PDM_HOME"] = str(folder / "state")
    tiny = tiny_model.ensure_built(log=lambda m: None)["model"]
    if size == "tiny":
        return tiny
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(**{**tiny_model.SPEC["config"], **SMALL}, torch_dtype="bfloat16")
    torch.manual_seed(0)
    out = folder / "small"
    Qwen3ForCausalLM(config).to(torch.bfloat16).save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny).save_pretrained(out)
    return out


def _run_mode(mode: str, model: str, dtype: str, prompts: int, tokens: int) -> dict:
    import resource
    import time

    os.environ.update(
        VLLM_TARGET_DEVICE="cpu",
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        VERL_PLATFORM="pdmask-cpu",
        VERL_RAY_JOB_ID=f"bench{os.getpid()}",
    )
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod

    from pdmask.backends.verl import cpu_platform
    from pdmask.backends.verl.cpu_profile import VLLM_CPU_KV_CACHE_BYTES
    from pdmask.backends.verl.vllm_cpu_gemm import keep_loadable_weights

    cpu_platform.register()
    if mode == "pdmask":
        keep_loadable_weights()
    elif mode == "torch":
        original = UnquantizedLinearMethod.process_weights_after_loading

        def skip(self, layer):
            layer._cpu_skip_gemm_dispatch = True
            return original(self, layer)

        UnquantizedLinearMethod.process_weights_after_loading = skip
    from vllm import LLM, SamplingParams

    llm = LLM(model=model, dtype=dtype, enforce_eager=True, max_model_len=64,
              max_logprobs=20, seed=0, kv_cache_memory_bytes=VLLM_CPU_KV_CACHE_BYTES,
              worker_extension_cls="verl.workers.rollout.vllm_rollout.utils."
              "vLLMColocateWorkerExtension")  # fmt: skip
    paths = llm.apply_model(_linear_paths)[0]
    batch = [{"prompt_token_ids": [1, 5 + i % 50, 7, 9 + i % 30, 3]} for i in range(prompts)]
    params = SamplingParams(max_tokens=tokens, temperature=1.0, logprobs=20, ignore_eos=True)
    llm.generate(batch[:4], params, use_tqdm=False)  # warm-up (first log-probs call)
    times = []
    for _ in range(3):
        start = time.perf_counter()
        llm.generate(batch, params, use_tqdm=False)
        times.append(time.perf_counter() - start)
    result = {"mode": mode, "paths": paths, "rollout_s": min(times)}
    if mode != "vllm":
        result["sync_s"] = _sync(llm, model)
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return result


def _linear_paths(model) -> list[str]:
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    from pdmask.backends.verl.vllm_cpu_gemm import layer_path

    return sorted(
        {
            layer_path(m).value
            for m in model.modules()
            if hasattr(m, "cpu_linear") and not isinstance(m, VocabParallelEmbedding)
        }
    )


def _sync(llm, model: str) -> float:
    """One weight sync of the model's own weights through verl's sender and receiver."""
    import asyncio
    import threading
    import time

    from safetensors.torch import load_file
    from verl.workers.rollout.vllm_rollout.bucketed_weight_transfer import BucketedWeightSender

    weights = {}
    for shard in Path(model).glob("*.safetensors"):
        weights.update(load_file(shard))
    handle = f"ipc:///tmp/rl-colocate-zmq-{os.environ['VERL_RAY_JOB_ID']}-replica-0-rank-0.sock"
    sender = BucketedWeightSender(zmq_handle=handle, bucket_size_mb=512, use_shm=True)
    thread = threading.Thread(
        target=lambda: asyncio.run(sender.async_send_weights(iter(list(weights.items())))),
        daemon=True,
    )
    start = time.perf_counter()
    thread.start()
    llm.collective_rpc("update_weights_from_ipc", kwargs={"use_shm": True})
    thread.join()
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=("tiny", "small"), default="tiny")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)  # one child process
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:
        print(json.dumps(_run_mode(args.mode, args.model, args.dtype, args.prompts, args.tokens)))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(args.size, Path(tmp))
        results = []
        for mode in MODES:
            done = subprocess.run(
                [sys.executable, __file__, "--mode", mode, "--model", str(model), "--dtype", args.dtype,
                 "--prompts", str(args.prompts), "--tokens", str(args.tokens)],
                capture_output=True, text=True, timeout=1800,
            )  # fmt: skip
            if done.returncode != 0:
                print(f"{mode}: failed\n{done.stderr[-2000:]}")
                return 1
            results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    base = results[0]["rollout_s"]
    print(f"vLLM CPU, {args.size} model in {args.dtype}, {args.prompts} prompts x {args.tokens} tokens, "
          f"20 log-probs; load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    for r in results:
        sync = f"{r['sync_s']:.2f} s" if "sync_s" in r else "n/a (fails: weight removed)"
        print(
            f"  {r['mode']:7s} GEMM {','.join(r['paths']):11s} rollout {r['rollout_s']:.3f} s "
            f"({r['rollout_s'] / base:.2f}x vllm)  sync {sync:27s} peak RSS {r['peak_rss_mb']:.0f} MB"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
