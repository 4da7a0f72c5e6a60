"""Seq-MIS: sequence-level masked importance sampling of the behaviour mismatch.

The unbiased correction for a whole response is the product of its token ratios; a response whose
product exceeds C is dropped whole, the others weighted by it (Liu et al., "When Speed Kills
Stability: Demystifying RL Collapse from the Training-Inference Mismatch", 2025,
https://richardli.xyz/rl-collapse, sequence-level MIS; verl 0.9.1's rollout correction with
`rollout_is: sequence` and rejection of sequences by `rollout_rs: seq_sum_k1`). For response i
with valid tokens t and r_{i,t} = pi(y_t) / mu(y_t):

    rho_i      = exp( sum_t log r_{i,t} )          (log clamped to [-20, 20], verl's safety bound)
    mask_{i,t} = rho_i > C                          every token of a rejected response
    loss_t     = -sg(rho_i) * A_t * log pi(y_t)     on the kept ones (REINFORCE with IS weight)

Launch: put `seq-mis` on any sweep's `method` axis (it has no delta: one trial per cell).
"""

from pdmask.registry import Param, Recipe


def sequence_weight(batch):
    """rho_i on every token of response i, detached: [B, T]."""
    log_rho = batch.sequence_sum(batch.log_ratio.detach()).clamp(-20.0, 20.0)
    return batch.per_token(log_rho.exp())


def seq_mis_mask(batch):
    return sequence_weight(batch) > batch.params["is_cap"]


def seq_mis_loss(batch):
    return -sequence_weight(batch) * batch.advantages * batch.log_prob


RECIPE = Recipe(
    name="seq-mis",
    display_name="Seq-MIS",
    color="#44AA99",
    summary=__doc__.splitlines()[0],
    mask=seq_mis_mask,
    loss=seq_mis_loss,
    params={
        "is_cap": Param(default=2.0, ge=1.0, description="Responses with rho > C are dropped."),
    },
    needs=(),
)
