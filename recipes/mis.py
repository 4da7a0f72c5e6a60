"""MIS: token-level masked importance sampling of the behaviour mismatch.

Instead of truncating the IS weight r_t = pi(y_t) / mu(y_t) at C (TIS), a token whose weight
exceeds C is dropped: its gradient is zeroed, every other token keeps its full weight (Liu et al.,
"When Speed Kills Stability: Demystifying RL Collapse from the Training-Inference Mismatch", 2025,
https://richardli.xyz/rl-collapse, token-level MIS; with a lower bound it is IcePop's band, and
verl 0.9.1's `rollout_is_threshold: "lower_upper"` zeroes the same weights):

    mask_t = r_t > C  or  r_t < C_low                       (C_low: none by default)
    loss_t = -r_t * A_t   on the kept tokens (the default loss; gradient -r_t A_t grad log pi)

A mask and nothing else: the default loss of every method carries the IS weight already.

Launch: put `mis` on any sweep's `method` axis (it has no delta: one trial per cell).
"""

from pdmask.registry import Param, Recipe


def mis_mask(batch):
    ratio = batch.stats.ratio
    floor = batch.params["is_floor"]
    outside = ratio > batch.params["is_cap"]
    return outside if floor is None else outside | (ratio < floor)


RECIPE = Recipe(
    name="mis",
    display_name="MIS (token)",
    color="#882255",
    summary=__doc__.splitlines()[0],
    mask=mis_mask,
    params={
        "is_cap": Param(default=2.0, ge=1.0, description="Tokens with r > C are dropped."),
        "is_floor": Param(
            default=None,
            ge=0.0,
            le=1.0,
            description="Optional lower bound: tokens with r < C_low are dropped too (IcePop).",
        ),
    },
    needs=(),
)
