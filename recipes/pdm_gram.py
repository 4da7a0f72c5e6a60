"""Predictive divergence mask that sees the network's output layer: Ddot plus the Gram kernel term.

pdm-agg's direction test assumes the token's update moves its logits along v = e_k - pi. A real
update moves parameters: to first order D_t changes by eta A r <grad D_t, P grad log pi_k>, which
splits into the lm head's part |h|^2 Ddot and the part of every layer below it,
(pi - mu)^T W K_h W^T v (h: the lm head's input, W its weight, rows the output embeddings w_i).
With K_h = c I the second part is c times the output-embedding Gram term, and the test is

    gram_t  = <W^T u_agg, w_k - W^T pi>     u_agg = pi - mu over S, the tail as one bucket whose
                                            embedding is the tail's pi-weighted mean embedding
    mask_t  = D_t > delta  and  A_t (|h_t|^2 Ddot_agg_t + c gram_t) > 0

(pdmask.trust_region.kernel has the derivation; `pdm analyze tokens` measures the test next to
the exact own-gradient prediction and fits c per minibatch on 32 tokens). It couples tokens with
similar output embeddings (synonyms), Remark 3's token interactions in the paper. A new method: no
source beyond the paper's Ddot and its Remark 3.

Needs `output_kernel` (the lm head's input and weight): the embedded backend supplies it; the
VeRL backend refuses the recipe at plan time (verl's engine hands the policy-loss hook logits,
not hidden states).

Launch: put `pdm-gram` on a sim sweep's `method` axis.
"""

from pdmask.registry import Param, Recipe
from pdmask.registry.common_params import DELTA, RATIO_CAP, TOPK


def gram_mask(batch):
    from pdmask.trust_region import proximity_test  # here: listing recipes never imports torch

    stats = batch.stats
    outside = proximity_test("kl_topk", stats, batch.advantages, delta=batch.params["delta"])
    change = stats.kernel.combined(stats.ddot_agg, batch.params["c"])
    return outside & (batch.advantages * change > 0)


RECIPE = Recipe(
    name="pdm-gram",
    display_name="PDM (Gram kernel)",
    color="#AA4499",
    summary=__doc__.splitlines()[0],
    mask=gram_mask,
    params={
        "delta": DELTA,
        "topk": TOPK,
        "ratio_cap": RATIO_CAP,
        "c": Param(
            default=1.0e4,
            ge=0.0,
            le=1.0e9,
            description="Scale of the hidden layers' kernel K_h = c I against the lm head's "
            "|h|^2 (the token analysis fits it: ~1e4 on the embedded models).",
        ),
    },
    needs=("behaviour_topk", "output_kernel"),
)
