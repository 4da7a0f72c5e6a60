"""The per-token quantities and the tests' decisions against a float64 brute-force recomputation."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from pdmask.analysis.quantities import (
    FREE_LOGIT_TESTS,
    KEEP_ALL,
    PREDICTIVE,
    SECOND_ORDER_ETA,
    TESTS,
    fit_kernel_scale,
    measure_tokens,
)
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
            **{name: q.ddot[name][row, pos] for name in ("agg", "uni", "bucket", "2nd", "exact")},
        }
        for name, value in got.items():
            assert float(value) == pytest.approx(ref[name], rel=2e-4, abs=2e-6), (row, pos, name)


def test_the_second_order_test_is_pdm_2nds_mask(measured):
    """``2nd`` masks what the shipped recipe masks, at the recipe's default eta."""
    from pdmask.trust_region import apply_method
    from tests.methods import method, project_recipes

    delta, state, q, _ = measured
    assert project_recipes()["pdm-2nd"].params["eta"].default == SECOND_ORDER_ETA
    with torch.no_grad():
        logits = state.setup.logits(state.index)
        stats = state.setup.stats(logits, state.index, inputs=("second_order",))
    valid = state.setup.valid[state.index]
    advantages = state.setup.advantages[state.index]
    recipe_mask = apply_method(
        method("pdm-2nd", delta=delta), stats, advantages, valid, backend="sim"
    ).mask
    assert torch.equal(recipe_mask, q.mask("2nd"))
    assert bool((q.mask("2nd") != q.mask("agg")).any())  # the second order decides somewhere


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
        expected.update({name: adv * ref[name] for name in FREE_LOGIT_TESTS[1:]})
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


def test_own_prediction_is_the_directional_derivative_along_the_tokens_gradient(measured):
    """``own`` = <grad D_t, grad log pi_k>: in a float64 copy of the network, D_t moved along
    +-eps grad log pi_k (central difference, error O(eps^2)) gives the same number."""
    import dataclasses

    from pdmask.analysis.own_gradient import kl_topk_of

    _, state, q, _ = measured
    setup = state.setup
    double = dataclasses.replace(setup, trainer=copy.deepcopy(setup.trainer).double())
    params = list(double.trainer.parameters())
    positions = q.out_of_region.nonzero()[:4].tolist()
    assert positions
    for row, col in positions:
        sequence = state.index[row : row + 1]

        def divergence_and_logp(sequence=sequence, col=col):
            stats = double.stats(double.logits(sequence), sequence, ("support_log_probs",))
            return kl_topk_of(stats.support)[0, col], stats.logp[0, col]

        divergence, logp = divergence_and_logp()
        assert float(divergence) == pytest.approx(float(q.kl_topk[row, col]), rel=1e-4, abs=1e-6)
        grad = torch.autograd.grad(logp, params)
        eps = 1e-5
        moved = []
        with torch.no_grad():
            for sign in (1, -1):
                for p, g in zip(params, grad, strict=True):
                    p.add_(sign * eps * g)
                moved.append(float(divergence_and_logp()[0]))
                for p, g in zip(params, grad, strict=True):
                    p.sub_(sign * eps * g)
        central = (moved[0] - moved[1]) / (2 * eps)
        # float32 network for q: its rounding (~1e-6 relative) bounds the agreement
        assert float(q.ddot["own"][row, col]) == pytest.approx(central, rel=1e-3, abs=1e-6)


def test_kernel_tests_follow_their_definitions(measured):
    _, _, q, _ = measured
    oor = q.out_of_region
    for name in ("gram", "kernel", "own", "own-adam"):
        value = q.ddot[name]
        assert not value[oor].isnan().any(), name
        assert torch.equal(q.grows[name][oor], (q.advantages * value > 0)[oor]), name
    assert q.kernel_scale is not None and q.kernel_scale >= 0
    assert fit_kernel_scale(torch.tensor([2.0, -4.0]), torch.tensor([1.0, -2.0])) == 2.0
    assert fit_kernel_scale(torch.tensor([-1.0]), torch.tensor([1.0])) == 0.0  # K_h is PSD
