"""What mu's top-K costs the rollout: verl's vLLM server path at K = 0 and K = 20, side by side.

    python benchmarks/bench_rollout_topk.py [--sizes tiny,small] [--dtype bfloat16]
                                            [--prompts 64] [--tokens 32] [--repeats 9]
                                            [--topk-path objects,arrays] [--device cpu]
                                            [--threads 1]

The requests go through ``TopKvLLMHttpServer.generate`` -- verl 0.9.1's ``vLLMHttpServer.generate``
with pdmask's shims, the method a VeRL job's agent loop calls -- on vLLM's ``AsyncLLM`` with its
engine core and worker in their own processes, as verl starts them (``distributed_executor_backend
mp``, pdmask's worker extension, processed log-probs). The server object is built in this process
without Ray or HTTP (``object.__new__`` plus the attributes ``generate`` reads): what is measured is
the generate path, not the transport. K = 0 is verl's own path (``rollout.custom.pdm_topk`` unset:
the sampled token's log-prob only); K = 20 asks vLLM for the top-20 and returns pdmask's
``(G, K+1)`` rows in ``extra_fields``, on two paths side by side (``--topk-path``):

- ``objects`` (before issue 44): vLLM's front end builds a ``Logprob`` dict per generated token
  and ``extract_decode_topk`` reads them (selected through ``vllm_shims.topk_from_dicts``, an
  internal switch that exists for this benchmark);
- ``arrays`` (after, what VeRL jobs run): the front end keeps the engine core's arrays
  (``vllm_shims.install_front_end``) and ``rows_from_arrays`` slices them.

The serving process's startup heap is frozen after the warm-up, as in verl's server (vLLM's app
lifespan freezes it). Each round runs the same prompts in every configuration, in rotating order,
the serving process's garbage collected before each timed batch (the objects path's would
otherwise be billed to the next configuration), and every output is checked (K+1 columns at
K = 20 with the sampled id in slot K, none at K = 0) so that a silent no-op cannot pass for a fast
path.

Printed per model and K: generated tokens/s (median of the rounds), CPU microseconds per generated
token in the serving process (the one holding the server and vLLM's front end, where log-probs
become Python objects) and in the engine's processes (engine core + worker: the forward and the
sampler), each path's K = 20 / K = 0 ratio of tokens/s (median of the per-round ratios, and their
range),
the Python memory one batch's outputs hold and its peak while the batch runs (``tracemalloc``, one
more batch each, untimed), and each process's peak RSS. Each model runs in its own process (vLLM
keeps engine state per process); on CPU its processes run one torch thread each unless
``--threads`` says otherwise (``_child_env``). ``tiny`` is the verl-smoke model (0.36 M
parameters); ``small`` a random ~110 M Qwen3 on its tokenizer (``bench_vllm_cpu.build_model``).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

K = 20
SIZES = ("tiny", "small")
TOPK_IDS_FIELD = "pdm_topk_ids"  # vllm_shims.TOPK_IDS_FIELD, read here without importing vllm


def _proc_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process so far (Linux ``/proc``)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _descendants(root: int) -> list[int]:
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    parents[int(entry)] = int(fh.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue  # the process ended meanwhile
    found, frontier = [], [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent]
        found += children
        frontier += children
    return found


def _engine_cpu_seconds(pids: list[int]) -> float:
    return sum(_proc_cpu_seconds(pid) for pid in pids)


def _peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def server_for(engine, max_model_len: int, response_length: int, k: int | None):
    """pdmask's vLLM server around a running engine, as ``generate`` reads it (no Ray, no HTTP)."""
    from verl.workers.config import RolloutConfig

    from pdmask.backends.verl.vllm_server import TopKvLLMHttpServer

    server = object.__new__(TopKvLLMHttpServer)
    server.config = RolloutConfig(
        name="vllm",
        prompt_length=max_model_len - response_length,
        response_length=response_length,
        max_model_len=max_model_len,
        custom={"pdm_topk": k} if k else {},
    )
    server.engine = engine
    # no processor, no LoRA (verl's lora_as_adapter reads these)
    server.model_config = type("ModelConfig", (), {"processor": None, "lora_rank": 0, "lora": {}})()
    server.replica_rank = 0
    server.global_steps = None
    server._disaggregation_role = "null"
    server._pd_decode_peers = []
    server._submission_paused = False
    server._rejecting = False
    server._admitting = 0
    return server


