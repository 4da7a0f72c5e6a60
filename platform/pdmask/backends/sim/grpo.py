"""GRPO pieces shared by the training loop and the token-level analysis.

A rollout batch holds ``prompts x G`` responses from the behaviour copy, their rule-based rewards
and group-normalised advantages (VeRL's ``compute_grpo_outcome_advantage``: ``(r - mean) / (std +
1e-6)`` per group, unbiased std). The trainer's side of a minibatch is its own full logits on the
response positions and the trust-region statistics from the math API, computed against the
behaviour's top-K view only.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, fields, is_dataclass, replace

import torch

from pdmask.backends.sim.model import TinyDecoder
from pdmask.backends.sim.rollout import Generation, generate
from pdmask.backends.sim.task import AdditionTask
from pdmask.trust_region import (
    ExactDivergence,
    KernelTerms,
    TokenStats,
    compute_token_stats,
    exact_divergence,
    kernel_terms,
)
from pdmask.trust_region.stats import OUTPUT_KERNEL

GRPO_EPSILON = 1e-6


@dataclass
class RolloutBatch:
    """One GRPO rollout batch: generations, rewards, advantages (sequence and token level)."""

    generation: Generation
    a: torch.Tensor  # [N] problem operands (each prompt repeated G times, groups contiguous)
    b: torch.Tensor
    group_size: int
    rewards: torch.Tensor  # [N]
    advantages: torch.Tensor  # [N] group-normalised

    @property
    def size(self) -> int:
        return self.rewards.shape[0]

    @property
    def valid(self) -> torch.Tensor:
        return self.generation.valid

    @property
    def token_advantages(self) -> torch.Tensor:
        """``[N, R]``: the sequence's advantage on every response token, 0 on padding."""
        valid = self.generation.valid
        return torch.where(valid, self.advantages[:, None].expand_as(valid), 0.0)

    @property
    def num_tokens(self) -> int:
        """Prompt plus response tokens actually processed."""
        return int(self.generation.prompts.numel() + self.generation.valid.sum())


def grpo_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    groups = rewards.view(-1, group_size)
    mean = groups.mean(1, keepdim=True)
    std = groups.std(1, keepdim=True)
    return ((groups - mean) / (std + GRPO_EPSILON)).view(-1)


def collect_rollout(
    behaviour: TinyDecoder,
    task: AdditionTask,
    *,
    prompts: int,
    group_size: int,
    generator: torch.Generator,
    top_k: int = 20,
    keep_full: bool = False,
) -> RolloutBatch:
    """Sample ``prompts`` training problems, ``group_size`` responses each, and score them."""
    a, b = task.sample_train(prompts, generator)
    a, b = a.repeat_interleave(group_size), b.repeat_interleave(group_size)
    generation = generate(
        behaviour,
        task.prompts(a, b),
        task.response_len,
        generator,
        top_k=top_k,
        keep_full=keep_full,
    )
    rewards = task.score(a, b, generation.responses)
    return RolloutBatch(generation, a, b, group_size, rewards, grpo_advantages(rewards, group_size))


def trainer_logits(trainer: TinyDecoder, batch: RolloutBatch, index: torch.Tensor) -> torch.Tensor:
    """The trainer's logits ``[n, R, V]`` at the response positions of sequences ``index``."""
    return trainer_logits_and_hidden(trainer, batch, index)[0]


def trainer_logits_and_hidden(
    trainer: TinyDecoder, batch: RolloutBatch, index: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The trainer's logits ``[n, R, V]`` at the response positions of sequences ``index`` and
    the lm head's input ``[n, R, d]`` there (what the output-kernel terms need).

    Responses vary in length, so the sequences run in two forwards, the shorter half (up to the
    median length) cut at its longest response and the rest at theirs: most responses are short,
    and one forward padded to the longest would pay for its padding (a third of a 4B stand-in's
    update at the task's lengths). A row's valid positions see only earlier ones (causal), so
    they are what one forward gives; positions past a group's cut are 0 (padding, meaningless)."""
    gen = batch.generation
    lengths = gen.valid[index].sum(1)
    start = gen.prompts.shape[1] - 1
    width = gen.responses.shape[1]
    cut = int(lengths.median()) if lengths.numel() else width
    groups = [lengths <= cut, lengths > cut]
    logits = hidden = None
    for rows in (g.nonzero().squeeze(1) for g in groups):
        if not rows.numel():
            continue
        longest = max(1, int(lengths[rows].max()))
        part_logits, part_hidden = _forward(trainer, gen.sequences[index[rows]], start, longest)
        if logits is None:
            logits = part_logits.new_zeros(index.shape[0], width, part_logits.shape[-1])
            hidden = part_hidden.new_zeros(index.shape[0], width, part_hidden.shape[-1])
        logits = logits.index_put((rows,), _padded(part_logits, width))
        hidden = hidden.index_put((rows,), _padded(part_hidden, width))
    return logits, hidden


def _forward(trainer, sequences, start, responses):
    """Logits and lm-head input at the first ``responses`` response positions of ``sequences``."""
    captured: list[torch.Tensor] = []
    hook = trainer.lm_head.register_forward_hook(lambda _m, args, _o: captured.append(args[0]))
    try:
        logits = trainer(sequences[:, : start + responses], logits_from=start)
    finally:
        hook.remove()
    return logits, captured[0]


def _padded(x: torch.Tensor, width: int) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, 0, 0, width - x.shape[1]))


