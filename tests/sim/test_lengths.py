"""Responses of real length on the laptop path (issue 46): the embedded task's responses vary in
length with a long tail, a run's metrics show the distribution, and a length-dependent method is
no longer a token-level one with another constant.

The per-response threshold ``delta * sqrt(L_ref / L)`` (a probe of the issue, a recipe file
here) reduced to pdm-agg at the threshold ``delta * sqrt(L_ref / 4)`` while every response was 4
tokens long. On a rollout of the task, no single threshold reproduces its mask: the smallest
number of tokens any one threshold decides differently is counted exactly (every threshold
between two consecutive ``D_t`` values decides the same).
"""

from __future__ import annotations

import textwrap

import pytest
import torch

from pdmask.backends.sim.analysis import build_analysis_setup
from pdmask.backends.sim.state import TrialState, step_generator
from pdmask.backends.sim.trainer import response_length_metrics
from pdmask.registry.recipe_files import load_recipe_file
from pdmask.trust_region import apply_method, direction_test

PER_RESPONSE = '''
"""A per-response top-K KL threshold: delta * sqrt(L_ref / L), L the response's length."""

from pdmask.registry import Param, Recipe


def length_mask(batch):
    from pdmask.trust_region import direction_test

    lengths = batch.sequence_lengths.to(batch.stats.kl_topk.dtype).clamp_min(1)
    threshold = batch.params["delta"] * (batch.params["l_ref"] / lengths).sqrt()
    outside = batch.stats.kl_topk > batch.per_token(threshold)
    return outside & direction_test("ddot_agg", batch.stats, batch.advantages)


RECIPE = Recipe(
    name="len-threshold",
    display_name="PDM (per-response delta)",
    color="#123456",
    summary=__doc__.splitlines()[0],
    mask=length_mask,
    params={
        "delta": Param(default=0.15, ge=1e-6, role="delta", description="At L_ref."),
        "l_ref": Param(default=4.0, ge=1.0, description="Where the threshold is delta."),
    },
    needs=("behaviour_topk",),
)
'''


def test_a_rollouts_responses_vary_in_length_and_its_metrics_say_how(smoke_config):
    cfg = smoke_config(profile="default", seed=5)
    state = TrialState(cfg)
    batch = state.rollout(step_generator(cfg.seed, 1, "rollout"))
    lengths = batch.valid.sum(1)
    task = cfg.task_spec
    # whole attempts: 4, 8, 12, 16 tokens, most of them 4, a tail to the cap
    assert {4, 8, 12} <= set(lengths.tolist()) <= set(range(1, task.response_len + 1))
    assert (lengths == 4).float().mean() > 0.5 and lengths.max() >= 12
    metrics = response_length_metrics(batch)
    assert metrics["response_length/mean"] == pytest.approx(float(lengths.double().mean()))
    assert metrics["response_length/p50"] < metrics["response_length/p90"]
    assert metrics["response_length/min"] <= 4 < metrics["response_length/max"]
    truncated = (~(batch.generation.responses == 2).any(1)).double().mean()
    assert metrics["response_length/clip_ratio"] == pytest.approx(float(truncated))


@pytest.fixture(scope="module")
def drifted(model_cache):
    """A rollout of the 4B stand-in and its trainer after stale updates (pi away from mu)."""
    from pdmask.backends.sim import SimTrialConfig
    from pdmask.backends.sim.runtime import single_threaded

    cfg = SimTrialConfig(
        stand_in="tiny-4b",
        precision="fp8-rollout",
        profile="stress",
        seed=3,
        delta=0.15,
        cache_dir=str(model_cache / "sim"),
    )
    with single_threaded():
        setup = build_analysis_setup(cfg, stale_updates=6)
        with torch.no_grad():
            stats = setup.stats(setup.logits())
    return setup, stats


def test_a_per_response_threshold_is_not_pdm_agg_at_any_other_delta(drifted, tmp_path):
    setup, stats = drifted
    path = tmp_path / "len_threshold.py"
    path.write_text(textwrap.dedent(PER_RESPONSE).lstrip())
    recipe, problems = load_recipe_file(path)
    assert not problems
    valid, advantages = setup.valid, setup.advantages
    lengths = valid.sum(1)
    assert len(set(lengths.tolist())) >= 3  # responses of several lengths
    delta, l_ref = 0.15, 4.0
    method = recipe.method({"delta": delta, "l_ref": l_ref})
    mask = apply_method(method, stats, advantages, valid, backend="sim").mask
    pushing = direction_test("ddot_agg", stats, advantages) & valid
    kl = stats.kl_topk
    fewest = min(  # every distinct single threshold, 0 included
        int((((kl > d) & pushing) != mask).sum())
        for d in torch.unique(torch.cat([kl[pushing], kl.new_zeros(1)])).tolist()
    )
    masked = int(mask.sum())
    assert masked > 50
    assert fewest >= 0.1 * masked, (fewest, masked)  # measured: 36 of 207
    # within one length it is pdm-agg at delta sqrt(L_ref / L) exactly: the lengths decide
    thresholds = delta * (l_ref / lengths.to(kl.dtype)).sqrt()  # the recipe's own float32 values
    for length in lengths.unique().tolist():
        rows = lengths == length
        same = (kl > thresholds[rows][0]) & pushing
        assert torch.equal(same[rows], mask[rows]), length
