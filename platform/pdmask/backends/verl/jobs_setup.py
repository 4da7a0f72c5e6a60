"""What every VeRL job of a sweep shares: the paper's training setup and the site's settings.

``PaperSetup`` holds the experiment's hyperparameters, per model (:data:`PAPER_SETUPS`), from the
paper's appendix table (arXiv 2607.10848; ``paper.md``, "The paper's own setup"): learning rate
1e-6, one PPO epoch, prompt/response 2,048/8,192 tokens, mini-batch 16, train batch x group
64 x 8 for Qwen3-4B-Base and 128 x 16 for Qwen3-8B-Base and Qwen3-30B-A3B-Base, evaluation avg@16
on AIME24 and AIME25. The rest of the paper's table lives where it applies to every job: rollout
temperature 1.0 (``overrides.verl_overrides``, which the start-up checks hold), K = 20 (the
recipes' ``topk``), GRPO advantages. What the paper does not give (weight decay, warm-up, the
evaluation's top-p, checkpoint cadence) is a documented default per field, from verl's DAPO
recipe. A model the paper did not train gets the 8B/30B setup. Change any of it for a site with
``PDM_VERL_OVERRIDES`` (below), which replaces generated overrides of the same key.

``JobSettings`` says where things are on the cluster. It is read from environment variables of
the submitting shell, because these are facts about a site, not about a trial: they never enter a
trial's identity hash.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from pdmask.errors import ConfigError
from pdmask.watchdog import site_bounds


class PaperSetup(BaseModel):
    """The training and evaluation setup of a VeRL trial (defaults: the paper's 8B/30B row)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    train_batch_size: int = Field(
        128,
        description="Prompts per RL step (verl `data.train_batch_size`): the paper's 128 for 8B "
        "and 30B-A3B, 64 for 4B.",
    )
    group_size: int = Field(
        16,
        description="Responses per prompt, the GRPO group (`actor_rollout_ref.rollout.n`): the "
        "paper's 16 for 8B and 30B-A3B, 8 for 4B.",
    )
    ppo_mini_batch_size: int = Field(
        16,
        description="Prompts per optimizer step (verl counts prompts, each with its group): the "
        "paper's mini-batch 16. train_batch_size / ppo_mini_batch_size updates per rollout batch "
        "(8 for 8B/30B, 4 for 4B): the staleness that makes mu differ from pi (paper, Setting).",
    )
    ppo_epochs: int = Field(1, description="Passes over each rollout batch (the paper's 1).")
    max_prompt_length: int = Field(2048, description="Prompt tokens (the paper's 2,048).")
    max_response_length: int = Field(
        8192, description="Generated tokens per response (the paper's 8,192)."
    )
    learning_rate: float = Field(1e-6, description="AdamW learning rate (the paper's 1e-6).")
    weight_decay: float = Field(
        0.1, description="AdamW weight decay (DAPO's value; not given by the paper)."
    )
    warmup_steps: int = Field(
        10, description="Linear learning-rate warm-up steps (DAPO's value; not given by the paper)."
    )
    grad_clip: float = Field(1.0, description="Gradient-norm clip (verl's default).")
    val_samples: int = Field(
        16,
        description="Samples per AIME problem at evaluation: the paper's avg@16, logged by "
        "verl as `val-core/<aime24|aime25>/acc/mean@16` (MLflow: `mean_at_16`).",
    )
    val_temperature: float = Field(1.0, description="Evaluation sampling temperature (DAPO).")
    val_top_p: float = Field(0.7, description="Evaluation nucleus top-p (DAPO's evaluation).")
    test_freq: int = Field(10, description="Evaluate every this many steps (and before training).")
    save_freq: int = Field(
        20, description="Checkpoint every this many steps: a retried job resumes from the latest."
    )
    checkpoints_kept: int = Field(2, description="Actor checkpoints kept per trial (disk).")
    gpu_memory_utilization: float = Field(
        0.6, description="Share of GPU memory vLLM may take for weights and KV cache."
    )
    total_epochs: int = Field(
        1000, description="Upper bound on data epochs; a trial stops at its `steps` first."
    )


