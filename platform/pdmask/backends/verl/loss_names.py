"""How pdmask's method names map onto verl's policy-loss registry names.

verl looks a loss up by ``actor.policy_loss.loss_mode``. Every method of the math API is reachable
there under its recipe name with ``-`` turned into ``_`` (``pdm-agg`` -> ``pdm_agg``), except
``grpo-clip-higher``: that one *is* verl's own ``vanilla`` clipped surrogate (clip 0.2 / 0.28), so it
is configuration only and pdmask registers nothing for it.

A job may also carry recipe files the math API does not know (``file_recipes``): their loss names
are resolved first, so a job's own recipe always decides its mask.
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
    from pdmask.backends.verl.file_recipes import declared

    carried = declared().get(loss_mode)
    return carried.name if carried is not None else PDM_LOSS_MODES.get(loss_mode)


def pdm_loss_modes() -> list[str]:
    """Every loss name pdmask registers in this process: the math API's and the job's recipes'."""
    from pdmask.backends.verl.file_recipes import declared

    return sorted({*PDM_LOSS_MODES, *declared()})


def loss_uses_delta(loss_mode: str) -> bool:
    """True when the method behind ``loss_mode`` needs the trust-region radius delta."""
    from pdmask.backends.verl.file_recipes import declared

    carried = declared().get(loss_mode)
    if carried is not None:
        return carried.uses_delta
    return METHODS[PDM_LOSS_MODES[loss_mode]].uses_delta


def loss_mask(loss_mode: str, delta: float | None):
    """``fn(stats, advantages) -> bool`` (True = gradient zeroed) of the method behind ``loss_mode``."""
    from pdmask.backends.verl.file_recipes import declared, mask_function

    if loss_mode in declared():
        return mask_function(loss_mode, delta)
    from pdmask.trust_region import method_mask

    method = PDM_LOSS_MODES[loss_mode]
    return lambda stats, advantages: method_mask(method, stats, advantages, delta=delta)
