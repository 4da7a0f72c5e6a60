"""The job builder: `pdm sweep main-figure --backend verl --dry-run --json` gives a complete VeRL
launch per trial, and verl 0.9.1's own Hydra config composes and validates those overrides."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest

from pdmask.backends.interface import parse_submission_id, submission_id
from pdmask.backends.verl.job_spec import job_specs
from pdmask.backends.verl.jobs import trial_overrides, trial_resources
from pdmask.backends.verl.jobs_setup import JobSettings
from pdmask.errors import ConfigError, ValidationFailed
from pdmask.registry import load_registry
from tests.cluster.conftest import ROOT

pytest.importorskip("verl")
pytestmark = [pytest.mark.verl, pytest.mark.processes]

PLUGIN = "pdmask.backends.verl.plugin"
SEED_KEYS = (
    "data.seed",
    "actor_rollout_ref.rollout.seed",
    "actor_rollout_ref.actor.fsdp_config.seed",
    "actor_rollout_ref.actor.megatron.seed",  # the FP8 end-to-end cells train on Megatron
    "actor_rollout_ref.actor.data_loader_seed",
    "trainer.experiment_name",  # the run name ends with the seed
    "trainer.default_local_dir",  # per trial hash
)


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    env = {
        k: v for k, v in __import__("os").environ.items() if not k.startswith(("PDM_", "MLFLOW_"))
    }
    env.update(PDM_PROJECT=str(ROOT), PDM_HOME=str(home), RAY_AUTH_MODE="disabled")
    cmd = [sys.executable, "-m", "pdmask", "sweep", "main-figure", "--backend", "verl"]
    cmd += ["--cluster", "h20x32", "--dry-run", "--json"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), home


def _kv(overrides: list[str]) -> dict[str, str]:
    return {o.split("=", 1)[0].lstrip("+"): o.split("=", 1)[1] for o in overrides}


def test_dry_run_gives_a_complete_job_per_trial(dry_run):
    plan, home = dry_run
    trials = plan["trials"]
    assert len(trials) == 48 and plan["cluster"] == "h20x32"
    uri = f"sqlite:///{home / 'mlflow.db'}"
    for row in trials:
        job, h = row["job"], row["trial_hash"]
        kv = _kv(job["overrides"])
        assert job["trial_hash"] == h and job["submission_id"] == f"pdm-main-figure-{h}-a1"
        words = shlex.split(job["entrypoint"])
        assert words[:3] == ["python3", "-m", "verl.trainer.main_ppo"]
        assert words[3:] == job["overrides"], "the entrypoint is exactly the overrides, quoted"
        env = job["runtime_env"]["env_vars"]
        assert env["VERL_USE_EXTERNAL_MODULES"] == PLUGIN and env["MLFLOW_TRACKING_URI"] == uri
        assert "MLFLOW_RUN_ID" not in env  # pre-created only at submission, never in a dry run
        assert env["PDM_TRIAL_HASH"] == h and env["PDM_ATTEMPT"] == "1"
        assert job["mlflow"]["tags"]["pdm.trial_hash"] == h
        big = row["model"] == "qwen3-30b-a3b-base"
        res = job["resources"]
        assert (res["nodes"], res["gpus_per_node"], res["gpus"]) == (
            (2, 8, 16) if big else (1, 8, 8)
        )
        assert (kv["trainer.nnodes"], kv["trainer.n_gpus_per_node"]) == (str(res["nodes"]), "8")
        # the paper's setup
        assert kv["algorithm.adv_estimator"] == "grpo"
        assert kv["data.train_files"] == str(home / "data" / "dapo_math_train.parquet")
        assert kv["data.val_files"] == str(home / "data" / "aime_val.parquet")
        assert kv["reward.custom_reward_function.path"] == "pkg://pdmask.backends.verl.rewards"
        assert kv["actor_rollout_ref.rollout.val_kwargs.n"] == "16"
        assert kv["trainer.total_training_steps"] == "300"
        assert kv["data.seed"] == str(row["seed"])
        if row["method"] == "grpo-clip-higher":
            assert (
                kv["actor_rollout_ref.actor.clip_ratio_low"],
                kv["actor_rollout_ref.actor.clip_ratio_high"],
            ) == ("0.2", "0.28")
        else:
            assert kv["actor_rollout_ref.actor.policy_loss.pdm_topk"] == "20"
            assert kv["actor_rollout_ref.actor.policy_loss.pdm_delta"] == "0.15"
        fp8 = row["precision"] != "bf16"
        assert (kv.get("actor_rollout_ref.rollout.quantization") == "fp8") == fp8
    # seeds differ only in their seed-dependent keys: validating one seed validates both
    by_cell: dict[tuple, list[dict]] = {}
    for row in trials:
        by_cell.setdefault((row["method"], row["model"], row["precision"]), []).append(
            _kv(row["job"]["overrides"])
        )
    for first, *others in by_cell.values():
        assert others, "every cell has several seeds"
        for other in others:
            assert {k for k in first if first[k] != other[k]} <= set(SEED_KEYS)


def test_verl_validates_every_method_and_precision(dry_run):
    """verl's Hydra config composes and validates each method x precision (4 x 3 of the 48 specs:
    the other cells differ only in the model, seeds only in seed keys, see above)."""
    from hydra import compose, initialize_config_module
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    from pdmask.backends.verl.checks import config_problems

    plan, home = dry_run
    picked = {}
    for row in plan["trials"]:
        if row["seed"] == 0 and row["model"] != "qwen3-8b-base":
            picked.setdefault((row["method"], row["precision"]), row)
    assert len(picked) == 12
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        for (method, precision), row in picked.items():
            config = compose(config_name="ppo_trainer", overrides=row["job"]["overrides"])
            validate_config(
                config,
                use_reference_policy=need_reference_policy(config),
                use_critic=need_critic(config),
            )
            actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
            rollout = omega_conf_to_dataclass(config.actor_rollout_ref.rollout)
            assert config_problems(config) == [], (method, precision)
            res = row["job"]["resources"]
            assert (config.trainer.nnodes, config.trainer.n_gpus_per_node) == (
                res["nodes"],
                res["gpus_per_node"],
            )
            group = 8 if row["model"] == "qwen3-4b-base" else 16  # the paper's, per model
            assert (
                rollout.n == group and rollout.val_kwargs.n == 16 and rollout.val_kwargs.do_sample
            )
            assert config.reward.custom_reward_function.name == "compute_score"
            assert config.data.train_files == str(home / "data" / "dapo_math_train.parquet")
            assert config.trainer.total_training_steps == 300 and config.data.seed == 0
            assert actor.policy_loss.loss_mode == (
                "vanilla" if method == "grpo-clip-higher" else method.replace("-", "_")
            )
            assert (rollout.quantization == "fp8") == (precision != "bf16")
            # 4B, or the 30B at the TP its expert width allows in block-128 FP8
            tp = {"bf16": 1, "fp8-e2e": 2, "fp8-rollout": 2}[precision]
            assert rollout.tensor_model_parallel_size == tp
            assert config.actor_rollout_ref.nccl_timeout >= 1800


@pytest.fixture(scope="module")
def registry():
    return load_registry(ROOT)


def _trial(registry, method="pdm-agg", model="qwen3-4b-base"):
    trials = registry.expand("main-figure", backend="verl")
    return next(t for t in trials if t.method == method and t.model == model)


def test_submission_ids_round_trip():
    sid = submission_id("main-figure", "0123456789abcdef", 3)
    assert sid == "pdm-main-figure-0123456789abcdef-a3"
    assert parse_submission_id(sid) == ("main-figure", "0123456789abcdef", 3)
    for foreign in ("raysubmit_abc", "pdm-x-0123-a1", "pdm-x-0123456789abcdeZ-a1", ""):
        assert parse_submission_id(foreign) is None


def test_resources_follow_the_cluster_profile(registry):
    big = _trial(registry, model="qwen3-30b-a3b-base")
    assert trial_resources(big, "h20x32") == {
        "nodes": 2,
        "gpus_per_node": 8,
        "gpus": 16,
        "gpu_kind": "H20",
    }
    assert trial_resources(big, "h200x8")["nodes"] == 1
    assert trial_resources(big, "h100x16")["nodes"] == 2


def test_site_settings_replace_generated_overrides(registry):
    sweep = registry.sweep("main-figure")
    settings = JobSettings.from_env(
        {
            "PDM_VERL_OVERRIDES": "data.train_batch_size=512 'trainer.logger=[console]' +x.y=1",
            "PDM_MODEL_ROOT": "/models",
            "PDM_DATA_DIR": "/shared/data",
        }
    )
    kv = _kv(trial_overrides(_trial(registry), sweep, "h20x32", settings))
    assert kv["data.train_batch_size"] == "512" and kv["trainer.logger"] == "[console]"
    assert kv["x.y"] == "1" and kv["actor_rollout_ref.model.path"] == "/models/Qwen3-4B-Base"
    assert kv["data.train_files"] == "/shared/data/dapo_math_train.parquet"
    with pytest.raises(ConfigError, match="PDM_VERL_OVERRIDES"):
        JobSettings.from_env({"PDM_VERL_OVERRIDES": "no-equals-sign"})


def test_recipe_parameters_reach_verl_and_bad_ones_are_all_reported(registry):
    sweep = registry.sweep("main-figure")
    grpo = _trial(registry, method="grpo-clip-higher")
    wider = grpo.model_copy(update={"params": {**grpo.params, "eps_high": 0.3}})
    assert (
        _kv(trial_overrides(wider, sweep, "h20x32"))["actor_rollout_ref.actor.clip_ratio_high"]
        == "0.3"
    )
    capped = _trial(registry).model_copy(
        update={"params": {**_trial(registry).params, "ratio_cap": 5.0}}
    )
    assert (
        _kv(trial_overrides(capped, sweep, "h20x32"))[
            "actor_rollout_ref.actor.policy_loss.pdm_ratio_cap"
        ]
        == "5.0"
    )
    bad_grpo = grpo.model_copy(update={"params": {**grpo.params, "ratio_cap": 5.0}})
    no_delta = _trial(registry, method="dppo-topk-kl").model_copy(
        update={"delta": None, "params": {}}
    )
    with pytest.raises(ValidationFailed) as err:
        job_specs(
            registry, sweep, [bad_grpo, no_delta], cluster="h20x32", tracking_uri="sqlite:///x.db"
        )
    problems = {(p.file.split()[1], p.field) for p in err.value.problems}
    assert problems == {
        (bad_grpo.run_name(), "params.ratio_cap"),
        (no_delta.run_name(), "delta"),
    }


def test_every_job_carries_the_layout_its_engine_rules_derive(dry_run):
    """The 30B FP8 cells get TP 2 (vLLM 0.24.0 refuses 768 / 4 = 192 per rank in block-128 FP8);
    each job states its layout, checkpoint plan and the collective timeout sized to a save."""
    plan, _ = dry_run
    assert plan["disk"]["peak_gb"] > plan["disk"]["finished_gb"] > 0
    for row in plan["trials"]:
        job, kv = row["job"], _kv(row["job"]["overrides"])
        tp = {"qwen3-4b-base": 1, "qwen3-8b-base": 2, "qwen3-30b-a3b-base": 2}[row["model"]]
        assert kv["actor_rollout_ref.rollout.tensor_model_parallel_size"] == str(tp)
        assert job["engine"]["tensor_parallel"] == tp and not job["engine"]["expert_parallel"]
        assert job["engine"]["replicas"] * tp == job["resources"]["gpus"]
        timeout = job["checkpoints"]["collective_timeout_s"]
        assert kv["actor_rollout_ref.nccl_timeout"] == str(timeout) and timeout >= 1800
        assert job["runtime_env"]["env_vars"]["PDM_COLLECTIVE_TIMEOUT_S"] == str(timeout)
        assert row["cost_basis"] == "estimate" and row["step_seconds"] > 0
        assert row["disk_running_gb"] == job["checkpoints"]["running_gb"] > 0


def test_the_dry_run_launches_one_canary_per_setting_first(dry_run):
    plan, _ = dry_run
    setting = {
        r["trial_hash"]: (r["method"], r["model"], r["precision"], r["delta"])
        for r in plan["trials"]
    }
    order = plan["launch_order"]
    canaries = [o["trial_hash"] for o in order if o["canary"]]
    assert len(order) == 48 and len(canaries) == len(set(setting.values())) == 16
    assert [o["canary"] for o in order] == [True] * 16 + [False] * 32  # every canary first
    assert {setting[h] for h in canaries} == set(setting.values())
    seeds = {r["trial_hash"]: r["seed"] for r in plan["trials"]}
    assert {seeds[h] for h in canaries} == {0}  # a setting's first trial in the plan
