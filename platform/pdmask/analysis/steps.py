"""One real optimizer step per direction test, each from the identical saved state.

Between steps the trainer's parameters and the AdamW state are restored from a snapshot, so every
test's step starts from the same point and differs only by its mask. After each step the analysed
minibatch is re-measured: the change of every token's ``D_t`` is what the test's decision is judged
by. ``adamw`` uses the trial's own optimizer (moments and step count as training left them);
``sgd`` is a plain gradient step with the same loss and gradient clipping, whose learning rate is
either given or matched per seed (see :func:`matched_sgd_lr`).
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

import torch

from pdmask.analysis.quantities import KEEP_ALL, TESTS, TokenQuantities
from pdmask.analysis.state import guarded_update

SGD_PROBE_LR = 0.05  # first guess of the matched SGD learning rate (refined by one probe step)


class Snapshot:
    """Deep copies of the trainer's parameters and the optimizer state."""

    def __init__(self, trainer: torch.nn.Module, optimizer: torch.optim.Optimizer):
        self.model = copy.deepcopy(trainer.state_dict())
        self.optimizer = copy.deepcopy(optimizer.state_dict())

    def restore(self, trainer: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        trainer.load_state_dict(self.model)
        # load_state_dict keeps the given tensors (no copy): hand it a fresh copy so the next step's
        # in-place moment updates cannot leak into the snapshot.
        optimizer.load_state_dict(copy.deepcopy(self.optimizer))


@dataclass
class StepOutcome:
    """What one masked step did to the analysed minibatch."""

    d_kl: torch.Tensor  # [n, R] change of D_t
    rms_dlogp: float  # RMS change of log pi over the vocabulary at valid positions (step size)


def log_pi_of(setup, index: torch.Tensor) -> torch.Tensor:
    """log pi over the whole vocabulary, in float64 (step sizes are differences of these)."""
    return torch.log_softmax(setup.logits(index).double(), dim=-1)


@torch.no_grad()
def _remeasure(setup, index, before: TokenQuantities, log_pi_before) -> StepOutcome:
    logits = setup.logits(index)
    after = setup.stats(logits, index).kl_topk
    d_log_pi = torch.log_softmax(logits.double(), dim=-1) - log_pi_before
    rms = d_log_pi[before.valid].pow(2).mean().sqrt()
    return StepOutcome(d_kl=(after - before.kl_topk) * before.valid, rms_dlogp=float(rms))


def one_step(setup, optimizer, mask, index, before, log_pi_before) -> StepOutcome:
    """One update with ``optimizer`` and ``mask`` on ``index``, then re-measure."""
    # The update clears only the optimizer's own gradients, but clips by the norm over every
    # parameter: stale gradients of parameters it does not step would shrink this step.
    setup.trainer.zero_grad(set_to_none=True)
    guarded_update(dataclasses.replace(setup, optimizer=optimizer), mask, index)
    return _remeasure(setup, index, before, log_pi_before)


def matched_sgd_lr(setup, index, before, log_pi_before, snapshot, target_rms: float) -> float:
    """The SGD learning rate whose ratio-test step moves log pi by ``target_rms`` (RMS).

    A gradient step's first-order size is linear in the learning rate: one probe step at
    ``SGD_PROBE_LR`` measures the proportionality constant.
    """
    snapshot.restore(setup.trainer, setup.optimizer)
    probe = torch.optim.SGD(setup.trainer.parameters(), lr=SGD_PROBE_LR)
    moved = one_step(setup, probe, before.mask("ratio"), index, before, log_pi_before).rms_dlogp
    return SGD_PROBE_LR * target_rms / moved if moved > 0 else SGD_PROBE_LR


def _mask_key(mask: torch.Tensor) -> bytes:
    return mask.numpy().tobytes()


def run_test_steps(
    setup,
    index: torch.Tensor,
    before: TokenQuantities,
    optimizers: tuple[str, ...],
    sgd_lr: float | None,
    tol: float = 0.0,
) -> tuple[dict[str, dict[str, StepOutcome]], dict[str, float], dict[str, dict]]:
    """``outcomes[optimizer][test]`` for every test plus the keep-all reference; the learning
    rates; and per optimizer the float32 rounding of the keep-all step (:func:`rounding`).

    Tests whose masks are identical share one step: from the same state the same mask gives the
    same step, bit for bit (deterministic kernels, one thread), so it is taken once.
    """
    tests = (KEEP_ALL, *TESTS)
    snapshot = Snapshot(setup.trainer, setup.optimizer)
    with torch.no_grad():
        log_pi_before = log_pi_of(setup, index)
    outcomes: dict[str, dict[str, StepOutcome]] = {}
    rates: dict[str, float] = {"adamw": float(setup.optimizer.param_groups[0]["lr"])}
    roundings: dict[str, dict] = {}

    def steps_with(name: str, make_optimizer) -> dict[str, StepOutcome]:
        taken: dict[bytes, StepOutcome] = {}
        out: dict[str, StepOutcome] = {}
        for test in tests:
            mask = before.mask(test)
            key = _mask_key(mask)
            if key not in taken:
                snapshot.restore(setup.trainer, setup.optimizer)
                taken[key] = one_step(setup, make_optimizer(), mask, index, before, log_pi_before)
                if test == KEEP_ALL:
                    after = copy.deepcopy(setup.trainer.state_dict())
                    roundings[name] = rounding(
                        setup, index, snapshot.model, after, taken[key].d_kl, before, tol
                    )
            out[test] = taken[key]
        return out

    if "adamw" in optimizers:
        outcomes["adamw"] = steps_with("adamw", lambda: setup.optimizer)
    if "sgd" in optimizers:
        lr = sgd_lr
        if lr is None:
            if "adamw" in outcomes:
                target = outcomes["adamw"]["ratio"].rms_dlogp
            else:
                snapshot.restore(setup.trainer, setup.optimizer)
                mask = before.mask("ratio")
                target = one_step(
                    setup, setup.optimizer, mask, index, before, log_pi_before
                ).rms_dlogp
            lr = matched_sgd_lr(setup, index, before, log_pi_before, snapshot, target)
        rates["sgd"] = lr
        outcomes["sgd"] = steps_with(
            "sgd", lambda: torch.optim.SGD(setup.trainer.parameters(), lr=lr)
        )
    snapshot.restore(setup.trainer, setup.optimizer)
    return outcomes, rates, roundings


def rounding(setup, index, params_before, params_after, d_kl32, before, tol) -> dict:
    """How far float32 rounding moves a step's measured change of ``D_t``.

    The same two parameter sets are re-measured in float64 (a float64 copy of the trainer, the
    rollout's log-probs upcast): the difference of the two changes is the rounding of the float32
    forward pass and statistics. Returned over all valid tokens and over the out-of-region ones,
    with how many out-of-region tokens the two precisions classify differently (grew / shrank /
    unchanged within ``tol``).
    """
    d_kl64 = setup.kl_topk_float64(params_after, index) - setup.kl_topk_float64(
        params_before, index
    )
    valid, oor = before.valid, before.out_of_region
    error = (d_kl32.double() - d_kl64).abs()

    def outcome(d: torch.Tensor) -> torch.Tensor:
        return (d > tol).int() - (d < -tol).int()

    decided = oor & (d_kl64.abs() > tol)
    flipped = oor & (outcome(d_kl32.double()) != outcome(d_kl64))
    return {
        "tokens": int(valid.sum()),
        "max_abs": float(error[valid].max()) if valid.any() else 0.0,
        "max_abs_oor": float(error[oor].max()) if oor.any() else 0.0,
        "median_change_oor": float(d_kl64[oor].abs().median()) if oor.any() else 0.0,
        "oor_decided": int(decided.sum()),
        "oor_flipped": int(flipped.sum()),
    }
