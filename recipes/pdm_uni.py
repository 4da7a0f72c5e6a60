"""Predictive divergence mask, uniform-tail estimator (the paper's variant).

Proximity: D = KL_topK(mu || pi) > delta. Direction: A * Ddot_uni > 0, where the tail's mass is spread
evenly over the n - m unseen tokens: the tail term of Ddot_agg divided by (n - m).

Launch: `pdm sweep smoke`, or put `pdm-uni` on any sweep's `method` axis.
"""

from pdmask.registry import Recipe
from pdmask.registry.common_params import DELTA, RATIO_CAP, TOPK

RECIPE = Recipe(
    name="pdm-uni",
    display_name="PDM (uniform tail)",
    color="#009E73",
    summary=__doc__.splitlines()[0],
    proximity="kl_topk",
    direction="ddot_uni",
    params={"delta": DELTA, "topk": TOPK, "ratio_cap": RATIO_CAP},
    needs=("behaviour_topk",),
)
