"""DPPO with the binary KL of {sampled token, rest} as the trust region.

Proximity: KL_bin(mu || pi) over {k, rest} > delta. Direction: the ratio test A (r - 1) > 0.

Launch: `pdm sweep smoke`, or put `dppo-binary-kl` on any sweep's `method` axis.
"""

from pdmask.registry import Recipe
from pdmask.registry.common_params import DELTA, RATIO_CAP

RECIPE = Recipe(
    name="dppo-binary-kl",
    display_name="DPPO binary KL",
    color="#17becf",
    summary=__doc__.splitlines()[0],
    proximity="kl_binary",
    direction="ratio",
    params={"delta": DELTA, "ratio_cap": RATIO_CAP},
    needs=(),
)
