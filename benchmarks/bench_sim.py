"""Benchmark of the embedded ``sim`` backend: CPU time per RL step and evaluation, per setting.

    python benchmarks/bench_sim.py [--profile default] [--steps 6] [--quick-base]
                                   [--settings tiny-4b:bf16,...] [--no-reference] [--warm-starts]

For every (stand-in, precision) setting (default: main-figure's four), each mode runs in its own process (one thread, as a trial
runs), side by side: ``steps`` RL steps (rollout with the top-20 view, masked minibatch updates,
weight sync) and one avg@16 evaluation, timed in process CPU seconds, with the process's peak
memory. Modes:

- ``reference``: the kernels the backend used before its speed-ups: the CPU's native bf16 GEMM
  (a slow reference loop without avx512_bf16/AMX), e4m3 decoded with ``.float()``, FP8 weights
  re-rounded on every forward;
- ``fast``: the backend as it is (same values; see ``model.py`` and ``fp8.py``);
- ``control``: as ``fast`` with lr = 0 (the mismatch control: no backward pass).

Printed per setting: the fast/reference ratio of a step and of an evaluation, and the estimated
CPU time of one trial of the profile. Then the estimate for the default ``main-figure`` sweep:
4 panels x (4 methods + 1 control) x 3 seeds, 2 trials at a time, plus the per-trial
orchestration overhead and, with ``--warm-starts``, the base models' warm starts. CPU seconds
are inflated when other processes share the cores (cache and memory contention): compare the
ratios, which are measured under the same load; the load average is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

MAIN_FIGURE = [("tiny-4b", "bf16"), ("tiny-8b", "bf16"), ("tiny-30b-a3b", "fp8-e2e"),
               ("tiny-30b-a3b", "fp8-rollout")]  # fmt: skip
METHODS_PER_PANEL, CONTROLS_PER_PANEL, SEEDS, WORKERS = 4, 1, 3, 2
OVERHEAD_S = 1.2  # orchestration wall seconds per trial at concurrency 2 (bench_sweep.py)
MODES = ("reference", "fast", "control")


def _use_reference_kernels() -> None:
    """Swap the backend's fast kernels for the ones it used before (identical values)."""
    import torch.nn.functional as F

    from pdmask.backends.sim import fp8, model

    model.linear = F.linear  # native bf16 GEMM
    fp8.decode_e4m3 = lambda codes: codes.float()
    model.QuantLinear.rounded_weight = lambda self: fp8.fake_quant_fp8(
        self.weight.detach(), self.weight_fp8
    )


