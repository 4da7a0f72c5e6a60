"""The mechanism without the crowd: one plain gradient step on a single token's loss.

A real update sums every token's gradient, so a token's ``D_t`` moves mostly with the others'
gradients (and, under AdamW, with the momentum of earlier minibatches). ``Ddot`` predicts only the
token's *own* contribution. This check isolates it: for a sample of out-of-region tokens, restore
the state, take one small SGD step on that token's loss alone (every other token masked) and see
whether ``D_t`` moved the way each direction test predicted. It separates "the derivative is wrong"
from "the token's own gradient is drowned out".

Two variants (``layers``): ``all`` updates the whole network, so the token's logits move along
``J J^T v`` (the network's kernel couples tokens with similar output embeddings, e.g. synonyms);
``output`` updates only the output layer with the hidden states fixed, so they move exactly along
``v = e_k - pi`` (the free-logit step ``Ddot`` is derived for) and ``Ddot_bucket``, the exact
derivative of the measured top-K KL along ``v``, must call the sign right up to second-order effects.
"""

from __future__ import annotations

import torch

from pdmask.analysis.quantities import PREDICTIVE, TESTS, TokenQuantities, measure_tokens
from pdmask.analysis.steps import Snapshot, log_pi_of, one_step

ISOLATED_LR = 1e-3  # small, so the step stays in the first-order regime the derivative describes
LAYERS = ("all", "output")


def isolated_checks(
    setup,
    index: torch.Tensor,
    q: TokenQuantities,
    delta: float,
    max_tokens: int,
    generator: torch.Generator,
    layers: str = "all",
    lr: float = ISOLATED_LR,
) -> dict:
    """Per sampled token: its position among the out-of-region tokens and its change of ``D_t``."""
    params = setup.trainer.parameters() if layers == "all" else setup.trainer.lm_head.parameters()
    params = list(params)
    positions = q.out_of_region.nonzero()
    if max_tokens == 0 or len(positions) == 0:
        return {"tokens": [], "d_kl": [], "correct": {}, "disagree": {}}
    picked = torch.randperm(len(positions), generator=generator)[:max_tokens].sort().values
    snapshot = Snapshot(setup.trainer, setup.optimizer)
    d_kls: list[float] = []
    for row, col in positions[picked].tolist():
        sequence = index[row : row + 1]
        snapshot.restore(setup.trainer, setup.optimizer)
        with torch.no_grad():
            before = measure_tokens(setup, sequence, delta, kernel=False)
            log_pi = log_pi_of(setup, sequence)
        only_this = torch.ones_like(before.valid)
        only_this[0, col] = False
        sgd = torch.optim.SGD(params, lr=lr)
        outcome = one_step(setup, sgd, only_this, sequence, before, log_pi)
        d_kls.append(float(outcome.d_kl[0, col]))
    snapshot.restore(setup.trainer, setup.optimizer)

    rows, cols = positions[picked].unbind(1)
    grew = torch.tensor(d_kls) > 0
    correct, disagree = {}, {}
    for test in TESTS:
        predicted = q.grows[test][rows, cols]
        correct[test] = int((predicted == grew).sum())
    for test in PREDICTIVE:
        where = q.disagree(test)[rows, cols]
        right = (q.grows[test][rows, cols] == grew) & where
        disagree[test] = {"correct": int(right.sum()), "total": int(where.sum())}
    return {"tokens": picked.tolist(), "d_kl": d_kls, "correct": correct, "disagree": disagree}
