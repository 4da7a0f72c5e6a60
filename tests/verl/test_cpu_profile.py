"""VeRL on CPU, the parts that need no training: profile, job specs, platform, packaging.

The end-to-end runs are in ``tests/verl_cpu`` (minutes each); these take seconds and run with
the ``verl`` extra alone (no vLLM).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import zipfile

import pytest

pytest.importorskip("verl")
pytestmark = [pytest.mark.verl, pytest.mark.slow, pytest.mark.processes]

from hydra import compose, initialize_config_module  # noqa: E402
from omegaconf import open_dict  # noqa: E402

from pdmask.backends.verl.checks import check_job_config, config_problems  # noqa: E402
from pdmask.backends.verl.cpu_profile import CPU_ENV, CPU_OVERRIDES  # noqa: E402
from pdmask.backends.verl.cpu_setup import alias_version, build_alias_wheel  # noqa: E402
from pdmask.backends.verl.file_recipes import ENV_VAR  # noqa: E402
from pdmask.backends.verl.job_spec import job_spec  # noqa: E402
from pdmask.errors import ValidationFailed  # noqa: E402
from pdmask.registry import load_registry  # noqa: E402

from .test_overrides import _validated  # noqa: E402


@pytest.fixture(scope="module")
def registry():
    return load_registry()


def _spec(registry, sweep_name: str, cluster: str, **match):
    trials = registry.expand(sweep_name, backend="verl")
    trial = next(t for t in trials if all(getattr(t, k) == v for k, v in match.items()))
    return job_spec(
        trial, registry.sweep(sweep_name), cluster=cluster, tracking_uri="sqlite:///x.db"
    )


def _overrides(spec) -> dict[str, str]:
    return dict(o.split("=", 1) for o in spec.overrides)


def test_cpu_jobs_compose_validate_and_pass_the_startup_checks(registry, carried):
    """Each verl-smoke job is accepted by verl 0.9.1's own config code as generated."""
    trials = registry.expand("verl-smoke", backend="verl")
    assert {(t.method, t.mu_source) for t in trials} == {
        ("dppo-topk-kl", "rollout"),
        ("pdm-agg", "rollout"),
        ("pdm-agg", "recompute"),
    }
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        for trial in trials:
            spec = job_spec(
                trial, registry.sweep("verl-smoke"), cluster="this-machine", tracking_uri="x"
            )
            assert spec.runtime_env["env_vars"].items() >= CPU_ENV.items()
            carried(spec.runtime_env["env_vars"][ENV_VAR])  # what the job's workers see
            config = compose(config_name="ppo_trainer", overrides=spec.overrides)
            _validated(config)
            assert config_problems(config) == []
            assert config.trainer.device == "cpu"
            assert config.actor_rollout_ref.rollout.enable_sleep_mode is False


def test_gpu_cluster_jobs_are_untouched_by_the_cpu_profile(registry):
    spec = _spec(registry, "main-figure", "h20x32", method="pdm-agg", model="qwen3-4b-base")
    overrides = _overrides(spec)
    from pdmask.backends.verl.overrides import _value

    cpu_settings = {(k.lstrip("+"), _value(v)) for k, v in CPU_OVERRIDES.items()}
    assert not cpu_settings & {(k.lstrip("+"), v) for k, v in overrides.items()}
    assert "trainer.device" not in overrides
    assert not CPU_ENV.keys() & spec.runtime_env["env_vars"].keys()
    assert overrides["actor_rollout_ref.model.use_remove_padding"] == "True"
    assert overrides["data.train_batch_size"] == "64"  # the paper's, for 4B


def test_a_paper_model_is_refused_on_the_cpu_profile(registry):
    trial = next(t for t in registry.expand("smoke", backend="verl"))
    with pytest.raises(ValidationFailed) as err:
        job_spec(trial, registry.sweep("smoke"), cluster="this-machine", tracking_uri="x")
    assert "qwen3-tiny" in str(err.value) and "this-machine" in str(err.value)


