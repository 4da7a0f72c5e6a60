"""Predictive divergence mask with its own trust-region size for negative advantages.

pdm-agg's test with one threshold per advantage sign: for token t with top-K KL D_t and the
aggregated-tail derivative Ddot_t (the paper's Eq. for the direction along the token's own step),

    delta_t = delta                       if A_t > 0
              neg_scale * delta           if A_t < 0
    mask_t  = D_t > delta_t  and  A_t Ddot_t > 0          out of region and moving further out

Negative-advantage updates push mass off a sampled token onto the rest of the vocabulary, which
moves the divergence in ways a positive update does not (the paper's Remark 3 on token
interactions); this recipe lets a sweep give them a tighter or looser region. Both thresholds ride
the sweep's `delta` axis (delta is the role parameter, the negative one a multiple of it), so
`delta: [0.15, 0.05]` rescales both, and `params.neg_scale: [0.5, 1.0]` varies their ratio.
neg_scale = 1 is pdm-agg exactly.

Launch: put `asym-pdm` on any sweep's `method` axis with `params.neg_scale` (a new method: no
paper source beyond pdm-agg itself).
"""

from pdmask.registry import Param, Recipe
from pdmask.registry.common_params import DELTA, TOPK


def asymmetric_mask(batch):
    from pdmask.trust_region import composed_mask  # here: listing recipes never imports torch

    delta = batch.params["delta"]
    positive = composed_mask("kl_topk", "ddot_agg", batch.stats, batch.advantages, delta=delta)
    negative = composed_mask(
        "kl_topk",
        "ddot_agg",
        batch.stats,
        batch.advantages,
        delta=delta * batch.params["neg_scale"],
    )
    return positive.where(batch.advantages > 0, negative)


RECIPE = Recipe(
    name="asym-pdm",
    display_name="PDM (asym. delta)",
    color="#882255",
    summary=__doc__.splitlines()[0],
    mask=asymmetric_mask,
    params={
        "delta": DELTA,
        "topk": TOPK,
        "neg_scale": Param(
            default=0.5,
            ge=1e-3,
            le=100.0,
            description="The negative-advantage threshold as a multiple of delta.",
        ),
    },
    needs=("behaviour_topk",),
)
