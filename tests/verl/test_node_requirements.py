"""Nodes that start: the attention every job asks for, what the GPU extra installs for it, and
verl's own model load where it is missing.

verl 0.9.1 loads the actor with ``flash_attention_2`` unless told otherwise, and the ``gpu``
extra once brought no flash-attn: every trial died at actor start-up. Held here:

- every job says its attention explicitly (an override in its spec, composed by verl's Hydra);
- ``pdmask[gpu]`` brings the package that attention needs, as a wheel built for the torch and
  CUDA vLLM 0.24.0 pins, for each Python a node runs (read from ``pyproject.toml``, checked
  against verl 0.9.1's own pins in its installed metadata);
- verl's exact load (``HFModelConfig`` with the job's ``override_config``, then
  ``from_pretrained`` through verl's model-class lookup) fails on this machine, which has no
  flash-attn, exactly when the cluster check's attention probe fails, and loads when it passes.
"""

from __future__ import annotations

import sys
import tomllib
from dataclasses import asdict
from importlib import metadata
from pathlib import Path

import pytest

pytest.importorskip("verl")
pytestmark = [pytest.mark.verl, pytest.mark.processes]

from packaging.requirements import Requirement  # noqa: E402
from packaging.utils import canonicalize_name, parse_wheel_filename  # noqa: E402

from pdmask.backends.verl.compat import VERL_VERSION  # noqa: E402
from pdmask.backends.verl.job_spec import job_spec  # noqa: E402
from pdmask.backends.verl.node_requirements import (  # noqa: E402
    ATTENTION_KEY,
    CUDA_VERSION,
    FLASH_ATTENTION,
    FLASH_ATTN_VERSION,
    SDPA,
    TORCH_VERSION,
    VLLM_VERSION,
    training_nodes,
)
from pdmask.orchestration.cluster.probe_training import check_attention  # noqa: E402
from pdmask.registry import CLUSTERS, load_registry  # noqa: E402
from tests.cluster.model_folder import tiny_model_folder  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
NODE_PYTHONS = ("3.11", "3.12")  # what a node may run: the project's Pythons with a wheel
LINUX_X86 = {"sys_platform": "linux", "platform_machine": "x86_64"}


def gpu_extra() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(r) for r in project["optional-dependencies"]["gpu"]]


def applying(python: str) -> dict[str, Requirement]:
    """The gpu extra's requirements that apply on a Linux x86-64 node running ``python``."""
    env = {**LINUX_X86, "python_version": python, "python_full_version": f"{python}.0"}
    out = {}
    for req in gpu_extra():
        if req.marker is None or req.marker.evaluate(env):
            name = canonicalize_name(req.name)
            assert name not in out, f"two {name} requirements apply on Python {python}"
            out[name] = req
    return out


@pytest.mark.parametrize("python", NODE_PYTHONS)
def test_the_gpu_extra_brings_flash_attn_built_for_the_pinned_torch_and_cuda(python):
    reqs = applying(python)
    assert str(reqs["vllm"].specifier) == f"=={VLLM_VERSION}"
    assert "verl" in reqs["pdmask"].extras
    wheel = reqs[FLASH_ATTENTION.package]
    name, version, _, tags = parse_wheel_filename(wheel.url.rsplit("/", 1)[1])
    assert name == canonicalize_name(FLASH_ATTENTION.package)
    assert version.public == FLASH_ATTN_VERSION
    torch_minor = ".".join(TORCH_VERSION.split(".")[:2])
    assert version.local == f"cu{CUDA_VERSION.replace('.', '')}torch{torch_minor}"
    cp = "cp" + python.replace(".", "")
    assert {(t.interpreter, t.abi, t.platform) for t in tags} == {(cp, cp, "linux_x86_64")}


