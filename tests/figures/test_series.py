"""Per-step statistics: repeated steps, dataset means, smoothing, seed bands, name matching."""

from __future__ import annotations

import numpy as np
import pytest

from pdmask.figures.series import (
    Curve,
    aggregate_seeds,
    last_value_per_step,
    mean_over_datasets,
    smooth,
)
from pdmask.figures.spec import BandSpec, SmoothingSpec
from pdmask.tracking.metric_names import match_datasets


def test_repeated_steps_keep_the_value_logged_last():
    # steps 2 and 3 logged twice (a resume); order in the list is not the logging order.
    curve = last_value_per_step(
        steps=[0, 1, 2, 3, 2, 3, 4], values=[0.0, 1.0, 9.0, 9.0, 2.0, np.nan, 4.0],
        timestamps=[10, 11, 12, 13, 22, 23, 24],
    )  # fmt: skip
    assert curve.steps.tolist() == [0, 1, 2, 4]  # step 3's last value is NaN: a missing point
    assert curve.values.tolist() == [0.0, 1.0, 2.0, 4.0]
    tie = last_value_per_step([5, 5], [1.0, 2.0], [7, 7])
    assert tie.values.tolist() == [2.0]  # same timestamp: the later entry wins


def test_datasets_are_averaged_where_present():
    a = Curve(np.array([0, 1, 2]), np.array([0.1, 0.2, 0.3]))
    b = Curve(np.array([0, 2, 3]), np.array([0.3, 0.5, 0.7]))
    mean = mean_over_datasets({"aime24": a, "aime25": b})
    assert mean.steps.tolist() == [0, 1, 2, 3]
    np.testing.assert_allclose(mean.values, [0.2, 0.2, 0.4, 0.7])


def test_smoothing_is_per_point_and_debiased():
    curve = Curve(np.array([0, 10, 20]), np.array([1.0, 0.0, 0.0]))
    ema = smooth(curve, SmoothingSpec(kind="ema", weight=0.5)).values
    np.testing.assert_allclose(ema, [1.0, 0.5 / 1.5, 0.25 / 1.75])
    rolling = smooth(curve, SmoothingSpec(kind="rolling", window=2)).values
    np.testing.assert_allclose(rolling, [1.0, 0.5, 0.0])
    assert smooth(curve, SmoothingSpec()).values is curve.values


def test_seed_band_is_one_sd_and_undefined_for_one_seed():
    seeds = [
        Curve(np.array([0, 1, 2]), np.array([1.0, 2.0, 3.0])),
        Curve(np.array([0, 1]), np.array([3.0, 4.0])),
    ]
    agg = aggregate_seeds(seeds, BandSpec(kind="sd"))
    assert agg.steps.tolist() == [0, 1, 2] and agg.n_seeds.tolist() == [2, 2, 1]
    np.testing.assert_allclose(agg.mean, [2.0, 3.0, 3.0])
    np.testing.assert_allclose(agg.lower[:2], 2.0 + np.array([0, 1]) - np.sqrt(2))
    assert np.isnan(agg.lower[2]) and np.isnan(agg.sd[2])


def test_bootstrap_band_is_reproducible_and_brackets_the_mean():
    rng = np.random.default_rng(1)
    seeds = [Curve(np.arange(20), rng.normal(size=20)) for _ in range(8)]
    band = BandSpec(kind="bootstrap", resamples=500, seed=3)
    one, two = aggregate_seeds(seeds, band), aggregate_seeds(seeds, band)
    np.testing.assert_array_equal(one.lower, two.lower)
    assert np.all(one.lower < one.mean) and np.all(one.mean < one.upper)
    assert np.all(one.upper - one.lower < 4 * one.sd)  # a CI of the mean, narrower than ±2 sd
    other = aggregate_seeds(seeds, BandSpec(kind="bootstrap", resamples=500, seed=4))
    assert not np.array_equal(one.lower, other.lower)


@pytest.mark.parametrize("pattern", ["val-core/*/acc/mean@16", "val-core/*/acc/mean_at_16"])
def test_metric_pattern_matches_one_dataset_segment_in_either_spelling(pattern):
    names = [
        "val-core/aime24/acc/mean_at_16",
        "val-core/aime25/acc/mean@16",
        "val-core/synth/acc/std_at_16",
        "val-core/a/b/acc/mean_at_16",
        "val-aux/aime24/acc/mean_at_16",
        "actor/pdm/masked_frac",
    ]
    assert match_datasets(pattern, names) == {
        "aime24": "val-core/aime24/acc/mean_at_16",
        "aime25": "val-core/aime25/acc/mean@16",
    }
