"""What every VeRL job of a sweep shares: the paper's training setup and the site's settings.

``PaperSetup`` holds the experiment's hyperparameters. Where ``paper.md`` gives a value it is
used: GRPO advantages, DAPO-Math-17k for training, AIME24 + AIME25 for evaluation with 16 samples
per problem (avg@16), K = 20, clip-higher 0.2 / 0.28 (the ``grpo-clip-higher`` recipe's own
defaults). The paper does not give batch sizes, lengths or the optimizer's settings; those fields
are documented defaults taken from verl's DAPO recipe, scaled to the paper's 32-GPU cluster.
Change any of them for a site with ``PDM_VERL_OVERRIDES`` (below), which replaces generated
overrides of the same key.

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
    """The training and evaluation setup of every VeRL trial (defaults documented per field)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    train_batch_size: int = Field(
        256,
        description="Prompts per RL step (verl `data.train_batch_size`). Default: DAPO's 512 "
        "halved for 32 GPUs; not given by the paper.",
    )
    group_size: int = Field(
        16,
        description="Responses per prompt, the GRPO group (`actor_rollout_ref.rollout.n`). "
        "DAPO's value; not given by the paper.",
    )
    ppo_mini_batch_size: int = Field(
        32,
        description="Prompts per optimizer step. train_batch_size / ppo_mini_batch_size = 8 "
        "updates per rollout batch: the staleness that makes mu differ from pi (paper, Setting).",
    )
    max_prompt_length: int = Field(2048, description="Prompt tokens (DAPO's value).")
    max_response_length: int = Field(
        8192,
        description="Generated tokens per response: a cost choice (DAPO used 20480 for its 32B "
        "model). Not given by the paper.",
    )
    learning_rate: float = Field(1e-6, description="AdamW learning rate (DAPO's value).")
    weight_decay: float = Field(0.1, description="AdamW weight decay (DAPO's value).")
    warmup_steps: int = Field(10, description="Linear learning-rate warm-up steps (DAPO's value).")
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
