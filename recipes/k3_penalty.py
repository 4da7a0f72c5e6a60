"""GRPO clip-higher plus a k3 KL penalty to the behaviour policy, on every token.

For token t with r_t = pi(y_t) / mu(y_t) and A_t its advantage:

    mask_t  = (r_t < 1 - eps_low  or  r_t > 1 + eps_high)  and  A_t (r_t - 1) > 0    PPO's clip
    k3_t    = exp(log mu(y_t) - log pi(y_t)) - (log mu(y_t) - log pi(y_t)) - 1      >= 0
    loss_t  = beta * k3_t  +  (0 if mask_t else -r_t A_t)

k3 is Schulman's low-variance estimator of KL(pi || mu) ("Approximating KL divergence", 2020,
http://joschu.net/blog/kl-approx.html), the one verl 0.9.1 calls `low_var_kl` (its log-ratio
clamped to [-20, 20] and k3 to [-10, 10], as here). The penalty is a loss term of its own: it acts
on the clipped tokens too (the recipe declares `loss_sees_mask`), so it pulls a token back to mu
exactly where the clip stops the policy-gradient term. The masked share is the clip's share (what
verl reports as `pg_clipfrac`); the penalty's mean is logged as `actor/pdm/recipe/k3_mean`.

Launch: put `k3-penalty` on any sweep's `method` axis (no delta: one trial per cell).
"""

from pdmask.registry import Param, Recipe
from pdmask.registry.common_params import EPS_HIGH, EPS_LOW


def clipped(batch):
    from pdmask.trust_region import composed_mask  # here: listing recipes never imports torch

    return composed_mask(
        "ratio",
        "ratio",
        batch.stats,
        batch.advantages,
        eps_low=batch.params["eps_low"],
        eps_high=batch.params["eps_high"],
    )


def k3(batch):
    """[B, T] k3_t, differentiable through log pi."""
    log_mu_over_pi = (batch.mu_log_prob - batch.log_prob).clamp(-20.0, 20.0)
    return (log_mu_over_pi.exp() - log_mu_over_pi - 1.0).clamp(-10.0, 10.0)


def k3_penalty_loss(batch):
    penalty = k3(batch)
    batch.report("k3_mean", penalty.detach()[batch.response_mask].mean())
    pg = (-batch.ratio * batch.advantages).masked_fill(batch.mask, 0.0)
    return batch.params["beta"] * penalty + pg


RECIPE = Recipe(
    name="k3-penalty",
    display_name="GRPO + k3 KL",
    color="#999933",
    summary=__doc__.splitlines()[0],
    mask=clipped,
    loss=k3_penalty_loss,
    loss_sees_mask=True,
    params={
        "eps_low": EPS_LOW,
        "eps_high": EPS_HIGH,
        "beta": Param(default=0.1, ge=0.0, le=100.0, description="Weight of the k3 penalty."),
    },
    needs=(),
)
