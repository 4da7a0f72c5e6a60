"""TIS: token-level truncated importance sampling of the behaviour mismatch.

The rollout engine's policy mu differs from the trained pi (precision mismatch, stale
minibatches); r_t = pi(y_t) / mu(y_t) corrects for it, truncated at C for variance (Yao et al.,
"Your Efficient RL Framework Secretly Brings You Off-Policy RL Training", 2025,
https://fengyao.notion.site/off-policy-rl; verl 0.9.1's rollout correction with
`rollout_is: token`, `rollout_is_threshold: C` in bypass mode with `loss_type: reinforce`):

    w_t    = min(r_t, C)                                      (detached)
    loss_t = -sg(w_t) * A_t * log pi(y_t)
    grad   = -min(r_t, C) * A_t * grad log pi(y_t)

No token is masked. log r_t is clamped to [-20, 20] before exponentiating, as verl's safety bound.

Launch: put `tis` on any sweep's `method` axis (it has no delta: one trial per cell).
"""

from pdmask.registry import Param, Recipe


def tis_loss(batch):
    weight = batch.log_ratio.detach().clamp(-20.0, 20.0).exp().clamp(max=batch.params["is_cap"])
    return -weight * batch.advantages * batch.log_prob


RECIPE = Recipe(
    name="tis",
    display_name="TIS (token)",
    color="#56B4E9",
    summary=__doc__.splitlines()[0],
    loss=tis_loss,
    params={
        "is_cap": Param(
            default=2.0,
            ge=1.0,
            description="Truncation C of the IS weight min(r, C) (verl's default threshold: 2).",
        )
    },
    needs=(),
)
