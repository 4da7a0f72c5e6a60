"""Curves and their statistics over seeds: pure numpy, no I/O.

The order of operations is fixed, because each step changes the numbers:

1. per metric history: keep the last value logged at each step (a resumed run repeats steps) and
   drop non-finite values;
2. per run: average the evaluation datasets present at each step;
3. per run (= per seed): smooth, if the spec asks;
4. per method and setting: mean over the seeds present at each step, with a band.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.signal import lfilter

from pdmask.figures.spec import BandSpec, SmoothingSpec


@dataclass(frozen=True)
class Curve:
    """A metric over training steps: strictly increasing integer steps, finite values."""

    steps: np.ndarray
    values: np.ndarray

    def __len__(self) -> int:
        return len(self.steps)

    @staticmethod
    def empty() -> Curve:
        return Curve(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64))


def last_value_per_step(
    steps: Sequence[int], values: Sequence[float], timestamps: Sequence[int] | None = None
) -> Curve:
    """Collapse repeated steps to the value logged last (latest timestamp, then latest in order).

    A run resumed from a checkpoint logs its steps after the checkpoint again; the later values
    are the ones the finished run stands for. Non-finite values are dropped afterwards, so a step
    whose last value is NaN is a missing point, not an earlier stale one.
    """
    steps_a = np.asarray(steps, dtype=np.int64)
    values_a = np.asarray(values, dtype=np.float64)
    if steps_a.size == 0:
        return Curve.empty()
    times = np.zeros_like(steps_a) if timestamps is None else np.asarray(timestamps, dtype=np.int64)
    order = np.lexsort((np.arange(steps_a.size), times, steps_a))
    steps_a, values_a = steps_a[order], values_a[order]
    is_last = np.append(steps_a[1:] != steps_a[:-1], True)
    steps_a, values_a = steps_a[is_last], values_a[is_last]
    finite = np.isfinite(values_a)
    return Curve(steps_a[finite], values_a[finite])


def mean_over_datasets(per_dataset: Mapping[str, Curve]) -> Curve:
    """At each step, the mean over the datasets that have a value at that step."""
    curves = [c for c in per_dataset.values() if len(c)]
    if not curves:
        return Curve.empty()
    if len(curves) == 1:
        return curves[0]
    steps = np.unique(np.concatenate([c.steps for c in curves]))
    total = np.zeros(steps.size)
    count = np.zeros(steps.size)
    for curve in curves:
        where = np.searchsorted(steps, curve.steps)
        total[where] += curve.values
        count[where] += 1
    return Curve(steps, total / count)


def ema(values: np.ndarray, weight: float) -> np.ndarray:
    """Debiased exponential moving average (TensorBoard's smoothing; pandas' adjusted EWM).

    y_t = sum_i w^i x_{t-i} / sum_i w^i, i = 0..t: the first point is not pulled towards zero.
    """
    if weight <= 0 or values.size == 0:
        return values
    raw = lfilter([1.0 - weight], [1.0, -weight], values)
    return raw / (1.0 - weight ** np.arange(1, values.size + 1))


def trailing_mean(values: np.ndarray, window: int) -> np.ndarray:
    """Mean of the last ``window`` points (fewer at the start)."""
    if window <= 1 or values.size == 0:
        return values
    sums = np.cumsum(np.insert(values, 0, 0.0))
    idx = np.arange(1, values.size + 1)
    start = np.maximum(idx - window, 0)
    return (sums[idx] - sums[start]) / (idx - start)


def smooth(curve: Curve, spec: SmoothingSpec) -> Curve:
    """Smooth one seed's curve over its points (not over step distance)."""
    if spec.kind == "ema":
        return Curve(curve.steps, ema(curve.values, spec.weight))
    if spec.kind == "rolling":
        return Curve(curve.steps, trailing_mean(curve.values, spec.window))
    return curve


@dataclass(frozen=True)
class SeedAggregate:
    """Mean over seeds at each step, with the band and the number of seeds behind each point."""

    steps: np.ndarray
    mean: np.ndarray
    lower: np.ndarray  # NaN where the band is undefined (fewer than two seeds)
    upper: np.ndarray
    n_seeds: np.ndarray
    sd: np.ndarray  # sample sd (ddof=1); NaN with fewer than two seeds

    def __len__(self) -> int:
        return len(self.steps)


def seed_matrix(curves: Sequence[Curve]) -> tuple[np.ndarray, np.ndarray]:
    """Union of steps and a [seeds, steps] matrix with NaN where a seed has no point."""
    steps = np.unique(np.concatenate([c.steps for c in curves])) if curves else np.zeros(0, int)
    matrix = np.full((len(curves), steps.size), np.nan)
    for row, curve in enumerate(curves):
        matrix[row, np.searchsorted(steps, curve.steps)] = curve.values
    return steps, matrix


def aggregate_seeds(curves: Sequence[Curve], band: BandSpec) -> SeedAggregate:
    """Seed mean and band at every step where at least one seed has a value."""
    curves = [c for c in curves if len(c)]
    steps, matrix = seed_matrix(curves)
    n = np.sum(~np.isnan(matrix), axis=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN / single-seed columns
        mean = np.nanmean(matrix, axis=0) if curves else np.zeros(0)
        sd = np.nanstd(matrix, axis=0, ddof=1) if curves else np.zeros(0)
    sd = np.where(n >= 2, sd, np.nan)
    if band.kind == "sd":
        lower, upper = mean - sd, mean + sd
    elif band.kind == "bootstrap":
        lower, upper = bootstrap_interval(matrix, band)
    else:
        lower = upper = np.full(steps.size, np.nan)
    return SeedAggregate(steps, mean, lower, upper, n, sd)


def bootstrap_interval(matrix: np.ndarray, band: BandSpec) -> tuple[np.ndarray, np.ndarray]:
    """Percentile bootstrap CI of the mean over seeds (rows), per step; NaN below two seeds."""
    n_rows, n_cols = matrix.shape
    nan = np.full(n_cols, np.nan)
    if n_rows < 2:
        return nan, nan.copy()
    rng = np.random.default_rng(band.seed)
    means = np.empty((band.resamples, n_cols))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for start in range(0, band.resamples, 500):  # chunks bound the [chunk, seeds, steps] copy
            stop = min(start + 500, band.resamples)
            picks = rng.integers(0, n_rows, size=(stop - start, n_rows))
            means[start:stop] = np.nanmean(matrix[picks], axis=1)
        tail = (1.0 - band.level) / 2.0
        lower = np.nanquantile(means, tail, axis=0)
        upper = np.nanquantile(means, 1.0 - tail, axis=0)
    few = np.sum(~np.isnan(matrix), axis=0) < 2
    lower[few] = np.nan
    upper[few] = np.nan
    return lower, upper
