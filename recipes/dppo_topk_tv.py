"""DPPO with the top-K TV trust region and the ratio direction test.

Proximity: TV_topK(mu, pi) > delta. Direction: the ratio test A (r - 1) > 0.

Launch: `pdm sweep smoke`, or put `dppo-topk-tv` on any sweep's `method` axis.
"""

from pdmask.registry import Recipe
from pdmask.registry.common_params import DELTA, RATIO_CAP, TOPK

RECIPE = Recipe(
    name="dppo-topk-tv",
    display_name="DPPO top-K TV",
    color="#2ca02c",
    summary=__doc__.splitlines()[0],
    proximity="tv_topk",
    direction="ratio",
    params={"delta": DELTA, "topk": TOPK, "ratio_cap": RATIO_CAP},
    needs=("behaviour_topk",),
)
