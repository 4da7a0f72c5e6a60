"""Reach, for one seed, the states a token-level analysis looks at: ``pi`` lagging ``mu`` as in training.

Protocol: train the setting's trial (its recipe's mask, its optimizer) for ``train_steps`` full RL
steps; roll out one more batch from the behaviour copy (FP8/bf16 as the setting says, top-20 view
plus the full distribution kept for exact references); train its minibatches one after the other
with the recipe's mask, exactly as the trainer would. Each of the last ``analysed_minibatches``
minibatches is handed to the analysis just before its update, at the current parameters and with
the optimizer state as training left it; the analysis restores that state when it is done, and the
real update follows.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from pdmask.analysis.config import TokenAnalysisConfig
from pdmask.analysis.setting import TrainingSetting
from pdmask.errors import ConfigError
from pdmask.registry.backends import SIM


@dataclass
class AnalysedState:
    """The trial's live objects (``setup``) and the analysed minibatch's sequence ``index``."""

    setup: object  # pdmask.backends.sim.AnalysisSetup
    index: torch.Tensor
    reward_mean: float  # mean reward of the analysed rollout (how far training has come)
    position: int = 0  # the minibatch's place in the rollout (0 = first; it lags mu by this many)


def guarded_update(setup, mask: torch.Tensor, index: torch.Tensor) -> None:
    """``setup.update`` without its harmless 'tensor that requires grad to scalar' warning."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Converting a tensor with requires_grad")
        setup.update(mask, index)


def minibatch_split(
    size: int, group_size: int, minibatches: int, split: str, generator: torch.Generator
) -> tuple[torch.Tensor, ...]:
    """Sequence indices of each minibatch: shuffled sequences, or shuffled whole groups."""
    if split == "groups":
        groups = torch.randperm(size // group_size, generator=generator)
        order = (groups[:, None] * group_size + torch.arange(group_size)).reshape(-1)
    else:
        order = torch.randperm(size, generator=generator)
    return order.chunk(minibatches)


def analysed_minibatches(
    setting: TrainingSetting, cfg: TokenAnalysisConfig, seed: int
) -> Iterator[AnalysedState]:
    """The last ``cfg.analysed_minibatches`` minibatches of the seed's analysed rollout, each at the
    state just before its update (see the module docstring). The caller must leave the trainer and
    optimizer as it found them before asking for the next one."""
    from pdmask.backends.sim import AnalysisSetup
    from pdmask.backends.sim.backend import sim_config
    from pdmask.backends.sim.grpo import collect_rollout
    from pdmask.backends.sim.trainer import TrialState, rl_step, step_generator
    from pdmask.trust_region import apply_method

    trial = setting.trial(seed)
    sim_cfg = sim_config(trial)
    mask_fn = trial.recipe().method(trial.params)
    state = TrialState(sim_cfg)
    for step in range(1, cfg.train_steps + 1):
        rl_step(state, mask_fn, step)

    budget = sim_cfg.resolved()
    count = cfg.minibatches or budget.minibatches
    if cfg.analysed_minibatches > count:
        raise ConfigError(
            f"--analysed-minibatches {cfg.analysed_minibatches} exceeds the rollout's {count} "
            "minibatches"
        )
    generator = step_generator(seed, cfg.train_steps + 1, "token-analysis")
    state.trainer.train()
    batch = collect_rollout(
        state.behaviour,
        sim_cfg.task_spec,
        prompts=cfg.prompts or budget.prompts_per_step,
        group_size=budget.group_size,
        generator=generator,
        top_k=sim_cfg.top_k,
        keep_full=True,
    )
    setup = AnalysisSetup(
        sim_cfg,
        sim_cfg.task_spec,
        state.trainer,
        state.behaviour,
        state.optimizer,
        batch,
        cfg.train_steps,
    )
    reward_mean = float(batch.rewards.mean())
    minibatches = minibatch_split(batch.size, budget.group_size, count, cfg.split, generator)
    first_analysed = count - cfg.analysed_minibatches
    for position, index in enumerate(minibatches):
        if position >= first_analysed:
            yield AnalysedState(setup, index, reward_mean, position)
        if position == count - 1:
            break  # nothing trains after the last minibatch
        with torch.no_grad():
            logits, hidden = setup.logits_and_hidden(index)
            stats = setup.stats(logits, index, mask_fn.needs, hidden)
        out = apply_method(
            mask_fn, stats, setup.advantages[index], setup.valid[index], backend=SIM.name
        )
        guarded_update(setup, out.mask, index)


def reach_analysis_state(
    setting: TrainingSetting, cfg: TokenAnalysisConfig, seed: int
) -> AnalysedState:
    """The first analysed minibatch's state (the last minibatch when one is analysed)."""
    return next(analysed_minibatches(setting, cfg, seed))
