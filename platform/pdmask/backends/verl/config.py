"""pdmask's knobs inside verl's own actor config: a typed subclass of verl's ``PolicyLossConfig``.

Selected with ``actor_rollout_ref.actor.policy_loss._target_=pdmask.backends.verl.config.PDMPolicyLossConfig``;
Hydra then instantiates it wherever verl builds the actor config (the driver's config validation,
every actor worker), and the ``+actor_rollout_ref.actor.policy_loss.pdm_*`` overrides land here
typed and checked. Without the subclass verl would reject the unknown keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from verl.workers.config import PolicyLossConfig

from pdmask.backends.verl.loss_names import DEFAULT_TOPK, MU_SOURCES  # noqa: F401 (re-exported)

SUPPORT_MODES = ("union", "overwrite")


def _doc(text: str) -> dict:
    """Field metadata: the description shown in docs and error messages."""
    return {"description": text}


@dataclass
class PDMPolicyLossConfig(PolicyLossConfig):
    """verl's policy-loss config plus the trust-region knobs of pdmask's methods.

    ``loss_mode`` (inherited) names the method in verl's spelling (``pdm_agg``, ``dppo_topk_kl``...).
    """

    pdm_delta: Optional[float] = field(  # noqa: UP045 (OmegaConf structured-config typing)
        default=None,
        metadata=_doc(
            "Trust-region radius delta of the proximity test (top-K KL or TV, binary KL or TV). "
            "Required by every method that uses it; there is deliberately no default."
        ),
    )
    pdm_topk: int = field(
        default=DEFAULT_TOPK,
        metadata=_doc(
            "K, the number of behaviour-policy log-probs carried per token (vLLM's default cap is "
            "20; larger K needs rollout.engine_kwargs.vllm.max_logprobs >= K)."
        ),
    )
    pdm_mu_source: str = field(
        default="rollout",
        metadata=_doc(
            "Where mu's top-K comes from: 'rollout' = vLLM's decode-time log-probs (needs "
            "algorithm.rollout_correction.bypass_mode=True); 'recompute' = the trainer's old-policy "
            "forward before the update (bypass_mode=False)."
        ),
    )
    pdm_ratio_cap: Optional[float] = field(  # noqa: UP045
        default=None,
        metadata=_doc(
            "Optional truncated-importance-sampling cap C on r_t in the loss (None = the method's "
            "exact gradient -M r A)."
        ),
    )
    pdm_chunk_size: Optional[int] = field(  # noqa: UP045
        default=None,
        metadata=_doc(
            "Rows of logits per chunk in the statistics pass (None = the device's default: "
            "2 MB of float32 per chunk on CPU, 256 MiB on GPU; trust_region.logits_pass). Only "
            "memory and speed change, never the numbers."
        ),
    )
    pdm_support: str = field(
        default="union",
        metadata=_doc(
            "'union' = S = TopK(mu) ∪ {y_t} (the project's convention); 'overwrite' = the public "
            "DPPO variant that writes y_t over the K-th entry (a different divergence)."
        ),
    )

    def __post_init__(self):
        problems = []
        if self.pdm_delta is not None and not self.pdm_delta > 0:
            problems.append(f"pdm_delta must be > 0, got {self.pdm_delta}")
        if self.pdm_topk < 1:
            problems.append(f"pdm_topk must be >= 1, got {self.pdm_topk}")
        if self.pdm_mu_source not in MU_SOURCES:
            problems.append(
                f"pdm_mu_source must be one of {MU_SOURCES}, got {self.pdm_mu_source!r}"
            )
        if self.pdm_ratio_cap is not None and not self.pdm_ratio_cap > 0:
            problems.append(f"pdm_ratio_cap must be > 0, got {self.pdm_ratio_cap}")
        if self.pdm_chunk_size is not None and self.pdm_chunk_size < 1:
            problems.append(f"pdm_chunk_size must be >= 1, got {self.pdm_chunk_size}")
        if self.pdm_support not in SUPPORT_MODES:
            problems.append(f"pdm_support must be one of {SUPPORT_MODES}, got {self.pdm_support!r}")
        if problems:
            # verl turns config errors into plain exceptions; name the section so it is findable.
            raise ValueError("actor_rollout_ref.actor.policy_loss: " + "; ".join(problems))
