"""Clip-Cov: PPO's clip, and a few tokens of high advantage-log-prob covariance drop their gradient.

verl 0.9.1's `clip_cov` loss (`verl/trainer/ppo/core_algos.py`, `compute_policy_loss_clip_cov`,
adapted there from Cui et al., "The Entropy Mechanism of Reinforcement Learning for Reasoning
Language Models", arXiv 2505.22617), per micro-batch, in float32 from the float32 inputs
(`batch.fp32`) as verl computes it, r_t = pi(y_t) / mu(y_t):

    pg1_t = -A_t r_t,   pg2_t = -A_t clip(r_t, 1 - eps_low, 1 + eps_high)
    clipped_t = pg2_t > pg1_t                                  PPO's clip (zero gradient)
    cov_t = (A_t - mean A) (log pi(y_t) - mean log pi)         means over the valid tokens
    candidates: valid, not clipped, lb < cov_t < ub
    drawn: max(1, int(ratio * n_valid)) candidates at random (verl: torch.randperm)
    loss_t = max(pg1_t, pg2_t), 0 on the drawn ones

The mask holds both the clipped and the drawn tokens (True = gradient zeroed); the loss sees it
(`loss_sees_mask`), so a clipped token keeps pg2's constant value, as in verl. verl draws from
torch's global generator; here the draw is a function of the batch, from a generator seeded with
`draw_seed(batch)` (the sampled tokens' ids, the number of valid tokens and the `seed`
parameter): with `torch.manual_seed(draw_seed(batch))` before it, verl's own function draws the
same tokens, and the two losses are equal (tests/recipes/test_field_methods.py). Defaults are
verl's (`ActorConfig.policy_loss`: clip_cov_ratio 2e-4, lb 1, ub 5; clip 0.2 / 0.28).

Launch: put `clip-cov` on any sweep's `method` axis (it has no delta: one trial per cell).
"""

from pdmask.registry import Param, Recipe
from pdmask.registry.common_params import EPS_HIGH, EPS_LOW


def draw_seed(batch) -> int:
    """The seed of this micro-batch's draw: a function of the batch (and of `seed`)."""
    valid = batch.response_mask
    tokens = int(batch.token_id[valid].sum())
    return (batch.params["seed"] * 1_000_003 + tokens * 31 + int(valid.sum())) % 2**31


def _masked_mean(values, valid):  # verl_F.masked_mean, term for term
    return (values.masked_fill(~valid, 0.0) * valid).sum() / (valid.sum() + 1e-8)


def _surrogates(batch):
    p, fp32 = batch.params, batch.fp32
    ratio = (fp32.log_prob - fp32.mu_log_prob).exp()
    pg1 = -fp32.advantages * ratio
    pg2 = -fp32.advantages * ratio.clamp(1 - p["eps_low"], 1 + p["eps_high"])
    return pg1, pg2, (pg2 > pg1) & batch.response_mask


def clipped_or_drawn(batch):
    p, fp32, valid = batch.params, batch.fp32, batch.response_mask
    _, _, clipped = _surrogates(batch)
    log_prob = fp32.log_prob.detach()
    cov = (fp32.advantages - _masked_mean(fp32.advantages, valid)) * (
        log_prob - _masked_mean(log_prob, valid)
    )
    candidates = valid & ~clipped & (cov > p["clip_cov_lb"]) & (cov < p["clip_cov_ub"])
    at = candidates.nonzero()
    count = max(int(p["clip_cov_ratio"] * int(valid.sum())), 1)
    import torch  # here, not at the top: listing recipes never imports torch

    order = torch.randperm(len(at), generator=torch.Generator().manual_seed(draw_seed(batch)))
    drawn = valid.new_zeros(valid.shape)
    chosen = at[order[:count]]
    drawn[chosen[:, 0], chosen[:, 1]] = True
    return clipped | drawn


def clip_cov_loss(batch):
    pg1, pg2, clipped = _surrogates(batch)
    drawn = batch.mask & ~clipped
    return pg1.maximum(pg2).masked_fill(drawn, 0.0).to(batch.dtype)


RECIPE = Recipe(
    name="clip-cov",
    display_name="Clip-Cov",
    color="#AA4499",
    summary=__doc__.splitlines()[0],
    mask=clipped_or_drawn,
    loss=clip_cov_loss,
    loss_sees_mask=True,
    params={
        "eps_low": EPS_LOW,
        "eps_high": EPS_HIGH,
        "clip_cov_ratio": Param(
            default=2e-4, ge=1e-9, le=1.0, description="Share of valid tokens drawn (at least 1)."
        ),
        "clip_cov_lb": Param(default=1.0, description="Candidates have a covariance above this."),
        "clip_cov_ub": Param(default=5.0, description="... and below this."),
        "seed": Param(default=0, ge=0, description="Offsets every micro-batch's draw seed."),
    },
    needs=(),
)
