"""The logits pass on vocabulary-parallel logits (``trust_region/vocab_parallel.py``): on real
process groups (gloo over loopback, four processes spawned once for every case: two TP-2 groups and
one TP-4 group, ``vocab_parallel_ranks.py``), every output and every rank's columns of the gradient
against the full vocabulary in float64, through each engine a shard can take, and five methods'
losses, masks, statistics and gradients.

Tolerances: float64 shards against float64 references at 1e-12 (the shards' sums are added in
another order, and the log-sum-exp is combined from the shards'). float32 and bf16 shards are
computed in float32 and held to ``fused_cases.assert_matches_float64``, the tolerances of the
full-vocabulary fused passes: the combination adds a few float32 roundings of the shards'
log-sum-exp, within them.
"""

from __future__ import annotations

import json

import pytest
import torch.multiprocessing as mp

from .fused_cases import assert_matches_float64
from .vocab_parallel_ranks import RANKS, run

pytest.importorskip("triton")

RECIPES = ["pdm-agg", "pdm-uni", "dppo-topk-kl", "ent-bonus", "support-kl"]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """Each rank's results: ``[rank]["tp2" | "tp4"]``."""
    folder = tmp_path_factory.mktemp("vocab-parallel")
    mp.spawn(run, args=(str(folder),), nprocs=RANKS, join=True)
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(RANKS)]


def _each(ranks, part):
    for rank, result in enumerate(ranks):
        for tp in ("tp2", "tp4"):
            for case in result[tp][part]:
                yield rank, case


@pytest.mark.parametrize("tp", ["tp2", "tp4"])
def test_a_replicated_loss_gets_each_shards_gradient_once_not_tp_times(ranks, tp):
    """The gradient trap: through an all-reduce whose backward sums the ranks' gradients, a loss
    that every rank computes comes out TP times too large; through the pass, once. (The second
    number shows this test can fail: it is what the first would be with that all-reduce.)"""
    size = int(tp[2:])
    for result in ranks:
        trap = result[tp]["trap"]
        assert abs(trap["pass"] - 1) < 1e-12, trap
        assert abs(trap["all_reduce_nn"] - size) < 1e-9, trap


def test_every_output_and_gradient_equals_the_full_vocabulary_in_float64(ranks):
    cases = list(_each(ranks, "pass"))
    engines = {(c["engine"], c["dtype"], c["tp"]) for _, c in cases}
    assert {e for e, _, _ in engines} == {"chunked", "fused", "compiled"}
    assert {tp for _, _, tp in engines} == {2, 4}
    assert {(e, tp) for e, _, tp in engines if e == "compiled"} == {("compiled", 2)}
    for rank, c in cases:
        if c["dtype"] == "torch.float64":
            for name, error in c["errors"].items():
                if name != "grad_spacings":
                    assert error <= 1e-12, (rank, name, c)
        else:
            assert_matches_float64(c)
        assert c["errors"]["padding_grad"] == 0, (rank, c)


def test_the_ranks_of_a_group_hold_the_same_outputs(ranks):
    """Replicated outputs: the replicated loss built from them is bit-for-bit the same on every
    rank of a group (ranks 0-1 and 2-3 at TP 2, all four at TP 4)."""
    for tp, groups in (("tp2", [(0, 1), (2, 3)]), ("tp4", [(0, 1, 2, 3)])):
        for group in groups:
            losses = [[c["loss"] for c in ranks[r][tp]["pass"]] for r in group]
            assert all(row == losses[0] for row in losses), (tp, group, losses)


@pytest.mark.parametrize("recipe", RECIPES)
def test_a_methods_loss_mask_and_gradient_equal_the_full_vocabulary(ranks, recipe):
    """pdm-agg, pdm-uni, dppo-topk-kl, ent-bonus (a differentiable entropy) and an exact top-K
    KL penalty (the support's log-probs and tail, differentiable): sampled and support ids on
    every rank's shard, a padded vocabulary."""
    seen = 0
    for rank, c in _each(ranks, "recipes"):
        if c["recipe"] != recipe:
            continue
        seen += 1
        assert c["mask_equal"], (rank, c)
        assert 0 < c["masked"] < c["tokens"] or recipe == "support-kl", (rank, c)
        for name, error in c["errors"].items():
            assert error <= 1e-12, (rank, name, c)
    assert seen == 2 * RANKS
