"""Benchmark of the embedded ``sim`` backend: RL steps/s and tokens/s per stand-in and precision.

    python benchmarks/bench_sim.py [--profile default] [--steps 6] [--quick-base]
                                   [--stand-ins tiny-4b,...] [--precisions bf16,...]

For every (stand-in, precision) setting, side by side in one process and on one thread (as a
trial runs): the time of an RL step (rollout with the top-20 view, ``minibatches`` masked updates,
weight sync), of one avg@16 evaluation, and from these the estimated length of one trial of the
profile (``steps`` RL steps plus its evaluations). Then the estimate for the default
``main-figure`` sweep: 4 panels x 4 methods x 2 seeds, 2 trials at a time, one core each, plus
the base models' warm starts.

Times are CPU seconds of this process (one thread), so another process's load does not inflate
them much; wall seconds and the load average are printed beside. ``--quick-base`` benchmarks from
the 30-step base models (no warm start needed; responses then run to full length, a slight
overestimate).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch

from pdmask.backends.sim import PROFILES, STAND_INS, SimTrialConfig, prepare_base_model
from pdmask.backends.sim.runtime import single_threaded
from pdmask.backends.sim.state import TrialState
from pdmask.backends.sim.trainer import evaluate, rl_step
from pdmask.registry import load_registry

MAIN_FIGURE = [("tiny-4b", "bf16"), ("tiny-8b", "bf16"), ("tiny-30b-a3b", "fp8-e2e"),
               ("tiny-30b-a3b", "fp8-rollout")]  # fmt: skip
METHODS_PER_PANEL, SEEDS, WORKERS = 4, 2, 2


def _clock() -> tuple[float, float]:
    return time.process_time(), time.perf_counter()


def bench_setting(stand_in: str, precision: str, args) -> dict:
    cfg = SimTrialConfig(
        stand_in=stand_in,
        precision=precision,
        profile=args.profile,
        seed=0,
        cache_dir=args.cache_dir,
        base_model="quick" if args.quick_base else "stand-in",
    )
    state = TrialState(cfg)
    pdm_agg = load_registry().recipes["pdm-agg"]
    mask_fn = pdm_agg.method(pdm_agg.resolve_params({"delta": 0.15})[0])
    rl_step(state, mask_fn, 1)  # warm-up: first-call allocations
    cpu0, wall0 = _clock()
    tokens = 0.0
    for step in range(2, 2 + args.steps):
        metrics = rl_step(state, mask_fn, step)
        tokens += metrics["perf/total_num_tokens"]
    cpu1, wall1 = _clock()
    evaluate(state, 1)
    cpu2, wall2 = _clock()
    budget = cfg.resolved()
    step_cpu = (cpu1 - cpu0) / args.steps
    eval_cpu = cpu2 - cpu1
    evals = budget.steps // budget.eval_every + 1 + (budget.steps % budget.eval_every != 0)
    return {
        "step_cpu": step_cpu,
        "step_wall": (wall1 - wall0) / args.steps,
        "tokens_per_s": tokens / (cpu1 - cpu0),
        "eval_cpu": eval_cpu,
        "trial_cpu": budget.steps * step_cpu + evals * eval_cpu,
    }


def bench_warm_starts(stand_ins: list[str]) -> dict[str, float]:
    """CPU seconds of each stand-in's full warm start, built in a throwaway cache."""
    out = {}
    with tempfile.TemporaryDirectory() as scratch:
        for name in stand_ins:
            cpu0, _ = _clock()
            prepare_base_model(name, cache_dir=scratch)
            out[name] = _clock()[0] - cpu0
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="default", choices=sorted(PROFILES))
    parser.add_argument("--steps", type=int, default=6, help="timed RL steps per setting")
    parser.add_argument("--stand-ins", default=",".join(STAND_INS))
    parser.add_argument("--precisions", default="bf16,fp8-rollout,fp8-e2e")
    parser.add_argument("--quick-base", action="store_true", help="use 30-step base models")
    parser.add_argument("--warm-starts", action="store_true", help="also time the warm starts")
    parser.add_argument("--cache-dir", default=None, help="base-model cache (default: state dir)")
    args = parser.parse_args()

    stand_ins = args.stand_ins.split(",")
    results: dict[tuple[str, str], dict] = {}
    print(f"profile {args.profile}: {PROFILES[args.profile].model_dump()}")
    print(f"{'stand-in':14s} {'precision':12s} {'steps/s':>8s} {'tokens/s':>9s} "
          f"{'step cpu s':>10s} {'step wall s':>11s} {'eval cpu s':>10s} {'trial cpu s':>11s}")  # fmt: skip
    with single_threaded():
        for stand_in in stand_ins:
            for precision in args.precisions.split(","):
                r = bench_setting(stand_in, precision, args)
                results[(stand_in, precision)] = r
                print(f"{stand_in:14s} {precision:12s} {1 / r['step_cpu']:8.2f} "
                      f"{r['tokens_per_s']:9.0f} {r['step_cpu']:10.3f} {r['step_wall']:11.3f} "
                      f"{r['eval_cpu']:10.3f} {r['trial_cpu']:11.1f}", flush=True)  # fmt: skip
        warm = bench_warm_starts(stand_ins) if args.warm_starts else {}

    for name, seconds in warm.items():
        print(f"warm start {name}: {seconds:.1f} cpu s")
    if all(setting in results for setting in MAIN_FIGURE):
        trials = sum(results[s]["trial_cpu"] for s in MAIN_FIGURE) * METHODS_PER_PANEL * SEEDS
        total = trials / WORKERS + sum(warm.values()) / WORKERS
        print(f"main-figure estimate ({len(MAIN_FIGURE) * METHODS_PER_PANEL * SEEDS} trials, "
              f"{WORKERS} at a time): {total / 60:.1f} min"
              + ("" if warm else " (warm starts not included: --warm-starts)"))  # fmt: skip
    print(f"load average: {os.getloadavg()[0]:.2f}; torch {torch.__version__}")


if __name__ == "__main__":
    main()
