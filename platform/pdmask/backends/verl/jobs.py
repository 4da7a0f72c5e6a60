"""The job builder's planning half: each trial of a sweep as verl's overrides and a layout.

``job_spec.py`` puts them together into the one Ray job a trial is; this module decides what goes
in: verl's Hydra overrides, generated from the registry (the method and its parameters, delta, the
model: path, rollout tensor parallelism, sequence parallelism, offload; the precision, nodes x GPUs
on the cluster profile, the seed, the number of steps, the data and reward, and the paper's setup
for the trial's model, ``jobs_setup.PAPER_SETUPS``), the resources a trial reserves, its rollout
and training layouts, its workload in the cost model's terms and its watchdog's bounds.

Precisions on verl 0.9.1 (``overrides.py`` has the details): ``bf16`` and ``fp8-rollout`` are what
the paper ran; ``fp8-e2e`` is FP8 rollout weights plus an FP8 KV cache, with FP8 training on verl's
Megatron engine where the cluster profile says so (``catalog.training_engine``: the paper's
``h20x32``; ``megatron_job.py``, the spec's ``training``), bf16 FSDP training elsewhere.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from pdmask.backends.verl.jobs_setup import JobSettings, PaperSetup, paper_setup
from pdmask.backends.verl.loss_names import DEFAULT_TOPK
from pdmask.errors import Problem, ValidationFailed
from pdmask.paths import state_dir
from pdmask.registry import CLUSTERS, MODELS, PRECISIONS, Sweep, Trial
from pdmask.registry.catalog import training_engine
from pdmask.registry.cost import Workload, collective_timeout, trial_cost
from pdmask.registry.engine_rules import EngineRefusal, Layout, rollout_layout
from pdmask.registry.plan import DEFAULT_VERL_STEPS

REWARD_MODULE = "pkg://pdmask.backends.verl.rewards"
REWARD_FUNCTION = "compute_score"

_A = "actor_rollout_ref.actor"
_R = "actor_rollout_ref.rollout"
TQ_NODE_RESOURCE = "transfer_queue.backend.SimpleStorage.required_node_resource"


def trial_resources(trial: Trial, cluster: str) -> dict[str, Any]:
    """Nodes x GPUs of one trial on a cluster profile (whole nodes when it needs more than one)."""
    profile = CLUSTERS[cluster]
    need = MODELS[trial.model].gpu_needs.get(profile.gpu_kind)
    if need is None:
        raise ValidationFailed(
            [
                Problem(
                    f"trial {trial.run_name()} ({trial.trial_hash})",
                    "model",
                    f"{trial.model} does not run on {cluster} ({profile.gpu_kind}); models that "
                    f"do: {sorted(m for m, s in MODELS.items() if profile.gpu_kind in s.gpu_needs)}",
                )
            ]
        )
    gpus = need.gpus
    per_node = min(gpus, profile.gpus_per_node)
    nodes = math.ceil(gpus / per_node)
    return {"nodes": nodes, "gpus_per_node": per_node, "gpus": gpus, "gpu_kind": profile.gpu_kind}


# A job's watchdog (watchdog.py) ends it after this long without a finished step or validation:
# a few of the model's steps (the cost model's estimate, a save included), never under ten minutes.
STALL_STEPS = 4
STALL_FLOOR_SECONDS = 600.0
AIME_PROBLEMS_PER_YEAR = 30  # AIME I + II, 15 problems each: the validation prompts per source


def workload(trial: Trial, cluster: str, setup: PaperSetup | None = None) -> Workload:
    """What the trial's job computes and saves, in the cost model's terms."""
    setup = setup or setup_for(cluster, trial.model)
    if on_cpu(cluster):
        val_prompts = 0  # the tiny task's: its cost is the catalog's measured step time
    else:
        from pdmask.backends.verl.data import VAL_DATA_SOURCES

        val_prompts = AIME_PROBLEMS_PER_YEAR * len(VAL_DATA_SOURCES)
    return Workload(
        prompts=setup.train_batch_size,
        group_size=setup.group_size,
        steps=trial.steps or DEFAULT_VERL_STEPS,
        val_prompts=val_prompts,
        val_samples=setup.val_samples,
        test_freq=setup.test_freq,
        save_freq=setup.save_freq,
        checkpoints_kept=setup.checkpoints_kept,
        hf_weights=CLUSTERS[cluster].finished_checkpoint == "hf-weights",
        training_engine=training_engine(trial.precision, cluster),
    )


def layout(trial: Trial, cluster: str, setup: PaperSetup | None = None) -> Layout:
    """The trial's vLLM rollout layout (raises ValidationFailed naming each broken rule)."""
    setup = setup or setup_for(cluster, trial.model)
    try:
        return rollout_layout(
            trial.model,
            trial.precision,
            cluster,
            gpu_memory_utilization=setup.gpu_memory_utilization,
        )
    except EngineRefusal as err:
        where = f"trial {trial.run_name()} ({trial.trial_hash})"
        raise ValidationFailed([Problem(where, "engine rules", str(err))]) from None


