"""Unsafe keeps, shrink shares and the seed comparison on small, fully known examples."""

from __future__ import annotations

import math
import random
import statistics

import pytest
import torch

from pdmask.analysis import paper
from pdmask.analysis.outcomes import (
    count_outcomes,
    detectable_difference,
    paired_comparison,
    paired_t,
    sign_test_p,
    sign_test_power,
)
from pdmask.analysis.quantities import PREDICTIVE, TESTS, TokenQuantities
from pdmask.analysis.summary import summarize


def test_unsafe_keep_counts_a_hand_made_example():
    d_kl = torch.tensor([[0.3, -0.2, 0.0, 5e-7], [-1.0, 0.1, 0.2, -0.3]])
    kept = torch.tensor([[True, True, True, True], [True, False, True, False]])
    # kept changes: +0.3 grew, -0.2 shrank, 0 and 5e-7 unchanged (tol 1e-6), -1.0 shrank, +0.2 grew
    assert count_outcomes(d_kl, kept, tol=1e-6) == {"kept": 6, "grew": 2, "shrank": 2}
    assert count_outcomes(d_kl, kept, tol=0.0) == {"kept": 6, "grew": 3, "shrank": 2}


def _quantities(out_of_region, grows_ratio, grows_agg):
    t = torch.tensor
    shape = (1, len(out_of_region))
    grows = {"ratio": t([grows_ratio]), "agg": t([grows_agg])}
    zeros = torch.zeros(shape)
    return TokenQuantities(
        valid=torch.ones(shape, dtype=torch.bool),
        advantages=torch.ones(shape),
        kl_topk=zeros,
        kl_full=zeros,
        ratio=zeros,
        ddot={},
        grows=grows,
        out_of_region=t([out_of_region]),
    )


def test_masks_keeps_and_disagreements_of_a_known_example():
    q = _quantities(
        [True, True, True, True, False],
        [True, True, False, False, True],
        [True, False, True, False, True],
    )
    assert q.mask("ratio").tolist() == [[True, True, False, False, False]]
    assert q.kept("ratio").tolist() == [[False, False, True, True, False]]
    assert q.kept("agg").tolist() == [[False, True, False, True, False]]
    assert q.disagree("agg").tolist() == [[False, True, True, False, False]]
    assert q.mask("none").sum() == 0
    # Hand count: after the ratio step, kept tokens 3 and 4 changed by +0.1 and -0.1; after the
    # agg step, kept tokens 2 and 4 changed by -0.2 and -0.1 -> unsafe keep 1/2 vs 0/2.
    ratio_step = torch.tensor([[0.5, 0.4, 0.1, -0.1, 9.0]])
    agg_step = torch.tensor([[0.5, -0.2, 0.3, -0.1, 9.0]])
    assert count_outcomes(ratio_step, q.kept("ratio"), 0.0) == {"kept": 2, "grew": 1, "shrank": 1}
    assert count_outcomes(agg_step, q.kept("agg"), 0.0) == {"kept": 2, "grew": 0, "shrank": 2}


@pytest.mark.parametrize(
    ("wins", "losses", "p"),
    [(5, 0, 2 / 32), (3, 2, 1.0), (9, 1, 2 * 11 / 1024), (0, 0, 1.0), (1, 9, 2 * 11 / 1024)],
)
def test_sign_test_p_values_by_hand(wins, losses, p):
    assert sign_test_p(wins, losses) == pytest.approx(p)


def test_paper_sign_test_is_borderline():
    # 38 of 61: a two-sided sign test not below 0.05 (about 0.07).
    assert 0.05 < paper.SIGN_TEST_P < 0.1


def test_paired_comparison_leaves_out_empty_seeds_and_counts_ties():
    baseline = [0.5, 0.4, math.nan, 0.3, 0.2]
    candidate = [0.4, 0.4, 0.1, 0.35, 0.1]
    cmp = paired_comparison(baseline, candidate)
    assert {k: cmp[k] for k in ("seeds_compared", "seeds_favouring", "seeds_against")} == {
        "seeds_compared": 4,
        "seeds_favouring": 2,
        "seeds_against": 1,
    }
    assert cmp["seeds_tied"] == 1 and cmp["sign_test_p"] == pytest.approx(1.0)
    diffs = [-0.1, 0.0, 0.05, -0.1]  # candidate - baseline on the compared seeds
    assert cmp["mean_difference"] == pytest.approx(sum(diffs) / 4)
    assert cmp["sd_difference"] == pytest.approx(statistics.stdev(diffs))
    assert cmp["sign_test_needed"] is not None


