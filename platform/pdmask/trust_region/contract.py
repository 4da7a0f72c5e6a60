"""The recipe contract: the one object a recipe's mask and loss receive, on every backend.

A backend hands the math API one micro-batch in the **padded response frame** and the math API
wraps it, with the recipe's resolved parameters, in a :class:`RecipeBatch`:

- **Layout.** Row ``b`` is one response (one sampled sequence); column ``t`` is its ``t``-th
  response token. Prompts are not in the frame. Valid tokens fill a prefix of each row
  (``response_mask``); the rest is padding. So ``B`` = responses in the micro-batch, ``T`` = the
  longest response there. A GRPO group's responses are separate rows, in no guaranteed order.
- **Shapes.** Every tensor is ``[B, T]`` (``stats`` too: each of its fields), except
  ``sequence_lengths`` (``[B]``) and the support's slots (``[B, T, M]``). ``batch.dtype`` is the
  loss's dtype, that of ``log_prob`` (bf16 where verl's log-probs are); ``mu_log_prob``,
  ``advantages``, ``entropy`` and ``support`` are in it too. ``stats`` and ``fp32`` hold every
  value in the statistics' dtype, float32 (float64 when the backend computes in float64, e.g. a
  float64 reference in a test), whatever ``batch.dtype``: a loss that must equal one computed
  from float32 inputs (verl's own) reads them there and returns its result in ``batch.dtype``.
- **Padding** holds finite values that mean nothing: whatever the backend computed there (the
  embedded trainer) or zeros (verl's padded frame). Use ``response_mask``; never assume padding
  has ``A = 0`` or any other value.
- **Gradients.** ``log_prob`` carries one (to the policy's logits), and so do ``entropy`` and
  ``support`` when the recipe lists them in ``needs`` (``"entropy"``, ``"support_log_probs"``;
  None otherwise). All three are exact, from the same pass over the logits (``logits_pass``). ``stats`` is
  detached on every backend: a loss built from ``stats.logp`` would train nothing.
- **Read-only.** The tensors are the backend's own; a hook returns new tensors and never writes
  into these. A write in place (``batch.advantages.mul_(2)``, ``batch.stats.ratio[0] = 1``, into a
  view of one as well) is caught by the tensors' version counters: the recipe's mask or loss
  fails, naming the tensor and the line (``Recipe.method``; ``pdm validate`` refuses it before
  anything trains).

A mask returns a bool ``[B, T]`` tensor, True = the token's gradient is zeroed. A loss returns the
per-token loss ``[B, T]`` in ``batch.dtype``; the math API zeroes it on padding and on masked
tokens, unless the recipe declares ``loss_sees_mask`` (then the loss receives the mask as
``batch.mask`` and decides what masked tokens contribute), and the backend aggregates it with
verl's loss-aggregation modes (``token-mean`` by default).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from pdmask.trust_region.stats import SupportLogProbs, TokenStats

RECIPE_METRIC_GROUP = "recipe/"
"""A recipe's own scalars (:meth:`RecipeBatch.report`) among the ``actor/pdm/`` diagnostics."""
RECIPE_METRIC_PREFIX = "actor/pdm/" + RECIPE_METRIC_GROUP
"""Where the backends log them (the math API's ``policy_loss`` metrics: ``recipe/<name>``)."""
# verl reduces a metric whose name contains "max" or "min" with max/min, whatever it means.
_METRIC_NAME = re.compile(r"^(?!.*(max|min))[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class Float32Inputs:
    """The inputs a loss computes from, in the statistics' dtype (float32; float64 for float64
    logits) whatever ``batch.dtype``: as the backend had them, never rounded to bf16."""

    log_prob: torch.Tensor
    """``[B, T]`` log pi(y_t), differentiable (the batch's ``log_prob``, upcast)."""
    mu_log_prob: torch.Tensor
    """``[B, T]`` log mu(y_t), detached."""
    advantages: torch.Tensor
    """``[B, T]`` the advantages."""
    support: SupportLogProbs | None = None
    """The support view (``log_prob`` and ``tail_mass`` differentiable), when the recipe needs
    ``"support_log_probs"``."""


@dataclass(frozen=True)
class RecipeBatch:
    """One micro-batch as a recipe sees it (see the module docstring for layout and shapes)."""

    stats: TokenStats
    """Per-token trust-region statistics (``kl_topk``, ``ratio``, ``ddot_agg``, ...), ``[B, T]``
    each, detached."""
    log_prob: torch.Tensor
    """``[B, T]`` log pi(y_t) of the policy being trained; the policy gradient flows through it."""
    mu_log_prob: torch.Tensor
    """``[B, T]`` log mu(y_t), the behaviour policy's log-prob of the sampled token (detached):
    the rollout engine's (``mu_source=rollout``) or the old policy's (``recompute``)."""
    advantages: torch.Tensor
    """``[B, T]`` advantage of each token (GRPO: its sequence's group-normalised reward)."""
    response_mask: torch.Tensor
    """``[B, T]`` bool, True on the tokens that count (a prefix of each row)."""
    params: Mapping[str, Any]
    """The recipe's parameters, defaults resolved, as the trial sets them."""
    backend: str
    """Who runs it: ``"sim"`` (the embedded trainer), ``"verl"`` (the VeRL plugin), or what a
    direct caller of the math API says (``policy_loss``: ``"math"``)."""
    precision: str | None
    """The trial's precision setting (``bf16``, ``fp8-rollout``, ``fp8-e2e``), None if unknown."""
    mask: torch.Tensor | None = None
    """``[B, T]`` bool, the recipe's mask (True = gradient zeroed), for a loss of a recipe that
    declares ``loss_sees_mask``; None for masks and for every other loss."""
    entropy: torch.Tensor | None = None
    """``[B, T]`` H(pi_t) = -sum_j pi_j log pi_j over the whole vocabulary, differentiable; set
    when the recipe needs ``"entropy"``."""
    support: SupportLogProbs | None = None
    """pi and mu over the support ``S = TopK(mu) ∪ {y}`` (``[B, T, M]``) and the tail's mass
    (``[B, T]``), ``log_prob`` and ``tail_mass`` differentiable; set when the recipe needs
    ``"support_log_probs"``."""
    fp32: Float32Inputs | None = None
    """``log_prob``, ``mu_log_prob``, ``advantages`` and ``support`` in the statistics' dtype
    (float32, or float64), whatever ``batch.dtype``; always set by ``apply_method``."""
    reported: dict[str, float] = field(default_factory=dict)
    """What the recipe's mask and loss reported on this micro-batch (:meth:`report`)."""

    def report(self, name: str, value: float | torch.Tensor) -> None:
        """Log a scalar of the recipe's own (the size of a penalty, a bonus's share) as
        ``actor/pdm/recipe/<name>``, averaged over the step's micro-batches, on every backend.
        ``name``: lower-case letters, digits and ``_``, without "max"/"min" (verl would reduce
        those by max/min)."""
        if not _METRIC_NAME.match(name):
            raise ValueError(
                f"recipe metric name {name!r}: use lower-case letters, digits and '_', starting "
                "with a letter, without 'max'/'min'"
            )
        number = float(value.detach()) if isinstance(value, torch.Tensor) else float(value)
        if not math.isfinite(number):
            raise ValueError(f"recipe metric {name!r} is not finite ({number})")
        self.reported[name] = number

    @property
    def token_id(self) -> torch.Tensor:
        """``[B, T]`` long: y_t, the sampled token's vocabulary id."""
        return self.stats.token_id

    def inputs(self) -> dict[str, torch.Tensor]:
        """Every tensor this batch hands a hook, by the name a recipe reads it under
        (``advantages``, ``support.log_prob``, ``stats.ratio``, ``fp32.advantages``, ...): what a
        hook must not write into. One tensor may have several names (``fp32.log_prob`` is
        ``log_prob`` itself in a float32 batch)."""
        out: dict[str, Any] = {}
        for name in ("advantages", "mu_log_prob", "log_prob", "response_mask", "mask", "entropy"):
            out[name] = getattr(self, name)
        out |= _fields("support", self.support)
        out |= _fields("stats", self.stats)
        out |= _fields("stats.support", self.stats.support)
        out |= _fields("stats.kernel", self.stats.kernel)
        out |= _fields("fp32", self.fp32)
        out |= _fields("fp32.support", None if self.fp32 is None else self.fp32.support)
        return {name: t for name, t in out.items() if isinstance(t, torch.Tensor)}

    @property
    def dtype(self) -> torch.dtype:
        """The compute dtype of every float tensor here."""
        return self.log_prob.dtype

    @property
    def sequence_lengths(self) -> torch.Tensor:
        """``[B]`` long: valid response tokens per row."""
        return self.response_mask.sum(-1)

    @property
    def log_ratio(self) -> torch.Tensor:
        """``[B, T]`` log r_t = log pi(y_t) - log mu(y_t), differentiable."""
        return self.log_prob - self.mu_log_prob

    @property
    def ratio(self) -> torch.Tensor:
        """``[B, T]`` r_t = pi(y_t) / mu(y_t), differentiable (``stats.ratio`` is its detached
        value)."""
        return self.log_ratio.exp()

    def sequence_sum(self, values: torch.Tensor) -> torch.Tensor:
        """``[B]``: the sum of ``[B, T]`` values over each response's valid tokens."""
        return torch.where(self.response_mask, values, torch.zeros_like(values)).sum(-1)

    def sequence_mean(self, values: torch.Tensor) -> torch.Tensor:
        """``[B]``: the mean over each response's valid tokens (0 for a response without any)."""
        lengths = self.sequence_lengths.clamp_min(1).to(values.dtype)
        return self.sequence_sum(values) / lengths

    def per_token(self, sequence_values: torch.Tensor) -> torch.Tensor:
        """``[B] -> [B, T]``: one value per response broadcast to its tokens."""
        return sequence_values[:, None].expand(self.response_mask.shape)


def _fields(prefix: str, holder: Any) -> dict[str, Any]:
    """A dataclass's fields as ``prefix.<field>`` (none for None)."""
    if holder is None:
        return {}
    return {f"{prefix}.{f.name}": getattr(holder, f.name) for f in fields(holder)}
