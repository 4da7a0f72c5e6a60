"""A trial's mutable state (trainer, behaviour copy, optimizer, step) and its random streams.

Fresh trials start from the stand-in's cached base model; a checkpoint in the workdir restores
everything, including the behaviour copy's weights exactly as they were served.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import torch

from pdmask.backends.sim.checkpoint import load_checkpoint, restore_rng_states, save_checkpoint
from pdmask.backends.sim.config import SimTrialConfig
from pdmask.backends.sim.grpo import RolloutBatch, collect_rollout
from pdmask.backends.sim.model import TinyDecoder
from pdmask.backends.sim.precision import configure_trainer, make_behaviour, sync_behaviour
from pdmask.backends.sim.warmstart import load_base_model, prepare_base_model


def step_generator(seed: int, step: int, purpose: str) -> torch.Generator:
    """A generator for one purpose at one step, independent of everything that ran before."""
    digest = hashlib.sha256(f"{seed}/{step}/{purpose}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)


class TrialState:
    """Trainer, behaviour copy and optimizer of a trial, fresh from the base model or resumed."""

    def __init__(self, cfg: SimTrialConfig):
        self.cfg = cfg
        budget = cfg.resolved()
        base = prepare_base_model(
            cfg.stand_in,
            cache_dir=cfg.cache_dir,
            quick=budget.base_model == "quick",
            task=cfg.task_spec,
        )
        torch.manual_seed(cfg.seed)
        self.trainer: TinyDecoder = configure_trainer(
            load_base_model(base, cfg.stand_in_spec, cfg.task_spec), cfg.precision
        )
        self.behaviour = make_behaviour(self.trainer, cfg.precision)
        sync_behaviour(self.trainer, self.behaviour, cfg.precision, cfg.fp8_scaling)
        if cfg.train_layers == "output":  # the lm-head-only control (SimKnobs.train_layers)
            for name, param in self.trainer.named_parameters():
                param.requires_grad_(name.startswith("lm_head."))
        trainable = [p for p in self.trainer.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(trainable, lr=budget.lr, weight_decay=cfg.weight_decay)
        self.step = 0
        self.base_accuracy: float | None = None
        self.last_metrics: dict[str, float] = {}

    def rollout(self, generator: torch.Generator) -> RolloutBatch:
        """One step's rollout by the behaviour copy (full behaviour distribution kept)."""
        budget = self.cfg.resolved()
        return collect_rollout(
            self.behaviour,
            self.cfg.task_spec,
            prompts=budget.prompts_per_step,
            group_size=budget.group_size,
            generator=generator,
            top_k=self.cfg.top_k,
            keep_full=True,
        )

    def identity(self) -> dict:
        # A knob at its default stays out, so checkpoints written before the knob existed resume.
        defaults = {"train_layers"} if self.cfg.train_layers == "all" else set()
        return self.cfg.model_dump(exclude={"cache_dir", *defaults})

    def models(self) -> dict:
        return {"trainer": self.trainer, "behaviour": self.behaviour, "optimizer": self.optimizer}

    def save(self, workdir: Path) -> None:
        save_checkpoint(
            workdir,
            step=self.step,
            identity=self.identity(),
            models=self.models(),
            base_accuracy=self.base_accuracy,
            last_metrics=self.last_metrics,
        )

    def resume(self, workdir: Path, note: Callable[[str], None] | None = None) -> bool:
        """Restore the newest readable checkpoint in ``workdir`` (False: none, start fresh);
        ``note`` (default: stderr) hears of any checkpoint found unreadable and moved aside."""
        payload = load_checkpoint(workdir, self.identity(), note)
        if payload is None:
            return False
        for name, obj in self.models().items():
            obj.load_state_dict(payload["state"][name])
        restore_rng_states(payload["rng"])
        self.step = payload["step"]
        self.base_accuracy = payload["base_accuracy"]
        self.last_metrics = payload["last_metrics"]
        return True
