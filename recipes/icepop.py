"""IcePop: GRPO clip-higher plus a ratio band outside which a token is dropped in both directions.

slime's `icepop_function` (THUDM/slime, `slime/backends/megatron_utils/loss.py`, commit 624b824,
2026-08-21; the same band in miles, and prime-rl's masked importance ratio) weighs the PPO loss
by the training/inference ratio inside a band and by 0 outside it. pdmask's r_t = pi(y_t) /
mu(y_t) holds the mismatch and the policy lag together (mu is the behaviour that sampled y_t), so
both tests read it:

    band_t = r_t < band_low  or  r_t > band_high                  dropped, whatever A_t
    clip_t = (r_t < 1 - eps_low  or  r_t > 1 + eps_high)  and  A_t (r_t - 1) > 0     PPO's clip
    mask_t = band_t or clip_t,        loss_t = -r_t A_t on the other tokens (the default loss)

The clip is `grpo-clip-higher`'s; the band is what IcePop adds: a token far from mu stops
updating even where PPO's clip would let it return (r_t > 1 + eps_high with A_t < 0). Defaults:
slime's own IcePop run (`tests/test_glm52_6layer_deterministic_e2e.py`: `--tis-clip-low 0.5
--tis-clip 2.0`, `--eps-clip 0.2 --eps-clip-high 0.28`).

Launch: put `icepop` on any sweep's `method` axis (it has no delta: one trial per cell).
"""

from pdmask.registry import Param, Recipe
from pdmask.registry.common_params import EPS_HIGH, EPS_LOW


def band_or_clip(batch):
    from pdmask.trust_region import composed_mask  # here: listing recipes never imports torch

    p = batch.params
    ratio = batch.stats.ratio
    band = (ratio < p["band_low"]) | (ratio > p["band_high"])
    clip = composed_mask(
        "ratio",
        "ratio",
        batch.stats,
        batch.advantages,
        eps_low=p["eps_low"],
        eps_high=p["eps_high"],
    )
    return band | clip


RECIPE = Recipe(
    name="icepop",
    display_name="IcePop",
    color="#117733",
    summary=__doc__.splitlines()[0],
    mask=band_or_clip,
    params={
        "eps_low": EPS_LOW,
        "eps_high": EPS_HIGH,
        "band_low": Param(
            default=0.5,
            ge=0.0,
            le=1.0,
            description="Dropped when r < band_low (slime's tis_clip_low).",
        ),
        "band_high": Param(
            default=2.0,
            ge=1.0,
            le=100.0,
            description="Dropped when r > band_high (slime's tis_clip).",
        ),
    },
    needs=(),
)
