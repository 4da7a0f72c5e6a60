"""Second-order predictive mask: a token is masked when its step would grow D to second order.

The paper's direction test uses the sign of D's first derivative along the update, the logits
moving along v = e_k - pi (paper.md, "Beyond the paper: second order"). Along that step D is
predicted to change by

    Delta D ~ t Ddot_X + t^2 / 2 var_v_X,        t = eta * A_t,

with eta the step length in logit space per unit of advantage (a parameter: the paper names it
as the missing piece), Ddot_X one of the estimators of D's derivative and var_v_X the second
derivative of the same divergence (`stats.var_v_X`, `needs=("second_order",)`): X = agg (the tail
as one token; var_v_agg = Var(v) of that distribution), uni (the tail as n - m equal tokens) or
bucket (D_t exactly: var_v_bucket = Var_pi(v) less mu_tail times the tail's internal variance
of pi). Masked iff

    D_t > delta   and   t Ddot_X + t^2 / 2 var_v_X > 0.

Small steps give the first-order test (pdm-agg for X = agg): the sign of t Ddot. A token whose
step the first-order test predicts to shrink D is masked once |Ddot| < t var_v / 2 (the KL is
convex along v, so "shrinks" fails past t = 2 |Ddot| / var_v); A = 0 (t = 0) is never masked.
The default eta = 0.1 is the median |t| / |A| of the embedded backend's update along v
(stress setting, 4B stand-in; the token analysis measures the mask as a direction test).
No public code has this mask (issue 46).

Launch: put `pdm-2nd` on any sweep's `method` axis; `params.form: [agg, bucket]` and
`params.eta: [...]` are axes of their own.
"""

from pdmask.registry import Param, Recipe
from pdmask.registry.common_params import DELTA, RATIO_CAP, TOPK


def second_order_mask(batch):
    stats, p = batch.stats, batch.params
    step = p["eta"] * batch.fp32.advantages  # t, from the float32 advantages
    first = getattr(stats, f"ddot_{p['form']}")
    second = getattr(stats, f"var_v_{p['form']}")
    grows = step * first + 0.5 * step * step * second > 0
    return (stats.kl_topk > p["delta"]) & grows


RECIPE = Recipe(
    name="pdm-2nd",
    display_name="PDM (2nd order)",
    color="#7A3B00",
    summary=__doc__.splitlines()[0],
    mask=second_order_mask,
    params={
        "delta": DELTA,
        "topk": TOPK,
        "ratio_cap": RATIO_CAP,
        "eta": Param(
            default=0.1,
            ge=1e-6,
            le=100.0,
            description="Step length in logit space per unit of advantage: t = eta * A.",
        ),
        "form": Param(
            default="agg",
            choices=("agg", "uni", "bucket"),
            description="Which estimator of D's derivative and curvature (ddot_X, var_v_X).",
        ),
    },
    needs=("behaviour_topk", "second_order"),
)