def run_mode(stand_in: str, precision: str, mode: str, args) -> dict:
    """In this process: time ``args.steps`` RL steps and one evaluation of one setting."""
    from pdmask.backends.sim import SimTrialConfig
    from pdmask.backends.sim.runtime import single_threaded
    from pdmask.backends.sim.state import TrialState
    from pdmask.backends.sim.trainer import evaluate, rl_step
    from pdmask.registry import load_registry

    if mode == "reference":
        _use_reference_kernels()
    extra = {"lr": 0.0} if mode == "control" else {}
    cfg = SimTrialConfig(
        stand_in=stand_in,
        precision=precision,
        profile=args.profile,
        seed=0,
        delta=0.15,  # the diagnostics' radius (sim_config gives a trial its own)
        cache_dir=args.cache_dir,
        base_model="quick" if args.quick_base else "stand-in",
        **extra,
    )
    with single_threaded():
        state = TrialState(cfg)
        pdm_agg = load_registry().recipes["pdm-agg"]
        mask_fn = pdm_agg.method(pdm_agg.resolve_params({"delta": 0.15})[0])
        rl_step(state, mask_fn, 1)  # warm-up: first-call allocations
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for step in range(2, 2 + args.steps):
            rl_step(state, mask_fn, step)
        cpu1, wall1 = time.process_time(), time.perf_counter()
        evaluate(state, 1)
        cpu2 = time.process_time()
    budget = cfg.resolved()
    evals = budget.steps // budget.eval_every + 1 + (budget.steps % budget.eval_every != 0)
    step_cpu, eval_cpu = (cpu1 - cpu0) / args.steps, cpu2 - cpu1
    return {
        "step_cpu": step_cpu,
        "step_wall": (wall1 - wall0) / args.steps,
        "eval_cpu": eval_cpu,
        "trial_cpu": budget.steps * step_cpu + evals * eval_cpu,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def _in_subprocess(stand_in: str, precision: str, mode: str, args) -> dict:
    cmd = [sys.executable, __file__, "--worker", f"{stand_in},{precision},{mode}"]
    cmd += ["--profile", args.profile, "--steps", str(args.steps)]
    cmd += ["--quick-base"] if args.quick_base else []
    cmd += ["--cache-dir", args.cache_dir] if args.cache_dir else []
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def bench_warm_starts(stand_ins: list[str]) -> dict[str, float]:
    """CPU seconds of each stand-in's full warm start, built in a throwaway cache."""
    from pdmask.backends.sim import prepare_base_model

    out = {}
    with tempfile.TemporaryDirectory() as scratch:
        for name in stand_ins:
            cpu0 = time.process_time()
            prepare_base_model(name, cache_dir=scratch)
            out[name] = time.process_time() - cpu0
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="default")
    parser.add_argument("--steps", type=int, default=6, help="timed RL steps per setting")
    parser.add_argument(
        "--settings",
        default=",".join(f"{s}:{p}" for s, p in MAIN_FIGURE),
        help="stand-in:precision list (default: main-figure's four settings)",
    )
    parser.add_argument("--quick-base", action="store_true", help="use 30-step base models")
    parser.add_argument("--no-reference", action="store_true", help="skip the reference kernels")
    parser.add_argument("--warm-starts", action="store_true", help="also time the warm starts")
    parser.add_argument("--cache-dir", default=None, help="base-model cache (default: state dir)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # stand-in,precision,mode
    args = parser.parse_args()
    if args.worker:
        stand_in, precision, mode = args.worker.split(",")
        print(json.dumps(run_mode(stand_in, precision, mode, args)))
        return

    modes = [m for m in MODES if not (args.no_reference and m == "reference")]
    print(f"profile {args.profile}; {args.steps} timed RL steps and one evaluation per mode; "
          "CPU seconds of one thread, each mode in its own process")  # fmt: skip
    print(f"{'stand-in':13s} {'precision':12s} {'mode':10s} {'step cpu s':>10s} "
          f"{'eval cpu s':>10s} {'trial cpu s':>11s} {'peak MB':>8s}")  # fmt: skip
    results: dict[tuple[str, str, str], dict] = {}
    settings = [tuple(s.split(":")) for s in args.settings.split(",")]
    for stand_in, precision in settings:
        for mode in modes:
            r = _in_subprocess(stand_in, precision, mode, args)
            results[(stand_in, precision, mode)] = r
            print(f"{stand_in:13s} {precision:12s} {mode:10s} {r['step_cpu']:10.3f} "
                  f"{r['eval_cpu']:10.3f} {r['trial_cpu']:11.1f} {r['peak_rss_mb']:8.0f}",
                  flush=True)  # fmt: skip
        if "reference" in modes:
            ref, fast = (results[(stand_in, precision, m)] for m in ("reference", "fast"))
            print(f"{'':27s} fast/reference: step {fast['step_cpu'] / ref['step_cpu']:.2f}x, "
                  f"evaluation {fast['eval_cpu'] / ref['eval_cpu']:.2f}x, "
                  f"peak memory {fast['peak_rss_mb'] / ref['peak_rss_mb']:.2f}x")  # fmt: skip
    stand_ins = list(dict.fromkeys(s for s, _ in settings))
    warm = bench_warm_starts(stand_ins) if args.warm_starts else {}
    for name, seconds in warm.items():
        print(f"warm start {name}: {seconds:.1f} cpu s")

    for mode in [m for m in ("reference", "fast") if m in modes]:
        if not all((*s, mode) in results for s in MAIN_FIGURE):
            continue
        control = "control" if mode == "fast" else mode  # the old code had no cheaper control
        cpu = sum(
            results[(*s, mode)]["trial_cpu"] * METHODS_PER_PANEL
            + results[(*s, control)]["trial_cpu"] * CONTROLS_PER_PANEL
            for s in MAIN_FIGURE
        ) * SEEDS  # fmt: skip
        trials = len(MAIN_FIGURE) * (METHODS_PER_PANEL + CONTROLS_PER_PANEL) * SEEDS
        total = (cpu + sum(warm.values())) / WORKERS + OVERHEAD_S * trials
        print(f"main-figure estimate, {mode} kernels ({trials} trials, {WORKERS} at a time): "
              f"{cpu:.0f} trial cpu s, {total / 60:.1f} min"
              + ("" if warm else " (warm starts not included: --warm-starts)"))  # fmt: skip
    print(f"load average: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
