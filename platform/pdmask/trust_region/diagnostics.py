"""Scalar diagnostics a trainer logs per step (under ``actor/pdm/<name>``).

``disagree_<est>`` is the share of response tokens whose mask differs between the predictive test
``<est>`` and the ratio test under the same proximity test (``pdm-agg`` vs ``dppo-topk-kl``, ...):
exactly the tokens where the paper's methods and their baseline decide differently.
"""

from __future__ import annotations

import torch

from pdmask.trust_region.methods import composed_mask
from pdmask.trust_region.stats import TokenStats

# (name, proximity, predictive direction) compared against (proximity, "ratio").
DISAGREEMENTS = (
    ("agg", "kl_topk", "ddot_agg"),
    ("uni", "kl_topk", "ddot_uni"),
    ("bucket", "kl_topk", "ddot_bucket"),
    ("tv", "tv_topk", "tv_deriv"),
)


def _means(columns: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> dict[str, float]:
    """Each ``name: (values, where)`` averaged over ``where`` in float64 (0 over no token), read
    back to the host in one copy: a read per metric would make the GPU wait for the host once per
    metric, inside the loss."""
    sums = torch.stack(
        [
            torch.where(where, values.to(torch.float64), 0.0).sum()
            for values, where in columns.values()
        ]
    )
    counts = torch.stack([where.sum() for _, where in columns.values()]).to(torch.float64)
    means = torch.where(counts > 0, sums / counts.clamp(min=1), 0.0)
    return dict(zip(columns, means.tolist(), strict=True))


@torch.no_grad()
def diagnostics(
    stats: TokenStats,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    valid: torch.Tensor | None = None,
    *,
    delta: float | None = None,
) -> dict[str, float]:
    """Means over valid response tokens. ``delta`` enables the out-of-region/disagreement metrics."""
    valid = torch.ones_like(mask) if valid is None else valid.bool()
    adv = advantages.to(stats.ratio.dtype)
    masked = mask.float()
    columns = {
        "masked_frac": (masked, valid),
        "masked_frac_pos_adv": (masked, valid & (adv > 0)),
        "masked_frac_neg_adv": (masked, valid & (adv < 0)),
        "kl_topk_mean": (stats.kl_topk, valid),
        "tv_topk_mean": (stats.tv_topk, valid),
        "kl_binary_mean": (stats.kl_binary, valid),
        "ratio_mean": (stats.ratio, valid),
        "mu_topk_mass": (stats.mu_topk_mass, valid),
        "pi_topk_mass": (stats.pi_topk_mass, valid),
        "global_term_mean": (stats.global_agg, valid),
        "global_term_abs_mean": (stats.global_agg.abs(), valid),
        "local_term_abs_mean": (stats.local_term.abs(), valid),
    }
    if delta is not None:
        columns["out_of_region_frac"] = (((stats.kl_topk > delta) & (adv != 0)).float(), valid)
        for name, proximity, direction in DISAGREEMENTS:
            predictive = composed_mask(proximity, direction, stats, adv, delta=delta)
            ratio = composed_mask(proximity, "ratio", stats, adv, delta=delta)
            columns[f"disagree_{name}"] = ((predictive != ratio).float(), valid)
    return _means(columns)
