"""Predictive divergence mask, aggregated-tail estimator (the paper's method).

Proximity: D = KL_topK(mu || pi) > delta, exactly as dppo-topk-kl. Direction: A * Ddot_agg > 0, the
sign of the divergence's own derivative along the update, with the unseen tail as one bucket:
Ddot_agg = (pi_k - mu_k) + sum_S pi_i (mu_i - pi_i) + pi_tail (mu_tail - pi_tail).

Launch: `pdm sweep smoke`, or put `pdm-agg` on any sweep's `method` axis.
"""

from pdmask.registry import Recipe
from pdmask.registry.common_params import DELTA, RATIO_CAP, TOPK

RECIPE = Recipe(
    name="pdm-agg",
    display_name="PDM (agg. tail)",
    color="#D55E00",
    summary=__doc__.splitlines()[0],
    proximity="kl_topk",
    direction="ddot_agg",
    params={"delta": DELTA, "topk": TOPK, "ratio_cap": RATIO_CAP},
    needs=("behaviour_topk",),
)
