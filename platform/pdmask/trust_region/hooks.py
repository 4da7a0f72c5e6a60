"""A method as the math API runs it: a mask hook and a loss hook over one :class:`RecipeBatch`.

``apply_method`` is the one function every backend calls per micro-batch (the embedded trainer,
the VeRL plugin's loss, ``policy_loss``): it builds the recipe contract from the backend's
tensors, runs the method's mask and then its per-token loss, and returns both. The math API
keeps the building blocks (the proximity and direction tests by name, the default loss); which
methods exist is the recipe registry's business.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

import torch

from pdmask.trust_region.contract import Float32Inputs, RecipeBatch
from pdmask.trust_region.logits_pass import compute_dtype
from pdmask.trust_region.loss import ratio_loss
from pdmask.trust_region.stats import ENTROPY, PASS_INPUTS, SUPPORT_LOG_PROBS, TokenStats

MaskHook = Callable[[RecipeBatch], torch.Tensor]
"""``fn(batch) -> bool [B, T]``, True = the token's gradient is zeroed."""
LossHook = Callable[[RecipeBatch], torch.Tensor]
"""``fn(batch) -> [B, T]`` per-token loss in ``batch.dtype``, differentiable through
``batch.log_prob``."""


@dataclass(frozen=True)
class Method:
    """A trust-region method with its parameters bound.

    ``mask`` None: no token is masked. ``loss`` None: the default ``-r A`` (``ratio_loss``) with
    the optional truncated-IS cap ``ratio_cap``. ``loss_sees_mask``: the loss receives the mask
    (``batch.mask``) and is kept on masked tokens; otherwise it is zeroed there.
    """

    name: str
    mask: MaskHook | None = None
    loss: LossHook | None = None
    params: Mapping[str, Any] = field(default_factory=dict)
    ratio_cap: float | None = None
    loss_sees_mask: bool = False
    needs: frozenset[str] = frozenset()
    """The recipe's ``needs``: which inputs the statistics pass must compute
    (``compute_token_stats(inputs=method.needs)``)."""

    def __post_init__(self):
        # Hooks get a read-only view: a recipe that edits its parameters would change the next
        # micro-batch's.
        object.__setattr__(self, "params", MappingProxyType(dict(self.params)))


@dataclass
class MethodOutput:
    """What ``apply_method`` returns for one micro-batch."""

    mask: torch.Tensor  # [B, T] bool, True = gradient zeroed (never on padding)
    # [B, T], 0 on padding and (unless the loss sees the mask) on masked tokens; aggregate it
    token_loss: torch.Tensor
    batch: RecipeBatch  # the contract the hooks saw


def hook_output_problem(kind: str, value: Any, batch: RecipeBatch) -> str | None:
    """Why a hook's return value breaks the contract (None if it does not).

    ``kind`` is ``"mask"`` or ``"loss"``.
    """
    shape = tuple(batch.response_mask.shape)
    if not isinstance(value, torch.Tensor):
        return f"returned {type(value).__name__}, expected a torch.Tensor of shape {shape} [B, T]"
    if tuple(value.shape) != shape:
        return f"returned shape {tuple(value.shape)}, expected {shape} [B, T] (rows = responses)"
    if kind == "mask" and value.dtype != torch.bool:
        return f"returned dtype {value.dtype}, expected torch.bool (True = gradient zeroed)"
    if kind == "loss" and value.dtype != batch.dtype:
        return f"returned dtype {value.dtype}, expected {batch.dtype} (the batch's compute dtype)"
    return None


def apply_method(
    method: Method,
    stats: TokenStats,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    log_prob: torch.Tensor | None = None,
    mu_log_prob: torch.Tensor | None = None,
    backend: str,
    precision: str | None = None,
) -> MethodOutput:
    """The method's mask and per-token loss on one micro-batch (all tensors ``[B, T]``).

    ``log_prob``: the differentiable log pi(y_t) (default ``stats.logp``, which the chunked
    logits pass makes differentiable); ``mu_log_prob``: log mu(y_t) (default ``stats.mu_logp``).
    Raises ``ValueError`` when a hook's output breaks the contract.
    """
    valid = response_mask.bool()
    logp = stats.logp if log_prob is None else log_prob
    mu = (stats.mu_logp if mu_log_prob is None else mu_log_prob).detach()
    missing = sorted(
        name
        for name, field_name in PASS_INPUTS.items()
        if name in method.needs and getattr(stats, field_name) is None
    )
    if missing:
        raise ValueError(
            f"method {method.name!r} needs {missing}, which these statistics lack: compute them "
            "with compute_token_stats(..., inputs=method.needs)"
        )
    support = stats.support if SUPPORT_LOG_PROBS in method.needs else None
    # The inputs as the backend has them, in at least float32 (the statistics' dtype): a loss
    # equal to one computed from float32 inputs (verl's own) cannot be built from bf16 copies.
    wide = compute_dtype(logp.dtype)
    fp32 = Float32Inputs(
        log_prob=logp.to(wide),
        mu_log_prob=mu.to(wide),
        advantages=advantages.detach().to(wide),
        support=None if support is None else support.to(wide),
    )
    batch = RecipeBatch(
        stats=stats.detached(),  # the statistics are detached on every backend
        log_prob=logp,
        mu_log_prob=mu.to(logp.dtype),
        advantages=advantages.detach().to(logp.dtype),
        response_mask=valid,
        params=method.params,
        backend=backend,
        precision=precision,
        # In the batch's compute dtype like every float here (verl's log-probs may be bf16).
        entropy=stats.entropy.to(logp.dtype) if ENTROPY in method.needs else None,
        support=None if support is None else support.to(logp.dtype),
        fp32=fp32,
    )
    mask = torch.zeros_like(valid) if method.mask is None else method.mask(batch)
    _check(method, "mask", mask, batch)
    mask = mask & valid
    if method.loss is not None and method.loss_sees_mask:
        # The loss decides what masked tokens contribute (a penalty that acts on them too).
        batch = replace(batch, mask=mask)
        loss = method.loss(batch)
        _check(method, "loss", loss, batch)
        return MethodOutput(mask, torch.where(valid, loss, torch.zeros_like(loss)), batch)
    loss = ratio_loss(batch, method.ratio_cap) if method.loss is None else method.loss(batch)
    _check(method, "loss", loss, batch)
    token_loss = torch.where(mask | ~valid, torch.zeros_like(loss), loss)
    return MethodOutput(mask, token_loss, batch)


def _check(method: Method, kind: str, value: Any, batch: RecipeBatch) -> None:
    problem = hook_output_problem(kind, value, batch)
    if problem is not None:
        raise ValueError(f"method {method.name!r}: its {kind} {problem}")