def engine_args(model: str, dtype: str, max_model_len: int, device: str) -> dict:
    """vLLM's engine arguments as verl's server passes them for a pdmask job."""
    from pdmask.backends.verl.vllm_worker import WORKER_EXTENSION

    args = dict(
        model=model,
        dtype=dtype,
        max_model_len=max_model_len,
        max_logprobs=K,
        logprobs_mode="processed_logprobs",
        distributed_executor_backend="mp",
        worker_extension_cls=WORKER_EXTENSION,
        seed=0,
    )
    if device == "cpu":
        from pdmask.backends.verl.cpu_profile import VLLM_CPU_KV_CACHE_BYTES

        args.update(enforce_eager=True, kv_cache_memory_bytes=VLLM_CPU_KV_CACHE_BYTES)
    else:
        args.update(gpu_memory_utilization=0.5)
    return args


def _check(outputs, k: int | None, tokens: int) -> None:
    """The outputs are what the K asks for: a silent no-op must not pass for a fast path."""
    for out in outputs:
        if len(out.token_ids) != tokens or out.log_probs is None:
            raise RuntimeError(f"{len(out.token_ids)} tokens / log-probs {out.log_probs is None}")
        rows = out.extra_fields.get(TOPK_IDS_FIELD)
        if not k:
            if rows is not None:
                raise RuntimeError("K = 0 returned a top-K")
            continue
        if rows is None or rows.shape != (tokens, k + 1):
            raise RuntimeError(f"K = {k}: top-K rows {getattr(rows, 'shape', None)}")
        if (rows[:, :k] < 0).any() or list(rows[:, k]) != list(out.token_ids):
            raise RuntimeError(f"K = {k}: invalid slots in a T = 1 rollout without top-p/top-k")


PATHS = ("objects", "arrays")
BASE = "K=0"


def configs(paths: list[str]) -> dict[str, tuple[int, bool]]:
    """Label -> (K, read the top-K from vLLM's Logprob dicts): K = 0 and K = 20 on each path."""
    return {BASE: (0, False), **{f"K={K} {path}": (K, path == "objects") for path in paths}}


async def _batch(servers, config, prompts, tokens, tag) -> list:
    from pdmask.backends.verl import vllm_shims

    k, from_dicts = config
    # the requests' tasks copy this context: the "before" path for this batch only
    vllm_shims.topk_from_dicts.set(from_dicts)
    params = dict(temperature=1.0, top_p=1.0, top_k=-1, repetition_penalty=1.0, logprobs=True)
    server = servers[k]
    return await asyncio.gather(
        *(
            server.generate(
                list(p), {**params, "max_tokens": tokens, "ignore_eos": True}, f"{tag}-{k}-{i}"
            )
            for i, p in enumerate(prompts)
        )
    )


