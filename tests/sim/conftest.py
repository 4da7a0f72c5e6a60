"""Shared fixtures: one base-model cache per test session, smoke-profile configs."""

from __future__ import annotations

import pytest

from pdmask.backends.sim import SimTrialConfig
from pdmask.backends.sim.runtime import single_threaded


@pytest.fixture(scope="session")
def sim_cache(model_cache) -> str:
    """The run's base-model cache (each base model is built once per test run)."""
    return str(model_cache / "sim")


@pytest.fixture(scope="session")
def smoke_config(sim_cache):
    """``smoke_config(**overrides)``: a smoke-profile trial config using the session cache."""

    def make(**overrides) -> SimTrialConfig:
        values = {
            "stand_in": "tiny-4b",
            "precision": "bf16",
            "profile": "smoke",
            "seed": 0,
            "delta": 0.15,
            "cache_dir": sim_cache,
        }
        values.update(overrides)
        return SimTrialConfig(**values)

    return make


@pytest.fixture(scope="session")
def learned_base_config(sim_cache):
    """Smoke-sized RL (2 steps) from the real tiny-4b base model: low but non-zero accuracy, so
    there is a learning signal. Its warm start runs once per session (about 25 s on one core)."""

    def make(**overrides) -> SimTrialConfig:
        values = {
            "stand_in": "tiny-4b",
            "precision": "fp8-rollout",
            "profile": "smoke",
            "base_model": "stand-in",
            "seed": 0,
            "delta": 0.15,
            "steps": 2,
            "cache_dir": sim_cache,
        }
        values.update(overrides)
        return SimTrialConfig(**values)

    return make


@pytest.fixture(autouse=True)
def _one_thread():
    """These models are tiny: a second intra-op thread only contends on a busy 2-core machine."""
    with single_threaded():
        yield
