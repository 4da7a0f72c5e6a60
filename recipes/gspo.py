"""GSPO: the sequence-level geometric-mean ratio, clipped per sequence.

For response i with valid tokens t = 1..|y_i| and r_{i,t} = pi(y_t) / mu(y_t):

    s_i     = exp( (1/|y_i|) sum_t log r_{i,t} )               the sequence's geometric-mean ratio
    s_{i,t} = sg(s_i) * pi(y_t) / sg(pi(y_t))                  value s_i, gradient s_i grad log pi
    J_{i,t} = min(s_{i,t} A_t, clip(s_{i,t}, 1 - eps_low, 1 + eps_high) A_t)

(Zheng et al., "Group Sequence Policy Optimization", arXiv 2507.18071, the GSPO-token objective.)
The clip's zero-gradient region is a mask over whole sequences:

    mask_{i,t} = (s_i < 1 - eps_low  or  s_i > 1 + eps_high)  and  A_t (s_i - 1) > 0
    loss_t     = -A_t s_{i,t}        on the other tokens (gradient -A_t s_i grad log pi(y_t))

so the gradient is J's exactly; a masked token contributes 0 instead of J's constant. log s_i is
clamped at 10 before exponentiating (as verl 0.9.1's `gspo` loss does). The paper aggregates with
a per-sequence token mean (verl's `seq-mean-token-mean`); pdmask aggregates as the trial does
(verl's default `token-mean`), as verl's own `gspo` loss does too. Defaults are the paper's clip
range (3e-4, 4e-4).

Launch: put `gspo` on any sweep's `method` axis (it has no delta: one trial per cell).
"""

from pdmask.registry import Param, Recipe


def sequence_ratio(batch):
    """s_i on every token of response i, detached: [B, T]."""
    log_s = batch.sequence_mean(batch.log_ratio.detach()).clamp(max=10.0)
    return batch.per_token(log_s.exp())


def gspo_mask(batch):
    s = sequence_ratio(batch)
    outside = (s < 1.0 - batch.params["eps_low"]) | (s > 1.0 + batch.params["eps_high"])
    return outside & (batch.advantages * (s - 1.0) > 0)


def gspo_loss(batch):
    token_ratio = sequence_ratio(batch) * (batch.log_prob - batch.log_prob.detach()).exp()
    return -batch.advantages * token_ratio


RECIPE = Recipe(
    name="gspo",
    display_name="GSPO",
    color="#CC79A7",
    summary=__doc__.splitlines()[0],
    mask=gspo_mask,
    loss=gspo_loss,
    params={
        "eps_low": Param(
            default=3e-4, ge=0.0, le=1.0, description="Lower clip: outside when s_i < 1 - eps_low."
        ),
        "eps_high": Param(
            default=4e-4,
            ge=0.0,
            le=10.0,
            description="Upper clip: outside when s_i > 1 + eps_high.",
        ),
    },
    needs=(),
)
