"""Parameters several recipes share, declared once with their documentation and role."""

from __future__ import annotations

from pdmask.registry.recipes import Param

DELTA = Param(
    default=0.15,
    ge=1e-6,
    le=10.0,
    role="delta",
    description="Trust-region size: a token is outside when its divergence exceeds delta "
    "(the paper: 0.15 for Figure 1, 0.05 for Figure 2).",
)
TOPK = Param(
    default=20,
    ge=0,
    le=1000,
    role="topk",
    description="K, how many of the behaviour policy's top log-probs the rollout engine "
    "returns (vLLM's default cap is 20).",
)
RATIO_CAP = Param(
    default=None,
    ge=1.0,
    role="ratio_cap",
    description="Optional truncated-IS cap C: the loss uses min(r, C) (gradient scaled, "
    "not dropped). None: no cap, as in the paper.",
)
EPS_LOW = Param(
    default=0.2,
    ge=0.0,
    le=1.0,
    role="clip_low",
    description="Lower clip: outside when r < 1 - eps_low.",
)
EPS_HIGH = Param(
    default=0.28,
    ge=0.0,
    le=10.0,
    role="clip_high",
    description="Upper clip (clip-higher): outside when r > 1 + eps_high.",
)
