"""Timing, peak memory and the memory-bandwidth floor, the same way for every part of the check.

Times are medians of repeats with the compared paths interleaved, so that they see the same
clocks and caches. Peak memory is CUDA's allocator peak, both absolute and above what was allocated
before the call, read after the path's ``reset`` (which frees what the last call left, such as a
gradient) so that a figure never counts the previous repeat's buffers; on CPU it is not tracked
(``None``), and the tiny CPU run checks the code, not the figures.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Timed:
    """One path's repeats: seconds and peak bytes above the starting allocation."""

    seconds: list[float] = field(default_factory=list)
    peaks: list[int | None] = field(default_factory=list)  # above the allocation before the call
    absolute_peaks: list[int | None] = field(default_factory=list)

    @property
    def median_s(self) -> float:
        return statistics.median(self.seconds)

    @property
    def peak_bytes(self) -> int | None:
        known = [p for p in self.peaks if p is not None]
        return max(known) if known else None

    @property
    def absolute_peak_bytes(self) -> int | None:
        known = [p for p in self.absolute_peaks if p is not None]
        return max(known) if known else None


def timed_call(
    fn: Callable[[], object],
    device: torch.device,
    into: Timed,
    reset: Callable[[], object] | None = None,
) -> object:
    """Run ``reset`` (untimed), then ``fn`` once, adding its wall time (synchronised) and its peak
    memory to ``into``."""
    if reset is not None:
        reset()
    base = None
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    start = time.perf_counter()
    result = fn()
    sync(device)
    into.seconds.append(time.perf_counter() - start)
    peak = None if base is None else torch.cuda.max_memory_allocated(device)
    into.peaks.append(None if peak is None else peak - base)
    into.absolute_peaks.append(peak)
    return result


def interleaved(
    paths: dict[str, Callable[[], object]],
    device: torch.device,
    repeats: int,
    reset: Callable[[], object] | None = None,
) -> dict[str, Timed]:
    """Every path ``repeats`` times, in alternating order, after one warm-up call each; ``reset``
    before every call (see ``timed_call``)."""
    for fn in paths.values():
        if reset is not None:
            reset()
        fn()  # kernels compiled, caches and lazy imports loaded outside the measurement
    results = {name: Timed() for name in paths}
    for rep in range(repeats):
        order = list(paths) if rep % 2 == 0 else list(reversed(paths))
        for name in order:
            timed_call(paths[name], device, results[name], reset)
    return results


def copy_bandwidth_gbps(device: torch.device, gigabytes: float = 2.0) -> float | None:
    """A large device-to-device copy, bytes read plus written per second: the practical ceiling
    of a memory-bound kernel on this device. None on CPU (not a meaningful floor there)."""
    if device.type != "cuda":
        return None
    n = int(gigabytes * 1e9 / 2)
    a = torch.empty(n, dtype=torch.bfloat16, device=device)
    b = torch.empty_like(a)
    b.copy_(a)
    sync(device)
    start = time.perf_counter()
    for _ in range(5):
        b.copy_(a)
    sync(device)
    seconds = (time.perf_counter() - start) / 5
    del a, b
    torch.cuda.empty_cache()
    return 2 * n * 2 / seconds / 1e9


def gb(n: int | None) -> float | None:
    return None if n is None else round(n / 1e9, 4)


def emit(record: dict, out_file=None) -> None:
    """One JSON line per part: on stdout, and appended to ``out_file`` when given."""
    line = json.dumps(record, sort_keys=True, default=str)
    print(line, flush=True)
    if out_file is not None:
        with open(out_file, "a") as fh:
            fh.write(line + "\n")


def say(text: str) -> None:
    """Human-readable progress and tables (stderr: stdout holds only the JSON lines)."""
    print(text, file=sys.stderr, flush=True)
