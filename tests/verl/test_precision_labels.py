"""No run, tag or job of a VeRL trial calls BF16 training "FP8 end-to-end": ``fp8-e2e`` on verl 0.9.1
is FP8 rollout weights and an FP8 KV cache in vLLM, with BF16 training (FSDP), and everything a
trial's run carries says so."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("verl")
pytestmark = pytest.mark.verl

from hydra import compose, initialize_config_module  # noqa: E402

from pdmask.backends.verl.jobs import job_specs  # noqa: E402
from pdmask.backends.verl.tracking import job_tags  # noqa: E402
from pdmask.errors import ValidationFailed  # noqa: E402
from pdmask.registry import load_registry  # noqa: E402

FP8_END_TO_END = re.compile(r"FP8[\s-]*end[\s-]*to[\s-]*end", re.IGNORECASE)
BF16_TRAINING = "FP8 rollout + KV cache, BF16 training"


@pytest.fixture(scope="module")
def verl_jobs():
    """(sweep, trial, job spec) of every trial every shipped sweep plans for VeRL on h20x32."""
    reg = load_registry()
    out = []
    for name, sweep in reg.sweeps.items():
        try:
            trials = reg.expand(name, backend="verl")
        except ValidationFailed:  # a sweep of the embedded backend only (its knobs)
            continue
        specs = job_specs(reg, sweep, trials, cluster="h20x32", tracking_uri="http://mlflow:5000")
        out += [(sweep, t, s) for t, s in zip(trials, specs, strict=True)]
    return out


def test_no_verl_run_description_tag_or_job_calls_bf16_training_fp8_end_to_end(verl_jobs):
    assert any(t.precision == "fp8-e2e" for _, t, _ in verl_jobs)  # the case in question exists
    for sweep, trial, job in verl_jobs:
        tags = job["mlflow"]["tags"]  # what the pre-created run gets
        said = [sweep.description, trial.description(), job["precision"], *tags.values()]
        assert not FP8_END_TO_END.search(" ".join(said)), trial.run_name()
        if trial.precision == "fp8-e2e":
            assert tags["pdm.precision_label"] == BF16_TRAINING
            assert f"fp8-e2e ({BF16_TRAINING})" in trial.description()
            assert "BF16" in job["precision"] and "KV cache" in job["precision"]


def test_the_jobs_own_tags_say_what_it_runs(verl_jobs):
    """What the running job adds to its run, from its composed config: FP8 weights and KV cache
    in vLLM, BF16 in the trainer."""
    _, trial, job = next((s, t, j) for s, t, j in verl_jobs if t.precision == "fp8-e2e")
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        config = compose(config_name="ppo_trainer", overrides=job["overrides"])
    tags = job_tags(config)
    assert (tags["pdm.verl.rollout_quantization"], tags["pdm.verl.kv_cache_dtype"]) == (
        "fp8",
        "fp8",
    )
    assert tags["pdm.verl.trainer_dtype"] == "bfloat16"
    assert not FP8_END_TO_END.search(" ".join(tags.values()))