async def measure(engine_kwargs: dict, prompts: int, tokens: int, repeats: int, paths) -> dict:
    """Interleaved rounds of every config on one engine; returns the figures."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_kwargs))
    try:
        max_len = engine_kwargs["max_model_len"]
        servers = {k: server_for(engine, max_len, tokens, k) for k in (0, K)}
        runs = configs(paths)
        batch = [[1, 5 + i % 50, 7, 9 + i % 30, 3] for i in range(prompts)]
        for config in runs.values():  # warm-up: the first log-probs call, each batch shape
            _check(await _batch(servers, config, batch[:4], tokens, "warm"), config[0], tokens)
        # verl's server process has its startup heap frozen: vLLM's app lifespan freezes it when
        # verl's run_server starts uvicorn (vllm.utils.gc_utils.freeze_gc_heap). Unfrozen, each
        # full collection walks the ~0.8 M objects of the imports, ~0.5 s on this machine, a dozen
        # times a minute: pauses longer than a batch, which no job has.
        gc.collect()
        gc.freeze()
        engine_pids = _descendants(os.getpid())
        rounds = {label: [] for label in runs}
        labels = list(runs)
        for r in range(repeats):
            for label in labels[r % len(labels) :] + labels[: r % len(labels)]:  # rotate the order
                # The objects path leaves millions of Python objects: collected here, outside the
                # timing, or their collection is billed to whichever batch runs next.
                gc.collect()
                cpu0, eng0 = time.process_time(), _engine_cpu_seconds(engine_pids)
                t0 = time.perf_counter()
                outputs = await _batch(servers, runs[label], batch, tokens, f"r{r}")
                wall = time.perf_counter() - t0
                front = time.process_time() - cpu0
                eng = _engine_cpu_seconds(engine_pids) - eng0
                _check(outputs, runs[label][0], tokens)
                n = sum(len(o.token_ids) for o in outputs)
                rounds[label].append(
                    {"wall_s": wall, "tokens": n, "front_cpu_s": front, "engine_cpu_s": eng}
                )
        memory = {}
        for label, config in runs.items():
            tracemalloc.start()
            base = tracemalloc.get_traced_memory()[0]
            outputs = await _batch(servers, config, batch, tokens, "mem")
            held, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            memory[label] = {"held_mb": (held - base) / 2**20, "peak_mb": (peak - base) / 2**20}
            del outputs
        return {
            "rounds": rounds,
            "memory": memory,
            "front_peak_rss_mb": _peak_rss_mb(os.getpid()),
            "engine_peak_rss_mb": [_peak_rss_mb(pid) for pid in engine_pids],
        }
    finally:
        engine.shutdown()


def summarise(result: dict) -> dict:
    """Medians per config and, per K = 20 path, the per-round ratio of tokens/s to K = 0's."""
    out = {}
    for label, rounds in result["rounds"].items():
        tps = [r["tokens"] / r["wall_s"] for r in rounds]
        out[label] = {
            "tokens_per_s": statistics.median(tps),
            "front_cpu_us_per_token": statistics.median(
                1e6 * r["front_cpu_s"] / r["tokens"] for r in rounds
            ),
            "engine_cpu_us_per_token": statistics.median(
                1e6 * r["engine_cpu_s"] / r["tokens"] for r in rounds
            ),
            "tps": tps,
            **result["memory"][label],
        }
    ratios = {}
    for label, row in out.items():
        if label != BASE:
            per_round = [b / a for a, b in zip(out[BASE]["tps"], row["tps"], strict=True)]
            ratios[label] = {
                "median": statistics.median(per_round),
                "range": [min(per_round), max(per_round)],
            }
    return {
        "per_config": out,
        "ratios": ratios,
        "front_peak_rss_mb": result["front_peak_rss_mb"],
        "engine_peak_rss_mb": result["engine_peak_rss_mb"],
    }


def print_table(label: str, summary: dict, tokens_per_batch: int) -> None:
    print(f"  {label}: {tokens_per_batch} generated tokens per batch")
    print(f"    {'':<12} {'tokens/s':>9} {'serving CPU us/tok':>19} {'engine CPU us/tok':>18} "
          f"{'outputs hold MB':>16} {'batch peak MB':>14}")  # fmt: skip
    for name, row in summary["per_config"].items():
        print(
            f"    {name:<12} {row['tokens_per_s']:>9.0f} {row['front_cpu_us_per_token']:>19.1f} "
            f"{row['engine_cpu_us_per_token']:>18.1f} {row['held_mb']:>16.2f} {row['peak_mb']:>14.2f}"
        )
    for name, ratio in summary["ratios"].items():
        lo, hi = ratio["range"]
        print(f"    {name} / {BASE} tokens/s: {ratio['median']:.3f} (rounds {lo:.3f}-{hi:.3f})")
    rss = ", ".join(f"{m:.0f}" for m in summary["engine_peak_rss_mb"])
    print(f"    peak RSS: serving {summary['front_peak_rss_mb']:.0f} MB, engine [{rss}] MB")


