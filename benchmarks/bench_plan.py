"""Planning a large grid: refusing it, expanding it, printing its plan (time and memory).

    python benchmarks/bench_plan.py [--trials 100000]

Side by side in one run, on a scratch copy of the project with a generated grid:

- the size check that refuses a grid over the cap (counted, never expanded), against the
  expansion a confirmed grid then needs (streamed cells; every trial resolved and hashed);
- the printed plan of 5,000 trials, one line per setting (what `pdm sweep --dry-run` prints
  beyond 200 trials) against one line per trial (what it printed before).

Time is process CPU time (load-independent); memory is the peak of Python allocations.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import tempfile
import time
import tracemalloc
from pathlib import Path

METHODS = ["pdm-agg", "pdm-uni", "dppo-topk-kl", "grpo-clip-higher", "pdm-bucket"]
MODELS = ["qwen3-4b-base", "qwen3-8b-base", "qwen3-30b-a3b-base"]
PRECISIONS = ["bf16", "fp8-rollout", "fp8-e2e"]


def measure(fn):
    """(result, CPU seconds, peak MB): timed on its own, then measured for memory (tracing
    allocations slows Python code several-fold, so the two are never taken in one run)."""
    started = time.process_time()
    result = fn()
    seconds = time.process_time() - started
    tracemalloc.start()
    fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return result, seconds, peak / 2**20


def write_sweep(root: Path, name: str, trials: int, confirm: bool) -> None:
    cells = len(METHODS) * len(MODELS) * len(PRECISIONS)
    deltas = max(1, trials // (cells * 10))
    values = ", ".join(f"{0.01 + i * 1e-4:.4f}" for i in range(deltas))
    cap = f"max_trials: {cells * deltas * 10}\n" if confirm else ""
    (root / "sweeps" / f"{name}.yaml").write_text(
        f"name: {name}\ndescription: bench\nseeds: 10\n{cap}grid:\n"
        f"  method: {METHODS}\n  model: {MODELS}\n  precision: {PRECISIONS}\n"
        f"  delta: [{values}]\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=100_000)
    args = parser.parse_args()
    repo = Path(__file__).resolve().parents[1]
    scratch = Path(tempfile.mkdtemp(prefix="pdm-bench-plan-"))
    for folder in ("recipes", "sweeps", "dashboards"):
        shutil.copytree(repo / folder, scratch / folder)
    os.environ["PDM_PROJECT"] = str(scratch)
    os.environ["PDM_HOME"] = str(scratch / ".pdm")
    write_sweep(scratch, "huge", args.trials, confirm=False)
    write_sweep(scratch, "huge-ok", args.trials, confirm=True)
    write_sweep(scratch, "print", 5_000, confirm=True)

    from rich.console import Console

    from pdmask.console import table
    from pdmask.errors import ValidationFailed
    from pdmask.registry import load_registry, plan_rows
    from pdmask.registry.plan import grouped_rows

    reg = load_registry(scratch)

    def refuse():
        try:
            reg.expand("huge")
        except ValidationFailed as err:
            return err.problems[0].message
        raise AssertionError("not refused")

    message, refuse_s, refuse_mb = measure(refuse)
    trials, expand_s, expand_mb = measure(lambda: reg.expand("huge-ok"))
    print(f"grid of {len(trials):,} trials ({message.split(':')[0]})")
    print(f"  refused (counted)  : {refuse_s * 1e3:8.1f} ms CPU  {refuse_mb:8.2f} MB peak")
    print(f"  expanded (streamed): {expand_s * 1e3:8.1f} ms CPU  {expand_mb:8.2f} MB peak")
    print(f"  ratio expand / refuse: {expand_s / max(refuse_s, 1e-9):,.0f}x time")
    print(f"  expansion per trial: {expand_s / len(trials) * 1e6:.1f} us CPU")

    rows = plan_rows(reg.expand("print"))

    def render(columns, body) -> float:
        console = Console(file=io.StringIO(), width=100)
        started = time.process_time()
        console.print(table("plan", columns, body))
        return time.process_time() - started

    per_trial = [[r.trial_hash[:10], r.method, r.model, r.precision, r.delta, r.seed] for r in rows]
    trial_s = render(["trial", "method", "model", "precision", "delta", "seed"], per_trial)
    grouped = grouped_rows(rows)
    group_s = render(
        ["method", "model", "precision", "delta", "trials", "seeds", "GPU-h", "status"], grouped
    )
    print(f"printed plan of {len(rows):,} trials")
    print(f"  one line per trial  : {trial_s:8.2f} s CPU ({len(per_trial):,} lines)")
    print(f"  one line per setting: {group_s:8.2f} s CPU ({len(grouped):,} lines)")
    print(f"  ratio per trial / per setting: {trial_s / max(group_s, 1e-9):,.0f}x")
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
