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


def _mean(values: torch.Tensor, where: torch.Tensor) -> float:
    count = where.sum()
    if count == 0:
        return 0.0
    return float(torch.where(where, values.to(torch.float64), 0.0).sum() / count)


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
    out = {
        "masked_frac": _mean(mask.float(), valid),
        "masked_frac_pos_adv": _mean(mask.float(), valid & (adv > 0)),
        "masked_frac_neg_adv": _mean(mask.float(), valid & (adv < 0)),
        "kl_topk_mean": _mean(stats.kl_topk, valid),
        "tv_topk_mean": _mean(stats.tv_topk, valid),
        "kl_binary_mean": _mean(stats.kl_binary, valid),
        "ratio_mean": _mean(stats.ratio, valid),
        "mu_topk_mass": _mean(stats.mu_topk_mass, valid),
        "pi_topk_mass": _mean(stats.pi_topk_mass, valid),
        "global_term_mean": _mean(stats.global_agg, valid),
        "global_term_abs_mean": _mean(stats.global_agg.abs(), valid),
        "local_term_abs_mean": _mean(stats.local_term.abs(), valid),
    }
    if delta is not None:
        out["out_of_region_frac"] = _mean(((stats.kl_topk > delta) & (adv != 0)).float(), valid)
        for name, proximity, direction in DISAGREEMENTS:
            predictive = composed_mask(proximity, direction, stats, adv, delta=delta)
            ratio = composed_mask(proximity, "ratio", stats, adv, delta=delta)
            out[f"disagree_{name}"] = _mean((predictive != ratio).float(), valid)
    return out
