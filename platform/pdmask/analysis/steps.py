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


def run_test_steps(
    setup,
    index: torch.Tensor,
    before: TokenQuantities,
    optimizers: tuple[str, ...],
    sgd_lr: float | None,
) -> tuple[dict[str, dict[str, StepOutcome]], dict[str, float]]:
    """``outcomes[optimizer][test]`` for every test plus the keep-all reference; learning rates."""
    tests = (KEEP_ALL, *TESTS)
    snapshot = Snapshot(setup.trainer, setup.optimizer)
    with torch.no_grad():
        log_pi_before = log_pi_of(setup, index)
    outcomes: dict[str, dict[str, StepOutcome]] = {}
    rates: dict[str, float] = {"adamw": float(setup.optimizer.param_groups[0]["lr"])}

    def adamw_step(test: str) -> StepOutcome:
        snapshot.restore(setup.trainer, setup.optimizer)
        return one_step(setup, setup.optimizer, before.mask(test), index, before, log_pi_before)

    if "adamw" in optimizers:
        outcomes["adamw"] = {t: adamw_step(t) for t in tests}
    if "sgd" in optimizers:
        lr = sgd_lr
        if lr is None:
            reference = outcomes["adamw"]["ratio"] if "adamw" in outcomes else adamw_step("ratio")
            lr = matched_sgd_lr(setup, index, before, log_pi_before, snapshot, reference.rms_dlogp)
        rates["sgd"] = lr
        outcomes["sgd"] = {}
        for test in tests:
            snapshot.restore(setup.trainer, setup.optimizer)
            sgd = torch.optim.SGD(setup.trainer.parameters(), lr=lr)
            outcomes["sgd"][test] = one_step(
                setup, sgd, before.mask(test), index, before, log_pi_before
            )
    snapshot.restore(setup.trainer, setup.optimizer)
    return outcomes, rates
