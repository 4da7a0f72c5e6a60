"""Several analysed minibatches, each from its own state; merged records; the float32 rounding."""

from __future__ import annotations

import copy

import pytest
import torch

from pdmask.analysis.config import TokenAnalysisConfig
from pdmask.analysis.quantities import measure_tokens
from pdmask.analysis.seed import merge_minibatches
from pdmask.analysis.setting import resolve_setting
from pdmask.analysis.state import analysed_minibatches
from pdmask.analysis.steps import rounding, run_test_steps
from tests.analysis.conftest import SMALL


def test_analysing_a_minibatch_leaves_training_exactly_as_it_would_have_gone(pdm_home):
    """Two analysed minibatches: the analysis of the first (every test's step, restored) leaves
    the state from which the second is reached bit for bit the state without any analysis."""
    torch.set_num_threads(1)
    two = TokenAnalysisConfig(**{**SMALL, "minibatches": 3, "analysed_minibatches": 2}, seeds=1)
    one = two.model_copy(update={"analysed_minibatches": 1})
    setting = resolve_setting(two)

    states = analysed_minibatches(setting, two, seed=0)
    first = next(states)
    assert first.position == 1
    q = measure_tokens(first.setup, first.index, 1e-9)  # every updated token out of region
    run_test_steps(first.setup, first.index, q, ("adamw", "sgd"), sgd_lr=None)
    second = next(states)
    assert second.position == 2
    analysed = {k: v.clone() for k, v in second.setup.trainer.state_dict().items()}
    with pytest.raises(StopIteration):
        next(states)

    plain = next(analysed_minibatches(setting, one, seed=0))
    assert plain.position == 2 and torch.equal(plain.index, second.index)
    for name, value in plain.setup.trainer.state_dict().items():
        assert torch.equal(value, analysed[name]), name


def test_identical_masks_share_one_step(analysed, median_delta):
    _, state = analysed
    q = measure_tokens(state.setup, state.index, median_delta)
    q.grows["uni"] = q.grows["agg"].clone()  # uni now masks exactly what agg masks
    outcomes, _, _ = run_test_steps(state.setup, state.index, q, ("adamw",), sgd_lr=None)
    assert outcomes["adamw"]["uni"] is outcomes["adamw"]["agg"]
    assert outcomes["adamw"]["ratio"] is not outcomes["adamw"]["agg"]


def test_the_float64_recomputation_measures_the_rounding(analysed, median_delta):
    """kl_topk_float64 against a float64 copy of the trainer by hand; the rounding of the
    keep-all step is far below the tie tolerance and equals the largest |float32 - float64|."""
    from pdmask.backends.sim.grpo import token_stats, trainer_logits

    _, state = analysed
    setup, index = state.setup, state.index
    params = {k: v.clone() for k, v in setup.trainer.state_dict().items()}
    model = copy.deepcopy(setup.trainer).double()  # the reference: cast by hand
    with torch.no_grad():
        logits = trainer_logits(model, setup.batch, index)
    assert logits.dtype == torch.float64
    expected = token_stats(logits, setup.batch, index).kl_topk
    measured = setup.kl_topk_float64(params, index)
    torch.testing.assert_close(measured, expected, rtol=0, atol=0)  # the same computation
    assert not torch.equal(measured.float(), setup.stats(setup.logits(index), index).kl_topk)

    q = measure_tokens(setup, index, median_delta)
    tol = TokenAnalysisConfig.model_fields["tie_tol"].default
    _, _, roundings = run_test_steps(setup, index, q, ("adamw",), sgd_lr=None, tol=tol)
    r = roundings["adamw"]
    assert r["tokens"] == int(q.valid.sum()) and r["oor_decided"] > 0
    # D_t sums ~K+2 terms mu log(mu / pi) with |log| up to ~10, each good to a few float32 eps
    # (1.2e-7): a few 1e-6 at worst. The default tolerance stays above that.
    assert 0 < r["max_abs"] < tol
    assert r["max_abs_oor"] <= r["max_abs"] and r["oor_flipped"] == 0

    # The function itself, on a known perturbation of a float64 change.
    change = torch.zeros_like(q.kl_topk, dtype=torch.float64)
    after = {k: v.clone() for k, v in params.items()}
    known = rounding(setup, index, params, after, change.float() + 3e-7 * q.valid, q, tol)
    assert known["max_abs"] == pytest.approx(3e-7, rel=1e-6)
    assert known["median_change_oor"] == 0.0


def test_merging_minibatches_adds_counts_concatenates_tokens_averages_rates():
    def part(n, lr, worst):
        return {
            "tokens": n,
            "out_of_region": 2 * n,
            "disagree": {"agg": n},
            "lr": {"sgd": lr},
            "outcomes": {"sgd": {"ratio": {"kept": n, "grew": 1, "rms_dlogp": lr}}},
            "tokens_oor": {"minibatch": [n] * 2, "d_kl": {"sgd": {"ratio": [0.1, -0.1]}}},
            "topk_mass": [0.5 * n, 1.0],
            "rounding": {"sgd": {"tokens": n, "max_abs": worst, "max_abs_oor": worst,
                                 "median_change_oor": 0.1, "oor_decided": n, "oor_flipped": 0}},
            "isolated": {"all": {"tokens": [n]}},
            "sign_accuracy": {},
        }  # fmt: skip

    merged = merge_minibatches([part(1, 0.1, 1e-8), part(3, 0.3, 4e-8)])
    assert merged["tokens"] == 4 and merged["out_of_region"] == 8
    assert merged["disagree"] == {"agg": 4}
    assert merged["lr"]["sgd"] == pytest.approx(0.2)
    assert merged["outcomes"]["sgd"]["ratio"]["kept"] == 4
    assert merged["outcomes"]["sgd"]["ratio"]["rms_dlogp"] == pytest.approx(0.2)
    assert merged["tokens_oor"]["minibatch"] == [1, 1, 3, 3]
    assert merged["tokens_oor"]["d_kl"]["sgd"]["ratio"] == [0.1, -0.1, 0.1, -0.1]
    assert merged["topk_mass"] == [1.0, 1.0]
    assert merged["rounding"]["sgd"]["max_abs"] == 4e-8 and merged["rounding"]["sgd"]["tokens"] == 4
    assert merged["isolated"] == {"all": {"tokens": [3]}}  # the last minibatch's
