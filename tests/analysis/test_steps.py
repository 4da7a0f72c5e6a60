"""One real step per test from the identical saved state, checked against hand-written updates."""

from __future__ import annotations

import copy

import pytest
import torch

from pdmask.analysis.isolated import ISOLATED_LR, isolated_checks
from pdmask.analysis.quantities import TESTS, measure_tokens
from pdmask.analysis.steps import run_test_steps
from tests.analysis.bruteforce import kl_topk_reference, manual_step


def _saved(setup):
    return copy.deepcopy(setup.trainer.state_dict()), copy.deepcopy(setup.optimizer.state_dict())


def _assert_same_state(setup, params, optim):
    for name, value in setup.trainer.state_dict().items():
        assert torch.equal(value, params[name]), name
    now = setup.optimizer.state_dict()["state"]
    for key, entry in optim["state"].items():
        for field, value in entry.items():
            assert torch.equal(torch.as_tensor(now[key][field]), torch.as_tensor(value))


def _reference_change(setup, index, params, optim, optimizer_name, lr, mask):
    """ΔD_t of one hand-written update from the saved state, D recomputed in float64."""
    setup.trainer.load_state_dict(params)
    if optimizer_name == "adamw":
        optimizer = setup.optimizer
        optimizer.load_state_dict(copy.deepcopy(optim))
    else:
        optimizer = torch.optim.SGD(setup.trainer.parameters(), lr=lr)
    with torch.no_grad():
        before = kl_topk_reference(setup.logits(index), setup, index)
    manual_step(setup.trainer, optimizer, setup, index, mask, setup.config.grad_clip)
    with torch.no_grad():
        after = kl_topk_reference(setup.logits(index), setup, index)
    return {key: after[key] - before[key] for key in before}


def test_each_test_step_matches_a_hand_written_update_from_the_saved_state(analysed, median_delta):
    _, state = analysed
    setup, index = state.setup, state.index
    q = measure_tokens(setup, index, median_delta)
    params, optim = _saved(setup)
    outcomes, rates, _ = run_test_steps(setup, index, q, ("adamw", "sgd"), sgd_lr=0.05)
    _assert_same_state(setup, params, optim)  # the analysis leaves the state as it found it
    assert rates == {"adamw": setup.optimizer.param_groups[0]["lr"], "sgd": 0.05}
    assert set(outcomes["adamw"]) == {"none", *TESTS}

    # "agg" ran after "none" and "ratio", "exact" last: a leaky restore would show here.
    for optimizer_name, test in (("adamw", "agg"), ("adamw", "exact"), ("sgd", "ratio")):
        mask = q.mask(test)
        expected = _reference_change(setup, index, params, optim, optimizer_name, 0.05, mask)
        measured = outcomes[optimizer_name][test].d_kl
        for (row, pos), change in expected.items():
            assert float(measured[row, pos]) == pytest.approx(change, rel=1e-3, abs=2e-6)
        assert max(abs(c) for c in expected.values()) > 1e-4  # the step really moved D_t
    setup.trainer.load_state_dict(params)
    setup.optimizer.load_state_dict(optim)

    # Different masks make different steps.
    differ = q.mask("agg") != q.mask("ratio")
    assert differ.any()
    assert not torch.equal(outcomes["adamw"]["agg"].d_kl, outcomes["adamw"]["ratio"].d_kl)


def test_matched_sgd_step_moves_log_pi_as_far_as_the_adamw_step(analysed, median_delta):
    _, state = analysed
    q = measure_tokens(state.setup, state.index, median_delta)
    params, optim = _saved(state.setup)
    outcomes, rates, _ = run_test_steps(state.setup, state.index, q, ("adamw", "sgd"), sgd_lr=None)
    target = outcomes["adamw"]["ratio"].rms_dlogp
    assert outcomes["sgd"]["ratio"].rms_dlogp == pytest.approx(target, rel=0.1)
    assert rates["sgd"] != 0.05
    _assert_same_state(state.setup, params, optim)


# The smoke state's output-layer steps are tiny at the default rate (D_t changes near float32
# resolution), so that variant is checked with a larger one.
@pytest.mark.parametrize(("layers", "lr"), [("all", ISOLATED_LR), ("output", 0.05)])
def test_isolated_steps_change_d_as_single_token_updates_would(analysed, median_delta, layers, lr):
    _, state = analysed
    setup, index = state.setup, state.index
    q = measure_tokens(setup, index, median_delta)
    params, optim = _saved(setup)
    generator = torch.Generator().manual_seed(0)
    result = isolated_checks(setup, index, q, median_delta, 3, generator, layers, lr)
    _assert_same_state(setup, params, optim)
    assert len(result["tokens"]) == 3
    positions = q.out_of_region.nonzero()
    for token, measured in zip(result["tokens"], result["d_kl"], strict=True):
        row, col = positions[token].tolist()
        sequence = index[row : row + 1]
        only = torch.ones_like(setup.valid[sequence])
        only[0, col] = False
        setup.trainer.load_state_dict(params)
        trainable = setup.trainer if layers == "all" else setup.trainer.lm_head
        sgd = torch.optim.SGD(trainable.parameters(), lr=lr)
        with torch.no_grad():
            before = kl_topk_reference(setup.logits(sequence), setup, sequence)
        setup.trainer.zero_grad(set_to_none=True)
        manual_step(setup.trainer, sgd, setup, sequence, only, setup.config.grad_clip)
        with torch.no_grad():
            after = kl_topk_reference(setup.logits(sequence), setup, sequence)
        assert measured == pytest.approx(after[(0, col)] - before[(0, col)], rel=1e-2, abs=1e-8)
    setup.trainer.load_state_dict(params)
    grew = [d > 0 for d in result["d_kl"]]
    rows, cols = positions[result["tokens"]].unbind(1)
    for test in TESTS:
        predicted = q.grows[test][rows, cols].tolist()
        assert result["correct"][test] == sum(p == g for p, g in zip(predicted, grew, strict=True))


def test_output_layer_steps_move_logits_along_v_so_the_bucket_derivative_is_right(
    analysed, median_delta
):
    """With the hidden states fixed the logits move exactly along v = e_k - pi, the step Ddot is
    derived for; Ddot_bucket is the exact derivative of the measured top-K KL along it, so it
    calls every sign whose first-order change dominates (tokens with a derivative near 0 may be
    decided by the second-order term, which is always positive)."""
    _, state = analysed
    q = measure_tokens(state.setup, state.index, median_delta)
    generator = torch.Generator().manual_seed(0)
    result = isolated_checks(state.setup, state.index, q, median_delta, 16, generator, "output")
    rows, cols = q.out_of_region.nonzero()[result["tokens"]].unbind(1)
    predicted = (q.advantages * q.ddot["bucket"])[rows, cols]
    measured = torch.tensor(result["d_kl"])
    strong = predicted.abs() >= predicted.abs().median()
    assert int(strong.sum()) >= 8
    assert torch.equal(measured[strong] > 0, predicted[strong] > 0)
    # The ratio test, which keeps only the local term, is not always right on these tokens.
    assert result["correct"]["bucket"] >= result["correct"]["ratio"]
