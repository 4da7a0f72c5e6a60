"""The h20x32 jobs carry the paper's setup per model (its appendix table, paper.md "The paper's own
setup"), read back from verl's own composed and validated config."""

from __future__ import annotations

import pytest

pytest.importorskip("verl")
pytestmark = pytest.mark.verl

from hydra import compose, initialize_config_module  # noqa: E402
from verl.trainer.ppo.utils import need_critic, need_reference_policy  # noqa: E402
from verl.utils.config import omega_conf_to_dataclass, validate_config  # noqa: E402

from pdmask.backends.verl.checks import config_problems  # noqa: E402
from pdmask.backends.verl.job_spec import job_spec  # noqa: E402
from pdmask.backends.verl.jobs import trial_resources  # noqa: E402
from pdmask.backends.verl.jobs_setup import JobSettings  # noqa: E402
from pdmask.registry import CLUSTERS, MODELS, load_registry  # noqa: E402

# The paper's appendix table: (train batch, group) per model; the rest is shared.
PAPER_BATCH = {
    "qwen3-4b-base": (64, 8),
    "qwen3-8b-base": (128, 16),
    "qwen3-30b-a3b-base": (128, 16),
}
SHARED = dict(lr=1e-6, ppo_epochs=1, prompt=2048, response=8192, mini_batch=16, temperature=1.0)
K = 20
H20 = "h20x32"


def h20_models() -> list[str]:
    return [m for m, spec in MODELS.items() if CLUSTERS[H20].gpu_kind in spec.gpu_needs]


@pytest.fixture(scope="module")
def composed():
    """verl's composed config of a seed-0 trial of main-figure, per (model, method), on h20x32."""
    reg = load_registry()
    sweep = reg.sweep("main-figure")
    trials = reg.expand("main-figure", backend="verl")
    settings = JobSettings.from_env({"PDM_DATA_DIR": "/shared/data"})
    out = {}
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        for model in h20_models():
            for method in ("pdm-agg", "grpo-clip-higher"):
                base = next(t for t in trials if t.method == method and t.seed == 0)
                trial = base.model_copy(update={"model": model, "precision": "bf16"})
                spec = job_spec(trial, sweep, cluster=H20, tracking_uri="x", settings=settings)
                config = compose(config_name="ppo_trainer", overrides=spec.overrides)
                validate_config(
                    config,
                    use_reference_policy=need_reference_policy(config),
                    use_critic=need_critic(config),
                )
                out[model, method] = (trial, config)
    return out


def test_every_h20_model_is_checked(composed):
    assert set(PAPER_BATCH) <= set(h20_models())
    assert {m for m, _ in composed} == set(h20_models())


@pytest.mark.parametrize("model", sorted(PAPER_BATCH))
@pytest.mark.parametrize("method", ["pdm-agg", "grpo-clip-higher"])
def test_the_jobs_carry_the_papers_setup(composed, model, method, carry):
    trial, config = composed[model, method]
    if method != "grpo-clip-higher":
        carry(method, delta=0.15)  # the job's workers see its recipe
    assert config_problems(config) == []
    actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    rollout = omega_conf_to_dataclass(config.actor_rollout_ref.rollout)
    batch, group = PAPER_BATCH[model]
    assert (config.data.train_batch_size, rollout.n) == (batch, group)
    assert actor.ppo_mini_batch_size == SHARED["mini_batch"]  # prompts, as verl counts them
    assert actor.ppo_epochs == SHARED["ppo_epochs"]
    assert actor.optim.lr == SHARED["lr"]
    assert (config.data.max_prompt_length, config.data.max_response_length) == (
        SHARED["prompt"],
        SHARED["response"],
    )
    assert rollout.temperature == SHARED["temperature"]
    # avg@16 on AIME24 and AIME25, sampled
    assert rollout.val_kwargs.n == 16 and rollout.val_kwargs.do_sample
    assert config.data.val_files == "/shared/data/aime_val.parquet"
    if method == "pdm-agg":
        assert actor.policy_loss.pdm_topk == K and rollout.custom == {"pdm_topk": K}
    # the mini-batches divide the step's responses over the trial's GPUs (verl's own check ran)
    gpus = trial_resources(trial, H20)["gpus"]
    assert (batch * group) % (SHARED["mini_batch"] * group) == 0
    assert (SHARED["mini_batch"] * group) % gpus == 0


def test_a_model_the_paper_did_not_train_gets_the_8b_row(composed):
    others = [m for m in h20_models() if m not in PAPER_BATCH]
    assert others, "the catalog has a model beyond the paper's (the tiny Qwen3)"
    for model in others:
        _, config = composed[model, "pdm-agg"]
        assert (config.data.train_batch_size, config.actor_rollout_ref.rollout.n) == (128, 16)
