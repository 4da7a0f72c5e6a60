"""Top-K TV trust region with the TV derivative along the step as direction test (Appendix D).

Proximity: TV_topK(mu, pi) > delta. Direction: the one-sided derivative of TV_topK along the actual
step sign(A) v is > 0 (a bucket at a kink counts |dpi_i|).

Launch: `pdm sweep smoke`, or put `pdm-tv` on any sweep's `method` axis.
"""

from pdmask.registry import Recipe
from pdmask.registry.common_params import DELTA, RATIO_CAP, TOPK

RECIPE = Recipe(
    name="pdm-tv",
    display_name="PDM TV",
    color="#9467bd",
    summary=__doc__.splitlines()[0],
    proximity="tv_topk",
    direction="tv_deriv",
    params={"delta": DELTA, "topk": TOPK, "ratio_cap": RATIO_CAP},
    needs=("behaviour_topk",),
)