def megatron_layout(trial: Trial, cluster: str):
    """The trial's Megatron training layout, or None where its setting trains on FSDP (raises
    ValidationFailed naming each broken rule)."""
    if training_engine(trial.precision, cluster) != "megatron":
        return None
    from pdmask.registry.training_layout import TrainingRefusal, training_layout

    where = f"trial {trial.run_name()} ({trial.trial_hash})"
    if trial.mu_source == "recompute":  # megatron_processor: no vocabulary-parallel top-K yet
        message = "pdm_mu_source=recompute does not run on verl's Megatron engine; use rollout"
        raise ValidationFailed([Problem(where, "mu_source", message)])
    fp8 = PRECISIONS[trial.precision].megatron_fp8
    try:
        return training_layout(trial.model, trial.precision, cluster, fp8=fp8)
    except TrainingRefusal as err:
        raise ValidationFailed([Problem(where, "training layout", str(err))]) from None


def watchdog_bounds(trial: Trial, cluster: str, settings: JobSettings | None = None):
    """The stall and start-up bounds of a trial's job on a cluster profile (the site's
    ``PDM_STALL_SECONDS`` / ``PDM_STARTUP_SECONDS`` win)."""
    from pdmask.watchdog import Bounds

    settings = settings or JobSettings()
    profile = CLUSTERS[cluster]
    load = workload(trial, cluster)
    cost = trial_cost(trial.model, cluster, load)
    one_save = cost.save_seconds / math.ceil(load.steps / load.save_freq)
    return Bounds(
        startup_seconds=settings.startup_seconds or profile.job_startup_seconds,
        stall_seconds=settings.stall_seconds
        or max(STALL_FLOOR_SECONDS, STALL_STEPS * cost.step_seconds + one_save),
    )


def _resource_problems(trial: Trial, cluster: str, res: dict[str, Any]) -> list[Problem]:
    profile = CLUSTERS[cluster]
    where = f"trial {trial.run_name()} ({trial.trial_hash})"
    problems = []
    if res["nodes"] * res["gpus_per_node"] != res["gpus"]:
        problems.append(
            Problem(
                where,
                "resources",
                f"{res['gpus']} GPUs do not fill whole {profile.gpus_per_node}-GPU nodes",
            )
        )
    if res["nodes"] > profile.nodes:
        problems.append(
            Problem(
                where, "--cluster", f"needs {res['nodes']} nodes; {cluster} has {profile.nodes}"
            )
        )
    return problems


def on_cpu(cluster: str) -> bool:
    """True for a cluster profile that runs VeRL on this machine's CPU cores."""
    return CLUSTERS[cluster].device == "cpu"


def _model_path(trial: Trial, settings: JobSettings) -> str:
    if MODELS[trial.model].built_here:  # built before submission (``prepare_local_inputs``)
        from pdmask.backends.verl.tiny_model import built_files

        return str(built_files(trial.model)["model"])
    hub_id = MODELS[trial.model].hub_id
    if settings.model_root:
        return f"{settings.model_root.rstrip('/')}/{hub_id.split('/')[-1]}"
    return hub_id


def checkpoint_root(settings: JobSettings) -> Path:
    """Where the trials' verl checkpoints go: ``<root>/<sweep>/<trial hash>``."""
    return Path(settings.checkpoint_dir or state_dir() / "checkpoints" / "verl")


def _data_files(settings: JobSettings, cluster: str) -> dict[str, Path]:
    if on_cpu(cluster):  # the tiny model's own task (tiny_task), built with it
        from pdmask.backends.verl.tiny_model import built_files

        return built_files()
    from pdmask.backends.verl.data import prepared_files

    return prepared_files(settings.data_dir)


def setup_for(cluster: str, model: str | None = None) -> PaperSetup:
    """The training setup of a model's jobs on a cluster profile: the paper's for that model
    (``jobs_setup.PAPER_SETUPS``), or toy sizes on CPU; ``model`` None: what all models share."""
    if on_cpu(cluster):
        from pdmask.backends.verl.cpu_profile import CPU_SETUP

        return CPU_SETUP
    return paper_setup(model)