def test_the_pins_are_verls_own():
    """verl 0.9.1 pins the same flash-attn for the same torch / CUDA, and the same vLLM and torch
    (its installed metadata: the ``flash-attn-cu130torch211`` and ``vllm`` extras)."""
    assert metadata.version("verl") == VERL_VERSION
    pins: dict[str, dict[str, str]] = {}
    for line in metadata.requires("verl"):
        req = Requirement(line)
        extra = str(req.marker).split('extra == "')[-1].rstrip('"') if req.marker else ""
        pins.setdefault(extra, {})[canonicalize_name(req.name)] = str(req.specifier)
    torch_tag = "torch" + "".join(TORCH_VERSION.split(".")[:2])
    flash_extra = f"flash-attn-cu{CUDA_VERSION.replace('.', '')}{torch_tag}"
    assert pins[flash_extra] == {"flash-attn": f"=={FLASH_ATTN_VERSION}"}
    assert pins["vllm"]["vllm"] == f"=={VLLM_VERSION}"
    assert pins["vllm"]["torch"] == f"=={TORCH_VERSION}"


@pytest.fixture(scope="module")
def registry():
    return load_registry()


@pytest.mark.parametrize("cluster", sorted(CLUSTERS))
def test_every_job_says_its_attention_and_verl_composes_it(registry, cluster):
    from hydra import compose, initialize_config_module

    sweep = "verl-smoke" if CLUSTERS[cluster].device == "cpu" else "main-figure"
    trials = registry.expand(sweep, backend="verl")
    want = (SDPA if CLUSTERS[cluster].device == "cpu" else FLASH_ATTENTION).implementation
    assert training_nodes(cluster)["attention"]["implementation"] == want
    specs = [
        job_spec(t, registry.sweep(sweep), cluster=cluster, tracking_uri="http://t:5000")
        for t in trials
    ]
    for spec in specs:
        assert f"+{ATTENTION_KEY}={want}" in spec.overrides  # in the dry run, as written
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        config = compose(config_name="ppo_trainer", overrides=specs[0].overrides)
    assert config.actor_rollout_ref.model.override_config.attn_implementation == want


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory) -> Path:
    return tiny_model_folder(tmp_path_factory.mktemp("tiny") / "model")


@pytest.mark.parametrize("attention", [FLASH_ATTENTION, SDPA], ids=lambda a: a.implementation)
def test_verls_model_load_fails_exactly_where_the_probe_does(model_folder, attention):
    """verl's own calls, as its FSDP engine makes them (``_build_module``), with the attention
    the job spec asks for: where a module the probe imports is missing, the load raises
    transformers' ImportError, the failure every trial died of."""
    import torch
    from verl.utils.model import get_hf_auto_model_class
    from verl.workers.config import HFModelConfig

    verdict = check_attention(asdict(attention))
    config = HFModelConfig(
        path=str(model_folder), override_config={"attn_implementation": attention.implementation}
    )

    def load():
        return get_hf_auto_model_class(config.hf_config).from_pretrained(
            pretrained_model_name_or_path=config.local_path,
            torch_dtype=torch.float32,
            config=config.hf_config,
            trust_remote_code=False,
        )

    if verdict["ok"]:
        assert load().config._attn_implementation == attention.implementation
    else:
        assert attention is FLASH_ATTENTION and "flash_attn" not in sys.modules
        with pytest.raises(ImportError, match="FlashAttention2 has been toggled on"):
            load()


def test_a_profile_training_on_megatron_in_fp8_needs_its_packages_on_every_training_node():
    """``pdm cluster check`` checks each training node's versions of what the spec lists: where
    fp8-e2e trains on Megatron (the paper's profile), megatron-core, Megatron-Bridge (verl's pin)
    and Transformer Engine; a profile training on FSDP only, none of them."""
    from pdmask.backends.verl.node_requirements import training_nodes

    paper = training_nodes("h20x32")["packages"]
    assert paper["megatron-bridge"] == "0.5.2"
    assert "megatron-core" in paper and "transformer-engine" in paper
    for cluster in ("h200x8", "this-machine"):
        packages = training_nodes(cluster)["packages"]
        assert not {"megatron-core", "megatron-bridge", "transformer-engine"} & set(packages)
