"""Which verl policy-loss names are pdmask's, in a job's processes.

verl looks a loss up by ``actor.policy_loss.loss_mode``. A pdmask method reaches verl only as the
recipe its job carries (``file_recipes``): its loss name is ``Recipe.verl_name`` (the recipe name
with ``-`` turned into ``_``, prefixed ``pdm_`` where it would shadow one of verl's own losses). A
recipe that *is* one of verl's own losses (``verl_loss_mode``, e.g. ``vanilla``) is configuration
only and pdmask owns no loss name for it. Outside a job that carries a recipe, no name is pdmask's.
"""

from __future__ import annotations

from pdmask.backends.verl.file_recipes import declared, pdmask_losses

# Values of pdmask's knobs in verl's config, kept here (no verl import) so that the job builder,
# which only writes overrides, does not pay for importing verl.
MU_SOURCES = ("rollout", "recompute")
DEFAULT_TOPK = 20


def method_for_loss_mode(loss_mode: str) -> str | None:
    """The pdmask method behind a verl ``loss_mode``, or None for a loss pdmask does not own."""
    carried = pdmask_losses().get(loss_mode)
    return None if carried is None else carried.name


def pdm_loss_modes() -> list[str]:
    """Every loss name pdmask registers in this process: its job's recipe's."""
    return sorted(pdmask_losses())


def loss_uses_delta(loss_mode: str) -> bool:
    """True when the method behind ``loss_mode`` needs the trust-region radius delta."""
    carried = declared().get(loss_mode)
    return carried is not None and carried.uses_delta