def eval_metrics(cluster: str) -> list[str]:
    """The validation metrics a job on ``cluster`` logs, as MLflow stores them: verl's
    ``val-core/<data_source>/acc/mean@<n>`` with ``@`` sanitised."""
    if on_cpu(cluster):
        from pdmask.backends.verl.tiny_task import DATA_SOURCE

        sources = (DATA_SOURCE,)
    else:
        from pdmask.backends.verl.data import VAL_DATA_SOURCES

        sources = VAL_DATA_SOURCES
    n = setup_for(cluster).val_samples
    return [f"val-core/{source}/acc/mean_at_{n}" for source in sources]


def prepare_local_inputs(trials: list[Trial], log=print) -> None:
    """Build what the trials' jobs read that pdmask makes itself (the tiny models and their task),
    before anything is submitted; nothing for the paper's models and data."""
    built_here = sorted({t.model for t in trials if MODELS[t.model].built_here})
    if built_here:
        from pdmask.backends.verl.tiny_model import ensure_built

        for name in built_here:
            ensure_built(name, log=log)


def _trial_extra(
    trial: Trial,
    sweep: Sweep,
    res: dict[str, Any],
    settings: JobSettings,
    setup: PaperSetup,
    cluster: str,
) -> dict[str, Any]:
    """Everything beyond the method: data, reward, setup, model placement, seed, steps."""
    files = _data_files(settings, cluster)
    checkpoints = checkpoint_root(settings)
    seed = trial.seed
    rollout = layout(trial, cluster, setup)
    extra: dict[str, Any] = {
        "data.train_files": str(files["train"]),
        "data.val_files": str(files["val"]),
        "data.train_batch_size": setup.train_batch_size,
        "data.max_prompt_length": setup.max_prompt_length,
        "data.max_response_length": setup.max_response_length,
        "data.filter_overlong_prompts": True,
        "data.truncation": "error",
        "data.seed": seed,
        "reward.custom_reward_function.path": REWARD_MODULE,
        "reward.custom_reward_function.name": REWARD_FUNCTION,
        f"{_R}.n": setup.group_size,
        f"{_R}.tensor_model_parallel_size": rollout.tp,
        f"{_R}.gpu_memory_utilization": setup.gpu_memory_utilization,
        f"{_R}.seed": seed,
        f"{_R}.val_kwargs.n": setup.val_samples,
        f"{_R}.val_kwargs.do_sample": True,
        f"{_R}.val_kwargs.temperature": setup.val_temperature,
        f"{_R}.val_kwargs.top_p": setup.val_top_p,
        f"{_A}.ppo_mini_batch_size": setup.ppo_mini_batch_size,
        f"{_A}.ppo_epochs": setup.ppo_epochs,
        # dynamic batching packs tokens; one sequence must always fit a GPU's budget
        f"{_A}.ppo_max_token_len_per_gpu": 2
        * (setup.max_prompt_length + setup.max_response_length),
        f"{_A}.data_loader_seed": seed,
        f"{_A}.optim.lr": setup.learning_rate,
        f"{_A}.optim.weight_decay": setup.weight_decay,
        f"{_A}.optim.lr_warmup_steps": setup.warmup_steps,
        "trainer.total_training_steps": trial.steps or DEFAULT_VERL_STEPS,
        "trainer.total_epochs": setup.total_epochs,
        "trainer.test_freq": setup.test_freq,
        "trainer.val_before_train": True,
        "trainer.save_freq": setup.save_freq,
        "trainer.max_actor_ckpt_to_keep": setup.checkpoints_kept,
        "trainer.resume_mode": "auto",
        # per trial hash: a retry resumes its own checkpoints, never another trial's
        "trainer.default_local_dir": str(Path(checkpoints) / sweep.name / trial.trial_hash),
        # The transfer queue pins its storage units (actors of one CPU each) round-robin to every
        # alive node, soft=False (TransferQueue's get_node_round_robin_scheduling_strategies): a
        # head started without CPUs, as clusters keep their head free of work, is picked like
        # any node and the job dies "not schedulable". Only nodes with GPUs, where verl's
        # workers run, are eligible (on a CPU profile: the node with the logical GPU).
        f"+{TQ_NODE_RESOURCE}": "GPU",
    }
    extra.update(_actor_engine_keys(trial, cluster, seed, setup.grad_clip))
    extra.update(_engine_and_checkpoint_keys(trial, cluster, rollout))
    if on_cpu(cluster):
        from pdmask.backends.verl.cpu_profile import CPU_OVERRIDES

        extra.update(CPU_OVERRIDES)
    return extra


