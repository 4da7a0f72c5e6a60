"""How long the quick `pdm` commands take, as a ratio to starting Python itself.

    python benchmarks/bench_cli.py [--repeat 15]

Each command runs as a fresh process, the way a user types it; the commands take turns (one run
of each per round, ``--repeat`` rounds) so that whatever else the machine does weighs on all of
them alike. Per command it prints the median wall time, the median CPU time (user + system of
that process) and the peak resident memory, each beside its ratio to ``python -c pass`` measured
in the same rounds. The goal for `pdm --help` and `pdm recipes list` is under 0.5 s.

    python benchmarks/bench_cli.py --instructions

counts the instructions each command executes instead (valgrind's callgrind, one run each, about
50 times slower): a measure no other load on the machine changes.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOAL_S = 0.5
BASELINE = ("python -c pass", [sys.executable, "-c", "pass"])


def _pdm() -> list[str]:
    script = Path(sys.executable).with_name("pdm")  # the console script users run
    return [str(script)] if script.exists() else [sys.executable, "-m", "pdmask"]


COMMANDS = [
    ("pdm --help", ["--help"]),
    ("pdm recipes list", ["recipes", "list"]),
    ("pdm sweeps list", ["sweeps", "list"]),
    ("pdm sweep --help", ["sweep", "--help"]),
    ("pdm sweep smoke --dry-run", ["sweep", "smoke", "--dry-run"]),
    ("pdm validate", ["validate"]),
]


def _run(argv: list[str], env: dict[str, str]) -> tuple[float, float, float]:
    """(wall s, CPU s, peak RSS MiB) of one process."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{argv} exited {proc.returncode}:\n{proc.stderr.read().decode()}")
    proc.stderr.close()
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024  # Linux: KiB


def _instructions(argv: list[str], env: dict[str, str]) -> int:
    """Instructions one process executes (valgrind callgrind's total ``Ir``)."""
    done = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or not found:
        raise SystemExit(f"{argv} under valgrind exited {done.returncode}:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def _print_instructions(runs, env) -> None:
    if shutil.which("valgrind") is None:
        raise SystemExit("--instructions needs valgrind (apt-get install valgrind)")
    counts = {label: _instructions(argv, env) for label, argv in runs}
    base = counts[BASELINE[0]]
    print(f"{'command':<28} {'instructions':>14} {'x pass':>7}")
    for label, count in counts.items():
        print(f"{label:<28} {count:14,d} {count / base:7.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15, help="rounds (one run of each)")
    parser.add_argument(
        "--instructions", action="store_true", help="count instructions (valgrind) instead"
    )
    args = parser.parse_args()

    state = tempfile.mkdtemp(prefix="pdm-bench-cli-")
    env = {**os.environ, "PDM_PROJECT": str(ROOT), "PDM_HOME": state, "COLUMNS": "100"}
    env.pop("MLFLOW_TRACKING_URI", None)
    runs = [BASELINE, *((label, [*_pdm(), *argv]) for label, argv in COMMANDS)]
    if args.instructions:
        _print_instructions(runs, env)
        return
    for _, argv in runs:  # warm the file cache and the bytecode caches
        _run(argv, env)
    samples: dict[str, list[tuple[float, float, float]]] = {label: [] for label, _ in runs}
    load_before = os.getloadavg()
    for _ in range(args.repeat):
        for label, argv in runs:
            samples[label].append(_run(argv, env))
    load_after = os.getloadavg()

    def median(label: str, i: int) -> float:
        return statistics.median(s[i] for s in samples[label])

    base_wall, base_cpu, base_rss = (median(BASELINE[0], i) for i in range(3))
    print(
        f"{args.repeat} rounds; load average {load_before[0]:.2f} before, {load_after[0]:.2f} "
        f"after, on {os.cpu_count()} CPUs"
    )
    header = f"{'command':<28} {'wall s':>7} {'x pass':>7} {'CPU s':>7} {'x pass':>7} {'RSS MiB':>8} {'x pass':>7}"
    print(header)
    print("-" * len(header))
    for label, _ in runs:
        wall, cpu, rss = (median(label, i) for i in range(3))
        goal = ""
        if label in ("pdm --help", "pdm recipes list"):
            goal = f"  (goal < {GOAL_S} s: {'met' if wall < GOAL_S else 'MISSED'})"
        print(
            f"{label:<28} {wall:7.3f} {wall / base_wall:7.1f} {cpu:7.3f} {cpu / base_cpu:7.1f} "
            f"{rss:8.1f} {rss / base_rss:7.1f}{goal}"
        )


if __name__ == "__main__":
    main()
