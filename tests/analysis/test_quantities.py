"""The per-token quantities and the tests' decisions against a float64 brute-force recomputation."""

from __future__ import annotations

import math

import pytest
import torch

from pdmask.analysis.quantities import KEEP_ALL, PREDICTIVE, TESTS, measure_tokens
from tests.analysis.bruteforce import reference_table


@pytest.fixture
def measured(analysed, median_delta):
    _, state = analysed
    q = measure_tokens(state.setup, state.index, median_delta)
    with torch.no_grad():
        logits = state.setup.logits(state.index)
    return median_delta, state, q, reference_table(logits, state.setup, state.index)


def test_every_quantity_matches_the_float64_recomputation(measured):
    _, _, q, reference = measured
    assert len(reference) == int(q.valid.sum()) > 10
    for (row, pos), ref in reference.items():
        got = {
            "kl_topk": q.kl_topk[row, pos],
            "ratio": q.ratio[row, pos],
            "kl_full": q.kl_full[row, pos],
            **{name: q.ddot[name][row, pos] for name in ("agg", "uni", "bucket", "exact")},
        }
        for name, value in got.items():
            assert float(value) == pytest.approx(ref[name], rel=2e-4, abs=2e-6), (row, pos, name)


def test_tail_estimators_really_differ_here(measured):
    """With a ~1,000-wide vocabulary and top-20 mass well below 1, agg and uni differ far beyond
    the tolerance above (2e-6), so the check above would catch swapped estimators."""
    _, _, _, reference = measured
    gaps = [abs(ref["agg"] - ref["uni"]) for ref in reference.values()]
    assert max(gaps) > 1e-4


def test_out_of_region_and_decisions_follow_their_definitions(measured):
    delta, _, q, reference = measured
    checked = 0
    for (row, pos), ref in reference.items():
        adv = float(q.advantages[row, pos])
        if abs(ref["kl_topk"] - delta) < 1e-5:
            continue  # float32 vs float64 on the threshold: either answer is right
        outside = ref["kl_topk"] > delta and adv != 0
        assert bool(q.out_of_region[row, pos]) == outside
        expected = {"ratio": adv * (ref["ratio"] - 1)}
        expected.update({name: adv * ref[name] for name in PREDICTIVE})
        for test, value in expected.items():
            if abs(value) < 1e-6:
                continue
            grows = value > 0
            assert bool(q.grows[test][row, pos]) == grows, (row, pos, test)
            assert bool(q.mask(test)[row, pos]) == (outside and grows)
            assert bool(q.kept(test)[row, pos]) == (outside and not grows)
            checked += 1
    assert checked > 20
    assert int(q.out_of_region.sum()) > 0
    assert not q.mask(KEEP_ALL).any()


def test_disagreement_is_where_the_two_tests_decide_differently(measured):
    _, _, q, _ = measured
    for test in PREDICTIVE:
        differ = q.out_of_region & (q.mask(test) != q.mask("ratio"))
        assert torch.equal(q.disagree(test), differ)
    assert set(q.grows) == set(TESTS)
    assert any(int(q.disagree(t).sum()) > 0 for t in PREDICTIVE)
    assert not math.isnan(float(q.kl_topk[q.valid].sum()))
