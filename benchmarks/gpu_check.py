"""The prepared GPU check: pdmask's loss path, its logits hook and a training step, on one GPU.

    python benchmarks/gpu_check.py --out "$OUT"     # one H200: ~4 min (benchmarks/README.md)
    python benchmarks/gpu_check.py --device cpu --tiny   # the same code at tiny sizes (CI)

Parts, each in its own try block (one failure never costs the others), each reported as one JSON
line on stdout (and in ``OUT/gpu_check.jsonl``) with ``"part"`` and ``"ok"``; tables go to stderr:

- ``environment``: the device, the packages, the stand-ins used for packages that cannot travel;
- ``loss`` (a): forward+backward of the loss path at 16,384 tokens x 151,936 bf16 logits: torch's
  fused cross-entropy, verl (its flash-attn branch and its fallback), pdm-agg, pdm-uni,
  dppo-topk-kl, a chunk-size sweep, and the memory-bandwidth floor (``gpu/loss_paths.py``);
- ``hook`` (b): time and peak memory of verl's engine output path on ~16k packed tokens, with
  and without pdmask's hook (``gpu/hook_memory.py``);
- ``engine`` (c): two optimizer steps of a Qwen3-0.6B-shaped model through verl's FSDP engine with
  pdmask's hook and the ``pdm_agg`` loss (``gpu/engine_step.py``);
- ``profile`` (d): pdm-agg's and torch's cross-entropy's fwd+bwd kernel by kernel, under
  ``torch.profiler`` (``gpu/profile_loss.py``);
- ``shard`` (e): the logits pass on vocabulary-parallel shards, TP 2 on this one device (two
  processes over gloo), every output and gradient against the full pass and float64, and its
  time against the full pass (``gpu/shard_pass.py``);
- ``megatron`` (f): Megatron-Core's TP-2 group and pdmask's hook inside verl's Megatron engine
  on those two ranks, against the FSDP hook on full logits (``gpu/megatron_hook.py``).

Parts (e) and (f) share one spawn of the two ranks (``gpu/tp_ranks.py``).

One part runs only when named in ``--parts`` (it needs vLLM, which cannot travel to a lent machine):

- ``rollout`` (g): what mu's top-20 costs verl's vLLM rollout, K = 0 against K = 20 on vLLM's
  Logprob dicts and on pdmask's arrays, tokens/s and serving-process CPU per token
  (``bench_rollout_topk.py --device cuda``, the ~110 M model, ~1-2 min).

Nothing is downloaded: models come from configs, inputs from seeded random numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from contextlib import nullcontext
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("loss", "hook", "engine", "profile", "shard", "megatron")
ON_REQUEST = ("rollout",)  # not in the default run: needs vllm installed on the machine
VERL_ENGINE_PARTS = ("hook", "engine")  # they run verl's own log-prob code


def _import_paths() -> None:
    """pdmask from this checkout (no install needed there) and the check's own package."""
    for path in (ROOT / "platform", ROOT / "benchmarks"):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))


