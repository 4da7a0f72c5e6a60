"""How pdmask's method names map onto verl's policy-loss registry names.

verl looks a loss up by ``actor.policy_loss.loss_mode``. Every method of the math API is reachable
there under its recipe name with ``-`` turned into ``_`` (``pdm-agg`` -> ``pdm_agg``), except
``grpo-clip-higher``: that one *is* verl's own ``vanilla`` clipped surrogate (clip 0.2 / 0.28), so it
is configuration only and pdmask registers nothing for it.
"""

from __future__ import annotations

from pdmask.trust_region import METHODS

GRPO_METHOD = "grpo-clip-higher"
VANILLA_LOSS = "vanilla"
# Values of pdmask's knobs in verl's config, kept here (no verl import) so that the job builder,
# which only writes overrides, does not pay for importing verl.
MU_SOURCES = ("rollout", "recompute")
DEFAULT_TOPK = 20


def verl_loss_name(method: str) -> str:
    """The ``loss_mode`` verl uses for a pdmask method name."""
    if method not in METHODS:
        raise KeyError(f"unknown method {method!r}; known: {', '.join(sorted(METHODS))}")
    return VANILLA_LOSS if method == GRPO_METHOD else method.replace("-", "_")


PDM_LOSS_MODES: dict[str, str] = {
    verl_loss_name(name): name for name in METHODS if name != GRPO_METHOD
}
"""verl loss name -> pdmask method, for every loss pdmask registers (all but grpo-clip-higher)."""


def method_for_loss_mode(loss_mode: str) -> str | None:
    """The pdmask method behind a verl ``loss_mode``, or None for a loss pdmask does not own."""
    return PDM_LOSS_MODES.get(loss_mode)
