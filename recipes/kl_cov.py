"""KL-Cov: the tokens of highest advantage-log-prob covariance get a |log r| penalty.

verl 0.9.1's `kl_cov` loss (`verl/trainer/ppo/core_algos.py`, `compute_policy_loss_kl_cov`,
adapted there from Cui et al., "The Entropy Mechanism of Reinforcement Learning for Reasoning
Language Models", arXiv 2505.22617), per micro-batch, in float32 from the float32 inputs
(`batch.fp32`) as verl computes it, r_t = pi(y_t) / mu(y_t):

    cov_t  = (A_t - mean A) (log pi(y_t) - mean log pi)        over the valid tokens (log pi
                                                               in the log-probs' own dtype)
    top    = the max(1, int(ratio * n_valid)) valid tokens of largest cov_t (torch.topk)
    loss_t = -A_t r_t + (coef |log r_t| on the top tokens)

No token is masked and nothing is random: the penalty pulls the most covariant tokens back toward
mu. Defaults are verl's (`ActorConfig.policy_loss`: kl_cov_ratio 2e-4, ppo_kl_coef 0.1).

Launch: put `kl-cov` on any sweep's `method` axis (it has no delta: one trial per cell).
"""

from pdmask.registry import Param, Recipe


def kl_cov_loss(batch):
    p, fp32, valid = batch.params, batch.fp32, batch.response_mask
    log_ratio = fp32.log_prob - fp32.mu_log_prob
    policy_gradient = -fp32.advantages * log_ratio.exp()
    advantages = fp32.advantages[valid].detach()
    log_prob = batch.log_prob[valid].detach()  # verl's own dtype here (bf16 from bf16 log-probs)
    penalised = valid.new_zeros(valid.shape)
    if advantages.numel():
        cov = (advantages - advantages.mean()) * (log_prob - log_prob.mean())
        count = max(1, int(advantages.numel() * p["kl_cov_ratio"]))
        top = cov.topk(count, largest=True).indices
        at = valid.nonzero()[top]
        penalised[at[:, 0], at[:, 1]] = True
    batch.report("penalised_frac", penalised.sum() / valid.sum().clamp_min(1))
    penalty = p["ppo_kl_coef"] * log_ratio.abs()
    return (policy_gradient + penalty).where(penalised, policy_gradient).to(batch.dtype)


RECIPE = Recipe(
    name="kl-cov",
    display_name="KL-Cov",
    color="#DDCC77",
    summary=__doc__.splitlines()[0],
    loss=kl_cov_loss,
    params={
        "kl_cov_ratio": Param(
            default=2e-4,
            ge=1e-9,
            le=1.0,
            description="Share of valid tokens penalised (at least 1).",
        ),
        "ppo_kl_coef": Param(default=0.1, ge=0.0, le=100.0, description="Weight of |log r|."),
    },
    needs=(),
)