PAPER_SETUPS: dict[str, PaperSetup] = {
    "qwen3-4b-base": PaperSetup(train_batch_size=64, group_size=8),
    "qwen3-8b-base": PaperSetup(),
    "qwen3-30b-a3b-base": PaperSetup(),
}
"""The paper's setup per registry model (its appendix table); see the module docstring."""


def paper_setup(model: str | None) -> PaperSetup:
    """The paper's setup of ``model``; the 8B/30B row for a model the paper did not train (and
    for None: what every model shares, e.g. the evaluation)."""
    return PAPER_SETUPS.get(model, PaperSetup()) if model else PaperSetup()


class JobSettings(BaseModel):
    """Site settings of cluster jobs, from environment variables of the submitting shell."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    data_dir: Path | None = Field(
        None,
        description="PDM_DATA_DIR: folder holding `pdm data prepare`'s parquet files, at a "
        "path every node can read (default: the state folder's `data/`, i.e. a shared filesystem).",
    )
    checkpoint_dir: Path | None = Field(
        None,
        description="PDM_VERL_CHECKPOINT_DIR: root of the trials' checkpoints, on storage "
        "every node can write (default: the state folder's `checkpoints/verl/`).",
    )
    model_root: str | None = Field(
        None,
        description="PDM_MODEL_ROOT: folder with the models pre-downloaded under their Hugging "
        "Face names (e.g. `<root>/Qwen3-4B-Base`); unset: nodes load `Qwen/...` from the Hub.",
    )
    entrypoint: str = Field(
        "python3 -m verl.trainer.main_ppo",
        description="PDM_VERL_ENTRYPOINT: the command the overrides are appended to (a wrapper "
        "script on the cluster, or a stand-in trainer in tests).",
    )
    stall_seconds: float | None = Field(
        None,
        gt=0,
        description="PDM_STALL_SECONDS (shared with the Tune trials: pdmask/watchdog.py): a job's "
        "watchdog ends it after this long without a finished step or validation (default: four "
        "of the model's estimated steps, at least 600).",
    )
    startup_seconds: float | None = Field(
        None,
        gt=0,
        description="PDM_STARTUP_SECONDS: how long a job may run before its first finished "
        "step or validation (default: the cluster profile's `job_startup_seconds`).",
    )
    extra_overrides: tuple[str, ...] = Field(
        (),
        description="PDM_VERL_OVERRIDES: extra `key=value` Hydra overrides, shell-quoted and "
        "space-separated; each replaces a generated override of the same key.",
    )

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> JobSettings:
        env = os.environ if env is None else env
        raw = env.get("PDM_VERL_OVERRIDES", "")
        try:
            extra = tuple(shlex.split(raw))
        except ValueError as err:
            raise ConfigError(f"PDM_VERL_OVERRIDES: cannot split {raw!r}: {err}") from None
        bad = [o for o in extra if "=" not in o]
        if bad:
            raise ConfigError(f"PDM_VERL_OVERRIDES: not key=value: {', '.join(bad)}")
        stall, startup = site_bounds(env)
        return cls(
            data_dir=env.get("PDM_DATA_DIR") or None,
            checkpoint_dir=env.get("PDM_VERL_CHECKPOINT_DIR") or None,
            model_root=env.get("PDM_MODEL_ROOT") or None,
            entrypoint=env.get("PDM_VERL_ENTRYPOINT") or cls.model_fields["entrypoint"].default,
            stall_seconds=stall,
            startup_seconds=startup,
            extra_overrides=extra,
        )

    def extra(self) -> dict[str, str]:
        """The extra overrides as ``{key: value}`` (the value kept as Hydra text)."""
        return dict(o.split("=", 1) for o in self.extra_overrides)
