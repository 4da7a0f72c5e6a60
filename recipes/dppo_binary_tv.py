"""DPPO with the binary TV |pi_k - mu_k| as the trust region.

Proximity: |pi_k - mu_k| > delta. Direction: the ratio test A (r - 1) > 0.

Launch: `pdm sweep smoke`, or put `dppo-binary-tv` on any sweep's `method` axis.
"""

from pdmask.registry import Recipe
from pdmask.registry.common_params import DELTA, RATIO_CAP

RECIPE = Recipe(
    name="dppo-binary-tv",
    display_name="DPPO binary TV",
    color="#9edae5",
    summary=__doc__.splitlines()[0],
    proximity="tv_binary",
    direction="ratio",
    params={"delta": DELTA, "ratio_cap": RATIO_CAP},
    needs=(),
)
