"""Orchestration overhead per trial: a sweep of N calibration trials vs their own compute.

    python benchmarks/bench_sweep.py [--trials 8] [--seconds 2.0]

Each calibration trial burns exactly ``--seconds`` of CPU and reports 5 steps. They run through the
real path of `pdm sweep` (embedded Ray, Tune, claims, one MLflow run per trial with params, tags,
artifacts and per-step metrics) on a scratch state folder, two at a time on two cores. With perfect
orchestration the wall time would be ``trials * seconds / concurrency``; the difference, divided by
the number of trials, is the orchestration cost per trial. Ray's start-up is reported separately.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument(
        "--seconds", type=float, default=2.0, help="CPU seconds of compute per trial"
    )
    parser.add_argument("--concurrency", type=int, default=2)
    args = parser.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="pdm-bench-sweep-"))
    os.environ["PDM_HOME"] = str(scratch)
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    from rich.console import Console

    from pdmask.orchestration.cluster.local_ray import connect
    from pdmask.orchestration.interrupts import Interrupts
    from pdmask.orchestration.options import SweepOptions
    from pdmask.orchestration.session import SweepSession
    from pdmask.orchestration.tune.launcher import TuneLauncher
    from pdmask.paths import project_root
    from pdmask.registry import Sweep, Trial, load_registry

    sweep = Sweep(
        name="bench-sweep",
        description="calibration",
        seeds=args.trials,
        retries=0,
        grid={"method": ["pdm-agg"], "model": ["qwen3-4b-base"], "precision": ["bf16"]},
    )
    trials = [
        Trial(
            sweep=sweep.name,
            method="pdm-agg",
            recipe_version=1,
            recipe_source=load_registry().recipes["pdm-agg"].source,
            params={"delta": 0.15},
            model="qwen3-4b-base",
            precision="bf16",
            delta=0.15,
            seed=s,
            backend="sim",
            profile="smoke",
        )
        for s in range(args.trials)
    ]
    options = SweepOptions(max_concurrent=args.concurrency, figures=False)
    session = SweepSession.open(
        load_registry(),
        sweep,
        trials,
        options,
        console=Console(quiet=True),
        interrupts=Interrupts(),
    )

    t0 = time.perf_counter()
    connect(None, {"PDM_HOME": str(scratch), "PDM_PROJECT": str(project_root())})
    ray_start = time.perf_counter() - t0
    t1 = time.perf_counter()
    todo = session.todo()
    TuneLauncher(calibration_seconds=args.seconds).launch(session, todo)
    outcome = session.settle(todo.skipped)
    wall = time.perf_counter() - t1
    ideal = args.trials * args.seconds / args.concurrency
    assert outcome.finished == args.trials, outcome
    print(
        f"\n{args.trials} calibration trials x {args.seconds:.1f} s CPU, {args.concurrency} at a time"
    )
    print(f"  Ray start-up (once per sweep)      : {ray_start:6.1f} s")
    print(f"  sweep wall (Tune + trials + MLflow): {wall:6.1f} s   (pure compute: {ideal:.1f} s)")
    print(
        f"  orchestration overhead per trial   : {(wall - ideal) / args.trials:6.2f} s "
        f"(wall-clock, at concurrency {args.concurrency})"
    )
    print(f"  ratio sweep wall / pure compute    : {wall / ideal:6.2f}")


if __name__ == "__main__":
    main()