def token_stats(
    logits: torch.Tensor,
    batch: RolloutBatch,
    index: torch.Tensor,
    inputs: Collection[str] = (),
    *,
    hidden: torch.Tensor | None = None,
    lm_head: torch.Tensor | None = None,
) -> TokenStats:
    """Trust-region statistics of ``pi`` (these logits) against the behaviour's top-K view;
    ``inputs``: the recipe's ``needs`` (its differentiable extras; ``output_kernel`` also takes
    the lm head's input ``hidden`` and weight ``lm_head``). Computed on the valid response
    tokens only, in the ``[n, R]`` frame with 0 on padding (as verl's)."""
    gen = batch.generation
    valid = gen.valid[index]
    packed = compute_token_stats(
        logits[valid],
        gen.responses[index][valid],
        gen.mu_topk_ids[index][valid],
        gen.mu_topk_logprobs[index][valid],
        gen.mu_logp[index][valid],
        inputs=inputs,
    )
    stats = _framed(packed, valid)
    if OUTPUT_KERNEL not in inputs:
        return stats
    if hidden is None or lm_head is None:
        raise ValueError("output_kernel needs the lm head's input and weight")
    return replace(stats, kernel=output_kernel(logits, hidden, lm_head, batch, index))


def framed(values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``[N, ...]`` values of the valid tokens into the ``[n, R, ...]`` frame of ``valid``, 0 on
    padding (differentiable)."""
    out = values.new_zeros((*valid.shape, *values.shape[1:]))
    return out.index_put(valid.nonzero(as_tuple=True), values)


def _framed(stats, valid: torch.Tensor):
    """Every tensor of a statistics dataclass (``TokenStats``, its support) into the frame."""
    changes = {}
    for f in fields(stats):
        value = getattr(stats, f.name)
        if isinstance(value, torch.Tensor):
            changes[f.name] = framed(value, valid)
        elif is_dataclass(value):
            changes[f.name] = _framed(value, valid)
    return replace(stats, **changes)


def output_kernel(
    logits: torch.Tensor,
    hidden: torch.Tensor,
    lm_head: torch.Tensor,
    batch: RolloutBatch,
    index: torch.Tensor,
) -> KernelTerms:
    """The output-embedding kernel terms against the behaviour's top-K view."""
    gen = batch.generation
    return kernel_terms(
        logits,
        hidden,
        lm_head,
        gen.responses[index],
        gen.mu_topk_ids[index],
        gen.mu_topk_logprobs[index],
        gen.mu_logp[index],
    )


ExactReference = ExactDivergence  # the name the sim's trainer and analysis use


def exact_reference(
    logits: torch.Tensor, batch: RolloutBatch, index: torch.Tensor
) -> ExactReference:
    """The math API's exact KL and ``Ddot`` against the rollout's full behaviour distribution,
    on the valid response tokens (0 on padding).

    A reference for diagnostics only (how often each top-K estimator gets the sign right); masks
    never see it. Needs a rollout collected with ``keep_full=True``.
    """
    gen = batch.generation
    if gen.mu_full_logprobs is None:
        raise ValueError("exact references need a rollout collected with keep_full=True")
    valid = gen.valid[index]
    exact = exact_divergence(
        logits[valid], gen.mu_full_logprobs[index][valid], gen.responses[index][valid]
    )
    return ExactDivergence(kl=framed(exact.kl, valid), ddot=framed(exact.ddot, valid))
