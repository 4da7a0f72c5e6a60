"""The training-node probes of ``pdm cluster check`` from every node of a real cluster.

Once per module (``two_node.site``): a two-node Ray cluster on this machine, token
authentication on, every server on loopback, both nodes advertising one logical GPU, so that
both are training nodes (where a job's workers run) and a real MLflow server.

- The CPU profile's spec (``node_requirements.training_nodes("this-machine")``, through
  ``CheckSpec.of`` as ``pdm sweep`` builds it) passes on both nodes: torch's SDPA imports, the
  packages are the submitter's, a complete model folder, the Hub's API (a server on loopback),
  room on the share, and a gloo all-reduce across the two nodes, one rank each, the head's
  address the master's (sum 2).
- The h20x32 spec fails on these CPU nodes, on each node and each probe, with its fix: no
  ``nvidia-smi`` (driver, GPUs), no flash-attn (attention), no Transformer Engine (fp8: the
  profile trains fp8-e2e in FP8), vLLM, torch and flash-attn not the versions pdmask pins
  (versions), and NCCL's all-reduce (a CPU build of torch).

What only a GPU shows (a driver's version, GPU memory, NCCL across hosts) is tested through the
probes' decision functions in ``test_probe_rules.py`` and is GPU-unverified.
"""

from __future__ import annotations

import pytest

from pdmask.backends.verl.jobs_setup import JobSettings
from pdmask.backends.verl.site_inputs import shared_inputs
from pdmask.orchestration.cluster.check import CheckSpec, run_check
from pdmask.orchestration.cluster.probe import CHECKS, TRAINING_CHECKS, installed
from tests.cluster.model_folder import tiny_model_folder
from tests.cluster.two_node import site

pytest.importorskip("verl")
pytestmark = [pytest.mark.verl, pytest.mark.slow, pytest.mark.processes]


@pytest.fixture(scope="module")
def cluster():
    with site(head_gpus=1, worker_gpus=1, open_head=False) as s:
        yield s


def spec_for(cluster_profile: str, site_, tmp_path, **fields) -> CheckSpec:
    """The spec ``pdm sweep`` would build for ``cluster_profile`` (the backend's node inputs),
    with this test's files for the data and the model."""
    data = tmp_path / "train.parquet"
    data.write_bytes(b"PAR1")
    model = tiny_model_folder(tmp_path / "models" / "Qwen3-4B-Base")
    settings = JobSettings(checkpoint_dir=tmp_path / "checkpoints")
    inputs = {
        **shared_inputs(settings, cluster_profile, trials=()),
        "data_files": [str(data)],
        "model_root": str(tmp_path / "models"),
        "model_paths": [str(model)],
    }
    return CheckSpec.of(site_.tracking_uri, inputs, **fields)


def test_a_cpu_profile_check_passes_with_an_all_reduce_across_the_nodes(
    cluster, tmp_path, monkeypatch, hub
):
    monkeypatch.setenv("RAY_AUTH_TOKEN", cluster.token)
    spec = spec_for(
        "this-machine",
        cluster,
        tmp_path,
        checkpoint_need_bytes=1,
        hub_models=("Qwen/Qwen3-4B-Base",),
        hub_endpoint=hub,
    )
    report = run_check(cluster.address, spec)
    assert report.ok, report.problems()
    assert sorted(n.head for n in report.nodes) == [False, True]
    for node in report.nodes:
        assert list(node.checks) == list(CHECKS)
        assert node.checks["allreduce"]["detail"] == "gloo all-reduce across 2 node(s): sum 2"
        assert node.checks["attention"]["detail"].startswith("sdpa: torch ")
        assert "not checked" in node.checks["driver"]["detail"]  # a CPU profile: no GPUs
        assert node.checks["models"]["detail"] == "1 model folder(s) complete"
        assert "serves 1 model(s)" in node.checks["hub"]["detail"]
        assert "the plan writes 1 B" in node.checks["space"]["detail"]


def test_a_gpu_profile_check_fails_on_cpu_nodes_naming_each_probe_and_its_fix(
    cluster, tmp_path, monkeypatch
):
    monkeypatch.setenv("RAY_AUTH_TOKEN", cluster.token)
    report = run_check(cluster.address, spec_for("h20x32", cluster, tmp_path))
    assert len(report.nodes) == 2
    for node in report.nodes:
        assert node.failed() == ["versions", *TRAINING_CHECKS], node.checks
        checks = {c: node.checks[c]["detail"] for c in node.failed()}
        assert "nvidia-smi is not on this node's PATH" in checks["driver"]
        assert "nvidia-smi is not on this node's PATH" in checks["gpus"]
        assert "No module named 'flash_attn'" in checks["attention"]
        assert "No module named 'transformer_engine'" in checks["fp8"]  # fp8-e2e trains in FP8
        for name, pinned in (("vllm", "0.24.0"), ("torch", "2.11.0"), ("flash-attn", "2.8.3")):
            here = installed(name) or "not installed"  # this machine's: a CPU build, or none
            assert f"{name} {here} (expected: {pinned})" in checks["versions"]
        assert checks["allreduce"].startswith("nccl all-reduce, rank ")
        assert "cannot run NCCL" in checks["allreduce"]
        assert "R580" in node.checks["driver"]["fix"]
        assert "[gpu]" in node.checks["attention"]["fix"]
    problems = [str(p) for p in report.problems()]
    assert len(problems) == 2 * (1 + len(TRAINING_CHECKS)) and all("Fix: " in p for p in problems)
