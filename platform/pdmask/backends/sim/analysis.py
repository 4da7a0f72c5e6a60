"""A building block for the token-level analysis: one trial's state plus one rollout batch.

The analysis asks, token by token, whether a direction test predicted the change of the divergence
that a real update then makes. It needs the trainer (to update and re-measure), the behaviour copy,
the optimizer, and a rollout batch carrying everything the math API needs: the trainer's full
logits, the behaviour's top-20 view, the *full* behaviour distribution (for exact references) and
the advantages. :func:`build_analysis_setup` provides exactly that, from the stand-in's base model or
from a trial's checkpoint, optionally after a few stale updates so that ``pi`` has drifted from
``mu`` as it has for the later minibatches of a training step.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path

import torch

from pdmask.backends.sim.config import SimTrialConfig
from pdmask.backends.sim.grpo import (
    ExactReference,
    RolloutBatch,
    exact_reference,
    output_kernel,
    token_stats,
    trainer_logits,
    trainer_logits_and_hidden,
)
from pdmask.backends.sim.model import TinyDecoder
from pdmask.backends.sim.runtime import single_threaded
from pdmask.backends.sim.state import TrialState, step_generator
from pdmask.backends.sim.task import AdditionTask
from pdmask.trust_region import (
    KernelTerms,
    TokenStats,
    aggregate_loss,
    per_token_loss,
)


@dataclass
class AnalysisSetup:
    """Everything a token-level analysis of one update needs (see the module docstring)."""

    config: SimTrialConfig
    task: AdditionTask
    trainer: TinyDecoder
    behaviour: TinyDecoder
    optimizer: torch.optim.Optimizer
    batch: RolloutBatch  # collected with the full behaviour distribution kept
    step: int  # the trial step the state comes from (0 = base model)
    _float64: TinyDecoder | None = field(default=None, repr=False)  # see kl_topk_float64

    @property
    def all_sequences(self) -> torch.Tensor:
        return torch.arange(self.batch.size)

    @property
    def advantages(self) -> torch.Tensor:
        """``[N, R]`` token advantages (0 on padding)."""
        return self.batch.token_advantages

    @property
    def valid(self) -> torch.Tensor:
        return self.batch.valid

    def logits(self, index: torch.Tensor | None = None) -> torch.Tensor:
        """The trainer's current logits ``[n, R, V]`` (differentiable) on the response positions."""
        index = self.all_sequences if index is None else index
        return trainer_logits(self.trainer, self.batch, index)

    def logits_and_hidden(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The logits as :meth:`logits` gives them and the lm head's input ``[n, R, d]``."""
        return trainer_logits_and_hidden(self.trainer, self.batch, index)

    def kernel(
        self, logits: torch.Tensor, hidden: torch.Tensor, index: torch.Tensor
    ) -> KernelTerms:
        """The output-embedding kernel terms against the behaviour's top-K view."""
        return output_kernel(logits, hidden, self.trainer.lm_head.weight, self.batch, index)

    def stats(
        self,
        logits: torch.Tensor,
        index: torch.Tensor | None = None,
        inputs=(),
        hidden: torch.Tensor | None = None,
    ) -> TokenStats:
        """Statistics against the behaviour's top-K view (what a mask may use); ``inputs``: a
        recipe's ``needs`` (``output_kernel`` also takes the lm head's input ``hidden``)."""
        index = self.all_sequences if index is None else index
        weight = self.trainer.lm_head.weight
        return token_stats(logits, self.batch, index, inputs, hidden=hidden, lm_head=weight)

    def exact(self, logits: torch.Tensor, index: torch.Tensor | None = None) -> ExactReference:
        """Exact full-vocabulary KL and ``Ddot`` against the full behaviour distribution."""
        return exact_reference(logits, self.batch, self.all_sequences if index is None else index)

    @torch.no_grad()
    def kl_topk_float64(self, params: dict, index: torch.Tensor) -> torch.Tensor:
        """``D_t`` of sequences ``index`` recomputed in float64 for trainer parameters ``params``
        (a float64 copy of the trainer; the rollout's float32 log-probs are upcast exactly): the
        reference that measures the float32 rounding of ``D_t`` and of its changes."""
        if self._float64 is None:
            self._float64 = copy.deepcopy(self.trainer).double()
        self._float64.load_state_dict(params)
        # (the behaviour's float32 log-probs are computed with in float64: exact upcasts)
        return token_stats(
            trainer_logits(self._float64, self.batch, index), self.batch, index
        ).kl_topk

    def update(self, mask: torch.Tensor, index: torch.Tensor | None = None) -> float:
        """One real optimizer step with ``mask`` (True = zeroed) on sequences ``index``."""
        index = self.all_sequences if index is None else index
        stats = self.stats(self.logits(index), index)
        advantages = self.advantages[index]
        loss_mat = per_token_loss(
            stats.logp, stats.mu_logp, advantages, mask, self.config.ratio_cap
        )
        loss = aggregate_loss(loss_mat, self.valid[index], self.config.loss_agg_mode)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.trainer.parameters(), self.config.grad_clip)
        self.optimizer.step()
        return loss.item()


def build_analysis_setup(
    cfg: SimTrialConfig,
    *,
    workdir: Path | None = None,
    stale_updates: int = 0,
    batch_seed: int = 0,
) -> AnalysisSetup:
    """Trainer, behaviour, optimizer and a fresh rollout batch for ``cfg``.

    ``workdir``: start from that trial's checkpoint (else the base model). ``stale_updates``: plain
    (unmasked) GRPO updates on random minibatches of the batch before returning, so ``pi`` lags
    behind ``mu`` like a later minibatch's. ``batch_seed`` picks a different batch from the same
    state. Builds single-threaded; callers that keep computing should too
    (``pdmask.backends.sim.runtime.single_threaded``).
    """
    with single_threaded():
        return _build(cfg, workdir, stale_updates, batch_seed)


def _build(cfg, workdir, stale_updates, batch_seed) -> AnalysisSetup:
    state = TrialState(cfg)
    if workdir is not None and not state.resume(Path(workdir)):
        raise FileNotFoundError(f"no checkpoint in {workdir}")
    budget = cfg.resolved()
    generator = step_generator(cfg.seed, state.step + 1, f"analysis/{batch_seed}")
    state.trainer.train()
    batch = state.rollout(generator)
    setup = AnalysisSetup(
        cfg, cfg.task_spec, state.trainer, state.behaviour, state.optimizer, batch, state.step
    )
    for _ in range(stale_updates):
        perm = torch.randperm(batch.size, generator=generator)
        index = perm[: max(1, batch.size // budget.minibatches)]
        no_mask = torch.zeros_like(batch.valid[index])
        setup.update(no_mask, index)
    return setup
