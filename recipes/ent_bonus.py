"""Predictive divergence mask (pdm-agg) plus an exact entropy bonus on the tokens it removes.

For token t, with pdm-agg's mask (D_t = KL_topK(mu || pi) > delta and A_t Ddot_agg_t > 0):

    H_t     = -sum_j pi_j log pi_j        the policy's entropy over the whole vocabulary
    loss_t  = -beta * H_t                 if mask_t   (the policy-gradient term is dropped there)
              -r_t A_t                    otherwise   (pdm-agg's loss; truncated at C if set)

so on a masked token the gradient is -beta dH/dz = beta pi_j (log pi_j + H) per logit z_j: the
bonus keeps the distribution from collapsing exactly where the trust region stops the update,
instead of leaving those tokens without any gradient. H_t is exact and differentiable (the
recipe needs `entropy`: the logits pass computes it with its gradient, without an [N, V] float32
copy). An entropy bonus on every token is verl's `entropy_coeff` (Williams and Peng,
"Function optimization using connectionist reinforcement learning algorithms", 1991; Mnih et
al., "Asynchronous methods for deep reinforcement learning", 2016); here it acts only where the
mask acts. The mean entropy of the masked tokens is logged as `actor/pdm/recipe/masked_entropy`.

Launch: put `ent-bonus` on any sweep's `method` axis (both backends supply `entropy`; on VeRL it
comes out of pdmask's logits hook with its gradient).
"""

from pdmask.registry import Param, Recipe
from pdmask.registry.common_params import DELTA, RATIO_CAP, TOPK


def pdm_agg_mask(batch):
    from pdmask.trust_region import composed_mask  # here: listing recipes never imports torch

    return composed_mask(
        "kl_topk", "ddot_agg", batch.stats, batch.advantages, delta=batch.params["delta"]
    )


def entropy_bonus_loss(batch):
    from pdmask.trust_region import ratio_loss

    masked = batch.mask
    if bool(masked.any()):
        batch.report("masked_entropy", batch.entropy.detach()[masked].mean())
    else:
        batch.report("masked_entropy", 0.0)
    bonus = -batch.params["beta"] * batch.entropy
    return ratio_loss(batch, batch.params["ratio_cap"]).where(~masked, bonus)


RECIPE = Recipe(
    name="ent-bonus",
    display_name="PDM + entropy bonus",
    color="#44AA99",
    summary=__doc__.splitlines()[0],
    mask=pdm_agg_mask,
    loss=entropy_bonus_loss,
    loss_sees_mask=True,
    params={
        "delta": DELTA,
        "topk": TOPK,
        "ratio_cap": RATIO_CAP,
        "beta": Param(
            default=0.01,
            ge=0.0,
            le=10.0,
            description="Weight of the entropy bonus on masked tokens.",
        ),
    },
    needs=("behaviour_topk", "entropy"),
)
