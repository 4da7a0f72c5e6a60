"""Predictive mask with the exact derivative of the bucketed top-K KL (beyond the paper).

Proximity: D = KL_topK(mu || pi) > delta. Direction: A * Ddot_bucket > 0 with
rho_tail = sum_{j not in S} pi_j^2 / pi_tail in place of pi_tail: the exact derivative of the
thresholded divergence, equal to the full-vocabulary Ddot when mu is proportional to pi on the tail.

Launch: `pdm sweep smoke`, or put `pdm-bucket` on any sweep's `method` axis.
"""

from pdmask.registry import Recipe
from pdmask.registry.common_params import DELTA, RATIO_CAP, TOPK

RECIPE = Recipe(
    name="pdm-bucket",
    display_name="PDM (bucket)",
    color="#8c564b",
    summary=__doc__.splitlines()[0],
    proximity="kl_topk",
    direction="ddot_bucket",
    params={"delta": DELTA, "topk": TOPK, "ratio_cap": RATIO_CAP},
    needs=("behaviour_topk",),
)
