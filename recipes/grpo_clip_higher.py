"""GRPO with PPO's clipped ratio and clip-higher (eps_low=0.2, eps_high=0.28).

Proximity: r < 1 - eps_low or r > 1 + eps_high. Direction: A (r - 1) > 0: the clipped surrogate's
zero-gradient region. On VeRL this is configuration only (verl's `vanilla` loss).

Launch: `pdm sweep smoke`, or put `grpo-clip-higher` on any sweep's `method` axis.
"""

from pdmask.registry import Recipe
from pdmask.registry.common_params import EPS_HIGH, EPS_LOW, RATIO_CAP

RECIPE = Recipe(
    name="grpo-clip-higher",
    display_name="GRPO clip-higher",
    color="#6E6E6E",
    summary=__doc__.splitlines()[0],
    proximity="ratio",
    direction="ratio",
    params={"eps_low": EPS_LOW, "eps_high": EPS_HIGH, "ratio_cap": RATIO_CAP},
    needs=(),
    verl_loss_mode="vanilla",
)