def _child(args) -> int:
    os.environ.update(VERL_RAY_JOB_ID=f"bench{os.getpid()}")
    if args.device == "cpu":
        from pdmask.backends.verl import cpu_platform
        from pdmask.backends.verl.cpu_profile import CPU_ENV

        os.environ.update(CPU_ENV)
        cpu_platform.register()
    max_len = 64 if args.tokens <= 48 else 2 * args.tokens
    kwargs = engine_args(args.model, args.dtype, max_len, args.device)
    paths = args.topk_path.split(",")
    result = asyncio.run(measure(kwargs, args.prompts, args.tokens, args.repeats, paths))
    print(json.dumps(result))
    return 0


def _child_env(args) -> dict:
    """The child's environment; vLLM's engine processes inherit it. On CPU, one torch thread each
    by default: three busy processes share this machine's two cores, and a worker with two OpenMP
    threads waits at every parallel region for whichever thread was preempted, which spread the
    rounds 2-3x and bought no speed (the small model: 1,295 tokens/s with two, 1,289 with one).
    A GPU node gives every process cores of its own."""
    env = dict(os.environ)
    if args.device == "cpu" and args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    return env


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="cuda: gpu_check.py's part (g)"
    )
    parser.add_argument("--sizes", default=",".join(SIZES), help="tiny, small or both")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--prompts", type=int, default=64, help="concurrent requests per batch")
    parser.add_argument("--tokens", type=int, default=32, help="generated tokens per request")
    parser.add_argument("--repeats", type=int, default=9, help="interleaved rounds")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="CPU: torch threads per process (OMP_NUM_THREADS); 0: torch's default, all cores",
    )
    parser.add_argument(
        "--topk-path",
        default=",".join(PATHS),
        help="objects (vLLM's Logprob dicts: before issue 44), arrays (after) or both",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return _child(args)
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    if not set(sizes) <= set(SIZES):
        parser.error(f"--sizes: choose from {SIZES}")
    if not set(args.topk_path.split(",")) <= set(PATHS):
        parser.error(f"--topk-path: choose from {PATHS}")
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_vllm_cpu import build_model

    threads = f"{args.threads} torch thread(s) per process" if args.threads else "torch's threads"
    print(f"verl's vLLM server path on vLLM ({args.device}), {args.dtype}, {args.prompts} requests "
          f"x {args.tokens} tokens, K = 0 vs {K} ({args.topk_path}), {args.repeats} interleaved "
          f"rounds, {threads if args.device == 'cpu' else 'GPU'}; "
          f"load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    records = {}
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            model = build_model(size, Path(tmp))
            done = subprocess.run(
                [sys.executable, __file__, "--child", "--model", str(model), "--dtype", args.dtype,
                 "--device", args.device,
                 "--prompts", str(args.prompts), "--tokens", str(args.tokens),
                 "--repeats", str(args.repeats), "--topk-path", args.topk_path],
                capture_output=True, text=True, timeout=3600, env=_child_env(args),
            )  # fmt: skip
            if done.returncode != 0:
                print(f"{size}: failed\n{done.stderr[-3000:]}")
                return 1
            summary = summarise(json.loads(done.stdout.strip().splitlines()[-1]))
            print_table(size, summary, args.prompts * args.tokens)
            records[size] = summary
    print(json.dumps({"bench": "rollout_topk", "k": K, "device": args.device, "dtype": args.dtype,
                      "threads": args.threads, "sizes": records}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