def _actor_engine_keys(trial: Trial, cluster: str, seed: int, grad_clip) -> dict[str, Any]:
    """The actor's engine keys: FSDP2's (sequence parallelism, offload, seed, gradient clip) or
    Megatron's (``megatron_job``)."""
    training = megatron_layout(trial, cluster)
    if training is not None:
        from pdmask.backends.verl.megatron_job import megatron_keys

        return megatron_keys(trial.model, training, seed, grad_clip)
    model = MODELS[trial.model]
    return {
        f"{_A}.grad_clip": grad_clip,
        f"{_A}.ulysses_sequence_parallel_size": model.ulysses_sp,
        f"{_A}.fsdp_config.param_offload": model.param_offload,
        f"{_A}.fsdp_config.optimizer_offload": model.param_offload,
        f"{_A}.fsdp_config.seed": seed,
    }


def _engine_and_checkpoint_keys(trial: Trial, cluster: str, rollout: Layout) -> dict[str, Any]:
    """Expert parallelism (verl: EP = TP x DP, DP 1), what a save writes, the collective
    timeout sized to a save (``registry/cost.py``)."""
    keys: dict[str, Any] = {}
    if rollout.expert_parallel:
        keys[f"{_R}.expert_parallel_size"] = rollout.tp
    hf_weights = CLUSTERS[cluster].finished_checkpoint == "hf-weights"
    if hf_weights:
        keys[f"{_A}.checkpoint.save_contents"] = ["model", "optimizer", "extra", "hf_model"]
    engine = training_engine(trial.precision, cluster)
    keys["actor_rollout_ref.nccl_timeout"] = collective_timeout(trial.model, hf_weights, engine)
    return keys


def file_recipe_of(trial: Trial, registry=None):
    """The recipe the trial's job carries (its source as planned, never re-read), and problems.

    ``registry`` is unused: the trial carries its recipe (kept for callers that pass it)."""
    from pdmask.backends.verl.file_recipes import FileRecipe

    # What the recipe needs from a backend was checked when the sweep was expanded for VeRL.
    return FileRecipe.of_trial(trial), []


def trial_overrides(
    trial: Trial,
    sweep: Sweep,
    cluster: str,
    settings: JobSettings | None = None,
    setup: PaperSetup | None = None,
    registry=None,
) -> list[str]:
    """verl's Hydra overrides for one trial (raises ValidationFailed naming every problem).

    ``registry``: unused (the trial carries its recipe)."""
    file_recipe, recipe_problems = file_recipe_of(trial, registry)
    return overrides_with_recipe(
        trial, sweep, cluster, settings, setup, file_recipe, recipe_problems
    )


def overrides_with_recipe(
    trial, sweep, cluster, settings, setup, file_recipe, recipe_problems
) -> list[str]:
    """``trial_overrides`` of a trial whose recipe file was read already (and its problems)."""
    settings = settings or JobSettings.from_env()
    setup = setup or setup_for(cluster, trial.model)
    res = trial_resources(trial, cluster)
    problems = _resource_problems(trial, cluster, res) + recipe_problems
    if problems:
        raise ValidationFailed(problems)
    try:
        generated = _generated(trial, sweep, res, settings, setup, file_recipe, cluster)
    except ValidationFailed as err:  # name the trial: a sweep reports all of its trials at once
        where = f"trial {trial.run_name()} ({trial.trial_hash})"
        raise ValidationFailed([Problem(where, p.field, p.message) for p in err.problems]) from None
    # Site overrides are Hydra text already: appended verbatim, replacing generated keys.
    site = settings.extra()
    replaced = {k.lstrip("+") for k in site}
    kept = [o for o in generated if o.split("=", 1)[0].lstrip("+") not in replaced]
    return kept + [f"{k}={v}" for k, v in site.items()]


def _generated(trial, sweep, res, settings, setup, file_recipe, cluster) -> list[str]:
    from pdmask.backends.verl.overrides import verl_overrides

    return verl_overrides(
        trial.method,
        trial.delta,
        model_path=_model_path(trial, settings),
        nnodes=res["nodes"],
        n_gpus_per_node=res["gpus_per_node"],
        precision=trial.precision,
        mu_source=trial.mu_source,
        topk=int(file_recipe.role_value("topk", DEFAULT_TOPK)),
        experiment=sweep.name,
        run_name=trial.run_name(),
        extra=_trial_extra(trial, sweep, res, settings, setup, cluster),
        file_recipe=file_recipe,
        engine=training_engine(trial.precision, cluster),
    )
