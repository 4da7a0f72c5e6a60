"""Benchmark: cold and warm build time of figure-1 from 200 synthetic runs × 300 points.

    python benchmarks/bench_figures.py [--runs 200] [--points 300] [--store DIR]

Writes synthetic runs (2 evaluation datasets + 4 diagnostics, ``--points`` steps each) into a
fresh sqlite MLflow store, then times, side by side in one process:

- cold: the first build, empty metric-history cache (every history read from MLflow);
- warm: a rebuild with the cache filled (the goal is ≤ 3 s);
- warm, fresh process: ``pdm figure`` run as a new process, imports included (what a user waits).

``--store DIR`` keeps the store (and its cache) in DIR and reuses it on the next run, so repeated
measurements skip the slow part (writing the runs).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GOAL_WARM_S = 3.0


def _write_store(folder: Path, runs: int, points: int) -> str:
    from mlflow import MlflowClient

    from pdmask.figures.synthetic import paper_like_runs, write_runs

    uri = f"sqlite:///{folder / 'mlflow.db'}"
    marker = folder / f"runs-{runs}x{points}.done"
    if marker.exists():
        return uri
    per_cell = -(-runs // 16)  # 4 settings × 4 methods; the last cell gets the remainder
    synthetic = paper_like_runs(seeds=per_cell, points=points, eval_every=1)[:runs]
    started = time.perf_counter()
    write_runs(MlflowClient(tracking_uri=uri), "main-figure", synthetic, str(folder / "artifacts"))
    print(f"wrote {len(synthetic)} runs × {points} points in {time.perf_counter() - started:.1f} s")
    marker.touch()
    return uri


def _time_build(uri: str, out: Path, *, use_cache: bool = True) -> tuple[float, dict]:
    from pdmask.figures import build_figure

    started = time.perf_counter()
    result = build_figure("figure-1", tracking_uri=uri, out_dir=out, use_cache=use_cache)
    return time.perf_counter() - started, result.stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--points", type=int, default=300)
    parser.add_argument("--store", type=Path, help="keep and reuse the synthetic store here")
    args = parser.parse_args()

    folder = args.store or Path(tempfile.mkdtemp(prefix="pdm-bench-figures-"))
    folder.mkdir(parents=True, exist_ok=True)
    os.environ["PDM_HOME"] = str(folder / "state")  # the cache lives in the state folder
    try:
        uri = _write_store(folder, args.runs, args.points)
        shutil.rmtree(folder / "state" / "cache", ignore_errors=True)
        out = folder / "figures"
        cold, cold_stats = _time_build(uri, out)
        warm, warm_stats = _time_build(uri, out)
        uncached, _ = _time_build(uri, out, use_cache=False)
        started = time.perf_counter()
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pdmask",
                "figure",
                "figure-1",
                "--tracking-uri",
                uri,
                "--out",
                str(out),
                "--quiet",
            ],
            check=True,
            env=os.environ.copy(),
        )
        fresh = time.perf_counter() - started
    finally:
        if args.store is None:
            shutil.rmtree(folder, ignore_errors=True)

    print(f"figure-1 from {cold_stats['runs']} runs × {args.points} points (incl. diagnostics)")
    print(f"  cold build (empty cache, {cold_stats['fetched']} histories fetched): {cold:6.2f} s")
    print(
        f"  warm build ({warm_stats['cached']} histories from cache, "
        f"{warm_stats['fetched']} fetched):      {warm:6.2f} s"
    )
    print(f"  rebuild with the cache disabled:                          {uncached:6.2f} s")
    print(f"  warm rebuild in a fresh process (`pdm figure`, imports):  {fresh:6.2f} s")
    print(
        f"  cold / warm = {cold / warm:.1f}×; warm goal ≤ {GOAL_WARM_S:.0f} s: "
        f"{'met' if warm <= GOAL_WARM_S else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
