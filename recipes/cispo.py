"""CISPO: a clipped, detached importance-sampling weight on log pi; no token is masked.

With r_t = pi(y_t) / mu(y_t) (mu: the behaviour policy that sampled y_t), per token:

    w_t    = clip(r_t, 1 - eps_low, 1 + eps_high)            (detached: sg(w_t))
    loss_t = -sg(w_t) * A_t * log pi(y_t)
    grad   = -w_t * A_t * grad log pi(y_t)

PPO's clip zeroes the gradient of tokens outside the region; CISPO keeps every token's gradient and
bounds only its weight (MiniMax, "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning
Attention", arXiv 2506.13585, the CISPO objective). MiniMax-M1 sets no lower bound: eps_low = 1
here (weights in [0, 1 + eps_high]). As verl 0.9.1's own `cispo` loss, log r_t is clamped to
[-20, 20] before exponentiating; unlike it, mu is the rollout's behaviour policy (pdmask's ratio).

Launch: put `cispo` on any sweep's `method` axis (it has no delta: one trial per cell).
"""

from pdmask.registry import Param, Recipe


def cispo_loss(batch):
    p = batch.params
    ratio = batch.log_ratio.detach().clamp(-20.0, 20.0).exp()
    weight = ratio.clamp(1.0 - p["eps_low"], 1.0 + p["eps_high"])
    return -weight * batch.advantages * batch.log_prob


RECIPE = Recipe(
    name="cispo",
    display_name="CISPO",
    color="#E69F00",
    summary=__doc__.splitlines()[0],
    loss=cispo_loss,
    params={
        "eps_low": Param(
            default=1.0,
            ge=0.0,
            le=1.0,
            description="Lower bound of the weight is 1 - eps_low (1: no lower bound, as MiniMax-M1).",
        ),
        "eps_high": Param(
            default=0.28,
            ge=0.0,
            le=100.0,
            description="Upper bound of the weight is 1 + eps_high.",
        ),
    },
    needs=(),
)
