"""IPO (prime-rl): a symmetric probability-difference region, no direction test, and a log-ratio drift term.

prime-rl's `ipo` loss type (PrimeIntellect-ai/prime-rl, `src/prime_rl/trainer/rl/loss.py`,
`ipo_loss_fn`, and `IPOLossConfig` in `packages/prime-rl-configs/src/prime_rl/configs/trainer.py`,
commit 559b447, 2026-08-21), per token with r_t = pi(y_t) / mu(y_t):

    mask_t = |pi(y_t) - mu(y_t)| > eps                         (whatever the advantage's sign)
    loss_t = -(0 if mask_t else A_t r_t) + kl_tau (log r_t)^2   (the drift term on every token)

A direct test of the paper's thesis: it masks every out-of-region token, like `dppo-binary-tv`'s
proximity test without any direction test. The drift term acts on the masked tokens too
(`loss_sees_mask`); the masked share is the mask's. prime-rl's defaults: eps = 0.1 (its
`ipo_threshold`; the `delta` role, so a sweep's delta axis sets it), kl_tau = 1e-3, its
`adv_tau` 1 (not a parameter here). prime-rl sums the per-token loss of a sample; pdmask
aggregates with the trial's mode (verl's `token-mean` by default).

Launch: put `ipo` on any sweep's `method` axis.
"""

from pdmask.registry import Param, Recipe


def moved_too_far(batch):
    fp32 = batch.fp32
    moved = (fp32.log_prob.detach().exp() - fp32.mu_log_prob.exp()).abs()
    return moved > batch.params["eps"]


def ipo_loss(batch):
    fp32 = batch.fp32
    log_ratio = fp32.log_prob - fp32.mu_log_prob
    policy_gradient = (fp32.advantages * log_ratio.exp()).masked_fill(batch.mask, 0.0)
    drift = log_ratio * log_ratio
    batch.report("drift_mean", drift.detach()[batch.response_mask].mean())
    return (-policy_gradient + batch.params["kl_tau"] * drift).to(batch.dtype)


RECIPE = Recipe(
    name="ipo",
    display_name="IPO (prime-rl)",
    color="#44AA99",
    summary=__doc__.splitlines()[0],
    mask=moved_too_far,
    loss=ipo_loss,
    loss_sees_mask=True,
    params={
        "eps": Param(
            default=0.1,
            ge=1e-6,
            le=1.0,
            role="delta",
            description="Masked when |pi(y) - mu(y)| exceeds eps (prime-rl's ipo_threshold).",
        ),
        "kl_tau": Param(
            default=1e-3, ge=0.0, le=10.0, description="Weight of the (log r)^2 drift term."
        ),
    },
    needs=(),
)