def test_startup_checks_refuse_truncation_and_a_low_logprob_cap(registry, carried):
    spec = _spec(registry, "verl-smoke", "this-machine", method="pdm-agg", mu_source="rollout")
    carried(spec.runtime_env["env_vars"][ENV_VAR])
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        config = compose(config_name="ppo_trainer", overrides=spec.overrides)
    with open_dict(config):
        config.actor_rollout_ref.rollout.top_p = 0.95
        config.actor_rollout_ref.rollout.top_k = 5
        config.actor_rollout_ref.rollout.engine_kwargs.vllm.max_logprobs = 19  # K = 20
    with pytest.raises(ValidationFailed) as err:
        check_job_config(config)
    assert {p.field for p in err.value.problems} == {
        "actor_rollout_ref.rollout.top_p",
        "actor_rollout_ref.rollout.top_k",
        "actor_rollout_ref.rollout.engine_kwargs.vllm.max_logprobs",
    }


PLATFORM_PROBE = """
import json, verl
from omegaconf import OmegaConf
from verl.plugin.platform import PlatformRegistry, get_platform
from verl.utils.device import auto_set_device, get_device_id, get_torch_device
p = get_platform()
config = OmegaConf.create({"trainer": {"device": "cpu"}})
auto_set_device(config)
module = get_torch_device()
print(json.dumps({
    "registered": "pdmask-cpu" in PlatformRegistry.registered_names(),
    "device": p.device_name, "backend": p.communication_backend_name(),
    "ray": p.ray_resource_name(), "ipc": p.is_ipc_supported(),
    "trainer_device": config.trainer.device, "device_id": str(get_device_id()),
    "memory": module.memory_reserved(), "free_total": list(module.mem_get_info()),
    "rng": int(module.get_rng_state().numel()),
}))
"""


PLAIN_PROBE = """
import json, verl
from verl.plugin.platform import PlatformRegistry, get_platform
print(json.dumps({"registered": "pdmask-cpu" in PlatformRegistry.registered_names(),
                  "device": get_platform().device_name}))
"""


def _probe(env_extra: dict, probe: str = PLATFORM_PROBE) -> dict:
    import os

    env = {k: v for k, v in os.environ.items() if k != "VERL_PLATFORM"}
    env.update(env_extra)
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_cpu_platform_is_verls_platform_only_when_selected():
    """A fresh process with the job's environment: verl keeps trainer.device=cpu, gloo, logical
    GPUs for Ray, torch.device('cpu') as the current device, memory stats that do not raise."""
    got = _probe(CPU_ENV)
    assert got["registered"] and got["device"] == "cpu" and got["trainer_device"] == "cpu"
    assert got["backend"] == "gloo" and got["ray"] == "GPU" and got["ipc"] is False
    assert got["device_id"] == "cpu" and got["memory"] == 0 and got["rng"] > 0
    free, total = got["free_total"]
    assert 0 < free <= total


def test_without_the_profile_verl_never_sees_the_cpu_platform():
    got = _probe({}, PLAIN_PROBE)
    assert not got["registered"] and got["device"] != "cpu"  # verl's own detection


def test_vllm_alias_wheel_is_metadata_only(tmp_path):
    """The alias verl looks up by name: version with the +cpu label, no files besides metadata."""
    assert alias_version("0.31.0") == "0.31.0+cpu" == alias_version("0.31.0+cpu")
    wheel = build_alias_wheel("0.31.0+cpu", tmp_path)
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        metadata = zf.read("vllm-0.31.0+cpu.dist-info/METADATA").decode()
    assert all(n.startswith("vllm-0.31.0+cpu.dist-info/") for n in names), names
    assert "Name: vllm\n" in metadata and "Version: 0.31.0+cpu\n" in metadata
    target = tmp_path / "site"
    cmd = f"{shlex.quote(sys.executable)} -m pip install -q --no-deps --no-index --target {target}"
    subprocess.run([*shlex.split(cmd), str(wheel)], check=True, timeout=300)
    done = subprocess.run(
        [sys.executable, "-c", "import importlib.metadata as m; print(m.version('vllm'))"],
        env={"PYTHONPATH": str(target), "PATH": ""},
        capture_output=True,
        text=True,
    )
    assert done.stdout.strip() == "0.31.0+cpu"
    assert sorted(p.name for p in target.iterdir()) == ["vllm-0.31.0+cpu.dist-info"]
