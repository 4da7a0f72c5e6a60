"""No run, tag or job of a VeRL trial calls BF16 training "FP8 end-to-end": ``fp8-e2e`` on verl 0.9.1
is FP8 rollout weights and an FP8 KV cache in vLLM, with BF16 training where the setting trains on
verl's FSDP engine, and everything a trial's run carries says so. Where it trains on the Megatron
engine in FP8 (the paper's profile, ``catalog.training_engine``), the label says FP8 training."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("verl")
pytestmark = pytest.mark.verl

from hydra import compose, initialize_config_module  # noqa: E402

from pdmask.backends.verl.job_spec import job_specs  # noqa: E402
from pdmask.backends.verl.tracking import job_tags  # noqa: E402
from pdmask.errors import ValidationFailed  # noqa: E402
from pdmask.registry import load_registry  # noqa: E402
from pdmask.registry.catalog import PRECISIONS, training_engine  # noqa: E402

FP8_END_TO_END = re.compile(r"FP8[\s-]*end[\s-]*to[\s-]*end", re.IGNORECASE)
BF16_TRAINING = "FP8 rollout + KV cache, BF16 training"


PROFILES = ("h20x32", "h100x16")  # fp8-e2e on Megatron (FP8 training) / on FSDP (BF16)


@pytest.fixture(scope="module")
def verl_jobs():
    """(cluster, sweep, trial, job spec) of every trial every shipped sweep plans for VeRL on
    each profile of ``PROFILES``."""
    reg = load_registry()
    out = []
    for cluster in PROFILES:
        for name, sweep in reg.sweeps.items():
            try:
                trials = reg.expand(name, backend="verl")
            except ValidationFailed:  # a sweep of the embedded backend only (its knobs)
                continue
            specs = job_specs(reg, sweep, trials, cluster=cluster, tracking_uri="http://m:5000")
            out += [(cluster, sweep, t, s) for t, s in zip(trials, specs, strict=True)]
    return out


def test_no_verl_run_description_tag_or_job_calls_bf16_training_fp8_end_to_end(verl_jobs):
    engines = {
        training_engine(t.precision, c) for c, _, t, _ in verl_jobs if t.precision == "fp8-e2e"
    }
    assert engines == {"fsdp", "megatron"}  # both cases in question exist
    for cluster, sweep, trial, job in verl_jobs:
        tags = job.mlflow["tags"]  # what the pre-created run gets
        fp8_training = training_engine(trial.precision, cluster) == "megatron"
        said = [sweep.description, job.precision, *tags.values()]
        if not fp8_training:
            said.append(trial.description())
            assert not FP8_END_TO_END.search(" ".join(said)), (cluster, trial.run_name())
        else:
            assert not FP8_END_TO_END.search(sweep.description), sweep.name
        if trial.precision == "fp8-e2e" and not fp8_training:
            assert tags["pdm.precision_label"] == BF16_TRAINING
            assert f"fp8-e2e ({BF16_TRAINING})" in trial.description()
            assert "BF16" in job.precision and "KV cache" in job.precision
        if trial.precision == "fp8-e2e" and fp8_training:
            assert tags["pdm.precision_label"] == PRECISIONS["fp8-e2e"].megatron_label
            assert "FP8 training" in tags["pdm.precision_label"]
            assert "in FP8 on verl's Megatron engine" in job.precision


@pytest.mark.parametrize("cluster", PROFILES)
def test_the_jobs_own_tags_say_what_it_runs(verl_jobs, cluster):
    """What the running job adds to its run, from its composed config: FP8 weights and KV cache
    in vLLM, BF16 in the FSDP trainer, FP8 in the Megatron one."""
    _, _, trial, job = next(j for j in verl_jobs if j[0] == cluster and j[2].precision == "fp8-e2e")
    megatron = training_engine(trial.precision, cluster) == "megatron"
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        config = compose(config_name="ppo_trainer", overrides=job.overrides)
    tags = job_tags(config)
    assert (tags["pdm.verl.rollout_quantization"], tags["pdm.verl.kv_cache_dtype"]) == (
        "fp8",
        "fp8",
    )
    if megatron:
        assert tags["pdm.verl.training_engine"] == "megatron"
        assert tags["pdm.verl.trainer_dtype"].startswith("fp8-e4m3")
    else:
        assert tags["pdm.verl.trainer_dtype"] == "bfloat16"
        assert not FP8_END_TO_END.search(" ".join(tags.values()))