def _versions() -> dict:
    from importlib import metadata

    out = {}
    names = ("torch", "triton", "transformers", "verl", "tensordict", "pydantic", "ray")
    for name in (*names, "megatron-core"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def environment(device, standins: list[str]) -> dict:
    import torch

    record = {"device": str(device), "versions": _versions(), "standins": standins}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        record.update(
            name=props.name,
            memory_gb=round(props.total_memory / 1e9, 1),
            multiprocessors=props.multi_processor_count,
            capability=f"{props.major}.{props.minor}",
        )
    else:
        record.update(name="cpu", threads=torch.get_num_threads())
    return record


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda", help="cuda (the check) or cpu (code check)")
    parser.add_argument("--tiny", action="store_true", help="tiny sizes: checks code, not speed")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats (5; tiny: 2)")
    parser.add_argument(
        "--parts", default=",".join(PARTS), help=f"any of {','.join(PARTS + ON_REQUEST)}"
    )
    parser.add_argument("--out", type=Path, default=None, help="folder for gpu_check.jsonl")
    args = parser.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS + ON_REQUEST))
    if unknown:
        parser.error(f"--parts: unknown {unknown}; choose from {list(PARTS + ON_REQUEST)}")
    repeats = args.repeats or (2 if args.tiny else 5)

    _import_paths()
    if args.device == "cpu":
        os.environ.setdefault("VERL_PLATFORM", "pdmask-cpu")  # pdmask's CPU platform for verl
        # ...which pdmask's verl plugin registers; from a checkout that is not installed (no
        # entry point), `import verl` loads the plugin by this name
        os.environ.setdefault("VERL_USE_EXTERNAL_MODULES", "pdmask.backends.verl.plugin")
        # Triton kernels run in its interpreter; read when triton is imported (torch imports it).
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from gpu.standin_path import use_standins_if_missing

    standins = use_standins_if_missing()
    import torch

    from gpu import engine_step, hook_memory, loss_paths, profile_loss
    from gpu.measure import emit, say
    from gpu.tp_ranks import TwoRanks

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run with --device cpu --tiny for a code check", file=sys.stderr)
        return 2
    out_file = None
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        out_file = args.out / "gpu_check.jsonl"
        out_file.write_text("")
    why_no_fused = loss_paths.fused_kernel_status(device)  # asked once: it compiles the kernel
    two_ranks = TwoRanks(device, args.tiny, repeats, parts)  # spawned at the first part of it
    steps = {
        "environment": lambda: environment(device, standins),
        "loss": lambda: loss_paths.run(
            device, loss_paths.TINY if args.tiny else loss_paths.FULL, repeats, why_no_fused
        ),
        "hook": lambda: hook_memory.run(
            device, hook_memory.SMALL if args.tiny else hook_memory.FULL, repeats
        ),
        "engine": lambda: engine_step.run(
            device, engine_step.SMALL if args.tiny else engine_step.FULL
        ),
        "profile": lambda: profile_loss.run(
            device, loss_paths.TINY if args.tiny else loss_paths.FULL
        ),
        "shard": lambda: two_ranks.part("shard"),
        "megatron": lambda: two_ranks.part("megatron"),
        "rollout": lambda: rollout(device, args.tiny, repeats),
    }
    started = time.perf_counter()
    failed = 0
    for part in ["environment", *parts]:
        t0 = time.perf_counter()
        on_verl = part in VERL_ENGINE_PARTS and why_no_fused is None
        try:
            with _verls_flash_attn_branch() if on_verl else nullcontext():
                record = {"part": part, "ok": True, **steps[part]()}
        except Exception as err:  # one part's failure must not cost the others
            failed += 1
            record = {
                "part": part,
                "ok": False,
                "error": f"{type(err).__name__}: {err}",
                "traceback": traceback.format_exc(limit=-8),
            }
            say(f"\n{part}: FAILED: {record['error']}")
        record["seconds"] = round(time.perf_counter() - t0, 2)
        if part in VERL_ENGINE_PARTS:
            record["verl_logprobs"] = "flash-attn branch (fused_logprob)" if on_verl else "fallback"
        emit(record, out_file)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    say(f"\ngpu_check: {len(parts) + 1 - failed} of {len(parts) + 1} parts ok, "
        f"{time.perf_counter() - started:.0f} s")  # fmt: skip
    return 1 if failed else 0


def rollout(device, tiny: bool, repeats: int) -> dict:
    """(g) ``bench_rollout_topk.py`` on this device, in its own processes; its table to stderr."""
    import importlib.util
    import subprocess

    from gpu.measure import say

    if importlib.util.find_spec("vllm") is None:
        raise RuntimeError("vllm is not installed on this machine (its wheel cannot travel)")
    size = ["--sizes", "tiny", "--prompts", "8", "--tokens", "8"] if tiny else ["--sizes", "small"]
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_rollout_topk.py"),
         "--device", device.type, "--repeats", str(repeats), *size],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"bench_rollout_topk failed: {(done.stdout + done.stderr)[-2000:]}")
    say("\n".join(lines[:-1]))
    return json.loads(lines[-1])


def _verls_flash_attn_branch():
    """verl's log-probs as on a GPU node with flash-attn (imports triton: only where it runs)."""
    from gpu.fused_logprob import as_verls_flash_attn

    return as_verls_flash_attn()


if __name__ == "__main__":
    sys.exit(main())