def _record(seed, ratio, agg, out_of_region=10):
    """A seed record whose adamw step counts are given as (kept, grew, shrank) per test."""
    outcomes = {}
    for test in ("none", *TESTS):
        kept, grew, shrank = {"ratio": ratio, "agg": agg}.get(test, agg)
        outcomes[test] = {
            "kept": kept, "grew": grew, "shrank": shrank, "masked": out_of_region - kept,
            "rms_dlogp": 0.01,
        }  # fmt: skip
    accuracy = {"correct": 1, "total": 2}
    return {
        "seed": seed,
        "reward_mean": 0.5,
        "tokens": 100,
        "updated": 90,
        "out_of_region": out_of_region,
        "disagree": dict.fromkeys(PREDICTIVE, 2),
        "kernel_scale": 0.5,
        "lr": {"adamw": 3e-4},
        "outcomes": {"adamw": outcomes},
        "sign_accuracy": {"adamw": {t: {"all": accuracy, "disagree": accuracy} for t in TESTS}},
        "isolated": {
            layers: {"tokens": [0], "d_kl": [0.1], "correct": {"ratio": 1}, "disagree": {}}
            for layers in ("all", "output")
        },
        "rounding": {
            "adamw": {
                "tokens": 100,
                "max_abs": 1e-7 * (seed + 1),
                "max_abs_oor": 1e-8,
                "median_change_oor": 0.01,
                "oor_decided": 9,
                "oor_flipped": 0,
            },
        },  # fmt: skip
        "topk_mass": [0.9, 0.95, 0.99, 1.0],
        "analysed_positions": [7],
        "wall_s": 1.0,
    }


def test_summary_pools_tokens_and_compares_seeds():
    records = [
        _record(0, ratio=(4, 2, 2), agg=(5, 1, 4)),  # 50 % -> 20 %: favours agg
        _record(1, ratio=(2, 1, 1), agg=(2, 2, 0)),  # 50 % -> 100 %: favours ratio
        _record(2, ratio=(4, 1, 3), agg=(0, 0, 0)),  # nothing kept by agg: left out
    ]
    s = summarize(records)
    tests = s["optimizers"]["adamw"]["tests"]
    assert tests["ratio"]["unsafe_keep"] == pytest.approx(4 / 10)
    assert tests["agg"]["unsafe_keep"] == pytest.approx(3 / 7)
    assert tests["agg"]["shrink_share"] == pytest.approx(4 / 7)
    assert tests["ratio"]["unsafe_keep_seed_mean"] == pytest.approx((0.5 + 0.5 + 0.25) / 3)
    assert tests["agg"]["unsafe_keep_seed_mean"] == pytest.approx((0.2 + 1.0) / 2)
    cmp = tests["agg"]["vs_ratio"]
    assert (cmp["seeds_compared"], cmp["seeds_favouring"], cmp["seeds_against"]) == (2, 1, 1)
    assert s["out_of_region_per_seed"] == 10
    assert s["disagree_per_seed"]["agg"] == 2
    assert tests["agg"]["sign_accuracy"] == pytest.approx(0.5)
    assert s["isolated"]["all"]["accuracy"]["ratio"] == pytest.approx(1.0)
    assert s["isolated"]["output"]["tokens"] == 3
    assert s["rounding"]["adamw"]["max_abs"] == pytest.approx(3e-7)  # the worst seed
    assert s["topk_mass"] == pytest.approx([0.9, 0.95, 0.99, 1.0])


def test_the_detectable_difference_is_rejected_with_the_stated_power():
    """Monte Carlo check of the noncentral-t solution: normal differences with that mean and sd
    are rejected by the two-sided paired t-test (alpha 0.05) in 80 % of 4,000 simulated runs
    (standard error 0.6 pp)."""
    from scipy import stats

    n, sd = 12, 0.05
    effect = detectable_difference(n, sd)
    rng = random.Random(0)
    rejected = 0
    for _ in range(4000):
        diffs = [rng.gauss(effect, sd) for _ in range(n)]
        t = statistics.fmean(diffs) / (statistics.stdev(diffs) / math.sqrt(n))
        rejected += 2 * stats.t.sf(abs(t), n - 1) <= 0.05
    assert rejected / 4000 == pytest.approx(0.8, abs=0.025)
    # Against the normal approximation (z_0.975 + z_0.8) sd / sqrt(n): a little larger (t tails).
    assert effect > (1.959964 + 0.841621) * sd / math.sqrt(n)


def test_sign_test_power_by_hand():
    power = sign_test_power(61)
    assert power["sign_test_needed"] == 39  # 38 of 61 (the paper's) is not significant
    assert sign_test_p(39, 22) <= 0.05 < sign_test_p(38, 23)
    q, n = power["sign_test_detectable_share"], 61
    tail = sum(math.comb(n, k) * q**k * (1 - q) ** (n - k) for k in range(39, n + 1))
    low = sum(math.comb(n, k) * q**k * (1 - q) ** (n - k) for k in range(0, n - 39 + 1))
    assert tail + low == pytest.approx(0.8, abs=1e-6)


def test_paired_t_by_hand():
    pairs = [(0.5, 0.4), (0.5, 0.45), (0.3, 0.32), (0.6, 0.5)]
    diffs = [-0.1, -0.05, 0.02, -0.1]
    mean, sd = statistics.fmean(diffs), statistics.stdev(diffs)
    out = paired_t(pairs)
    from scipy import stats

    assert out["t_test_p"] == pytest.approx(
        stats.ttest_rel([c for _, c in pairs], [b for b, _ in pairs]).pvalue
    )
    assert out["mean_difference"] == pytest.approx(mean) and out["sd_difference"] == pytest.approx(
        sd
    )
    assert math.isnan(paired_t([(0.1, 0.2)])["detectable_difference"])
