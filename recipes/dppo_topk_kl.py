"""DPPO with the top-K KL trust region and the ratio direction test (the direct baseline).

Proximity: D = KL_topK(mu || pi) over TopK(mu) ∪ {k} plus one tail bucket > delta.
Direction: the ratio test A (r - 1) > 0, i.e. only the local term of Ddot.

Launch: `pdm sweep smoke`, or put `dppo-topk-kl` on any sweep's `method` axis.
"""

from pdmask.registry import Recipe
from pdmask.registry.common_params import DELTA, RATIO_CAP, TOPK

RECIPE = Recipe(
    name="dppo-topk-kl",
    display_name="DPPO top-K KL",
    color="#0072B2",
    summary=__doc__.splitlines()[0],
    proximity="kl_topk",
    direction="ratio",
    params={"delta": DELTA, "topk": TOPK, "ratio_cap": RATIO_CAP},
    needs=("behaviour_topk",),
)
