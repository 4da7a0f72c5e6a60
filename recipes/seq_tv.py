"""Sequence-level top-K TV trust region: a response leaves the region as a whole.

For response i with valid tokens t = 1..|y_i|, the top-K total variation of each token
(TV_t = 1/2 (sum over S of |mu_j - pi_j| + |mu_tail - pi_tail|), S = TopK(mu)) and the
sequence's geometric-mean ratio s_i (as GSPO's):

    TV_i    = (1/|y_i|) sum_t TV_t                               the response's mean divergence
    s_i     = exp( (1/|y_i|) sum_t log r_{i,t} )
    mask_it = TV_i > delta  and  A_i (s_i - 1) > 0                every token of a response that is
                                                                  out and moving further out
    loss_t  = -r_t A_t                                            on the others (the default)

Token-level regions mask single tokens and leave the rest of a drifted response training; a
sequence-level one (as GSPO's clip, or Seq-MIS's rejection) treats the response as the unit the
reward was given to. The direction is the sequence ratio's (GSPO's test) because a per-token
derivative does not sum to the mean TV's.

Launch: put `seq-tv` on any sweep's `method` axis (it rides the `delta` axis).
"""

from pdmask.registry import Recipe
from pdmask.registry.common_params import DELTA, TOPK


def sequence_region_mask(batch):
    tv = batch.per_token(batch.sequence_mean(batch.stats.tv_topk))
    log_s = batch.sequence_mean(batch.log_ratio.detach()).clamp(max=10.0)
    moving_out = batch.advantages * (batch.per_token(log_s.exp()) - 1.0) > 0
    return (tv > batch.params["delta"]) & moving_out


RECIPE = Recipe(
    name="seq-tv",
    display_name="Seq. TV region",
    color="#117733",
    summary=__doc__.splitlines()[0],
    mask=sequence_region_mask,
    params={"delta": DELTA, "topk": TOPK},
    needs=("behaviour_topk",),
)
