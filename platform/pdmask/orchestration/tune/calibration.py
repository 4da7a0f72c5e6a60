"""A calibration backend: a trial that only burns a fixed amount of CPU and reports a few steps.

Used by ``benchmarks/bench_sweep.py`` to measure what orchestration (Ray, Tune, claims, MLflow
runs and metric logging) costs per trial, against compute whose duration is known exactly.
"""

from __future__ import annotations

import time

STEPS = 5


def busy_trial(
    trial, recipe, *, reporter, workdir, should_stop, note, seconds: float = 1.0
) -> dict[str, float]:
    per_step = seconds / STEPS
    for step in range(1, STEPS + 1):
        end = time.process_time() + per_step
        x = 0
        while time.process_time() < end:  # CPU time, not sleep: the trial really occupies its core
            x += 1
        reporter(
            step, {"critic/score/mean": step / STEPS, "val-core/synth/acc/mean_at_16": step / STEPS}
        )
    return {"calibration/seconds": seconds}
