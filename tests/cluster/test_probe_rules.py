"""Each probe of ``pdm cluster check`` on its own, in this process (fast: no Ray).

The probes that need a GPU (driver, GPU count and memory) are tested through their parsing and
decision functions, and through ``read_gpus`` running a stand-in ``nvidia-smi`` that prints what
the real one prints for ``--query-gpu=index,name,memory.total,driver_version --format=csv,
noheader,nounits``. The rows: the H200's memory and driver are the ones ``benchmarks/RESULTS.md``
recorded (143,771 MiB, 580.159.04); H20 (97,871 MiB) and H100 80GB HBM3 (81,559 MiB) are these
GPUs' reported sizes, with an R550 and an R580 driver. None of this ran on a GPU: the driver, GPU
and NCCL probes are GPU-unverified (docs/cluster.md). Every failing probe must name its fix.

The rest runs for real: model folders written by transformers' own ``save_pretrained`` (sharded
and not), disk space, the Hub's API answered by a small HTTP server on loopback, the source
digest of a copied package, the probe modules' imports (the standard library and Ray only).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

from pdmask.backends.verl.node_requirements import MIN_DRIVER, training_nodes
from pdmask.orchestration.cluster import probe
from pdmask.orchestration.cluster import probe_inputs as inputs
from pdmask.orchestration.cluster import probe_training as training
from pdmask.orchestration.cluster.check import ClusterReport, NodeReport
from tests.cluster.model_folder import tiny_model_folder

pytestmark = pytest.mark.processes  # files, subprocesses and servers; no numbers computed

H20_R550 = "".join(f"{i}, NVIDIA H20, 97871, 550.54.15\n" for i in range(8))
H100_R580 = "".join(f"{i}, NVIDIA H100 80GB HBM3, 81559, 580.95.05\n" for i in range(8))
H200_R580 = "".join(f"{i}, NVIDIA H200, 143771, 580.159.04\n" for i in range(8))
NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure "
    "that the latest NVIDIA driver is installed and running.\n"
)


def gpus_of(profile: str) -> dict:
    return training_nodes(profile)["gpus"]


def failed_with_fix(result: dict) -> str:
    assert result["ok"] is False and result["fix"], result
    return result["detail"]


# --- driver and GPUs: nvidia-smi's rows, decided ----------------------------------------------


def test_nvidia_smi_rows_are_read():
    gpus = training.parse_gpus(H200_R580)
    assert len(gpus) == 8
    assert gpus[3] == {
        "index": 3,
        "name": "NVIDIA H200",
        "memory_mib": 143771,
        "driver": "580.159.04",
    }
    with pytest.raises(ValueError, match="not a row"):
        training.parse_gpus(NO_DRIVER)


def test_a_driver_older_than_the_wheels_cuda_fails():
    detail = failed_with_fix(
        training.driver_verdict(training.parse_gpus(H20_R550), "13.0", MIN_DRIVER)
    )
    assert "550.54.15" in detail and "CUDA 13.0" in detail and "580" in detail
    fix = training.driver_verdict(training.parse_gpus(H20_R550), "13.0", MIN_DRIVER)["fix"]
    assert "R580" in fix
    # the same driver runs CUDA 12 builds; R580 runs CUDA 13
    assert training.driver_verdict(training.parse_gpus(H20_R550), "12.8", MIN_DRIVER)["ok"]
    ok = training.driver_verdict(training.parse_gpus(H200_R580), "13.0", MIN_DRIVER)
    assert ok["ok"] and "580.159.04" in ok["detail"]


def test_a_cpu_torch_or_an_unknown_cuda_fails():
    gpus = training.parse_gpus(H200_R580)
    assert "not a CUDA build" in failed_with_fix(training.driver_verdict(gpus, None, MIN_DRIVER))
    assert "CUDA 10.2" in failed_with_fix(training.driver_verdict(gpus, "10.2", MIN_DRIVER))


def test_the_driver_compares_number_by_number():
    assert training.version_key("580.65.06") > training.version_key("580.9.1")
    assert training.version_key("525.60.13") < training.version_key("525.147.05")


@pytest.mark.parametrize(
    "rows,profile", [(H20_R550, "h20x32"), (H100_R580, "h100x16"), (H200_R580, "h200x8")]
)
def test_the_gpus_of_each_profile_pass(rows, profile):
    verdict = training.gpus_verdict(training.parse_gpus(rows), 8, gpus_of(profile))
    assert verdict["ok"], verdict


@pytest.mark.parametrize(
    "rows,ray_gpus,profile,said",
    [
        (H20_R550.splitlines()[0] + "\n", 1, "h20x32", "1 GPU(s) visible"),  # 7 GPUs lost
        (H20_R550, 16, "h20x32", "Ray advertises 16 GPUs, nvidia-smi sees 8"),
        (H20_R550, 4, "h20x32", "Ray advertises 4 GPUs here"),  # --num-gpus 4
        (H100_R580, 8, "h20x32", "below the profile's 96 GB"),  # the wrong --cluster
    ],
)
def test_gpus_short_of_the_profile_fail(rows, ray_gpus, profile, said):
    verdict = training.gpus_verdict(training.parse_gpus(rows), ray_gpus, gpus_of(profile))
    assert said in failed_with_fix(verdict)


def stand_in_smi(folder: Path, out: str, code: int = 0) -> Path:
    """A folder whose ``nvidia-smi`` prints ``out`` and exits ``code`` (the shell's builtins
    only: the folder is all of PATH)."""
    smi = folder / "nvidia-smi"
    quoted = out.replace("'", "'\\''")
    smi.write_text(f"#!/bin/sh\nprintf '%s' '{quoted}'\nexit {code}\n")
    smi.chmod(0o755)
    return folder


def test_nvidia_smi_is_run_and_its_failures_are_findings(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(stand_in_smi(tmp_path, H20_R550)))
    gpus, why = training.read_gpus()
    assert len(gpus) == 8 and why == ""
    # a node whose driver does not answer: nvidia-smi's own words, exit code 9
    monkeypatch.setenv("PATH", str(stand_in_smi(tmp_path, NO_DRIVER, code=9)))
    assert training.read_gpus() == (None, "nvidia-smi failed (exit 9): " + NO_DRIVER.strip())
    assert "exit 9" in failed_with_fix(training.check_gpus(gpus_of("h20x32"), 8))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert "not on this node's PATH" in failed_with_fix(training.check_driver(MIN_DRIVER))
    # not a GPU profile: nothing asked of the node
    assert training.check_driver(None)["ok"] and training.check_gpus(None, 0)["ok"]


def test_this_machines_cpu_torch_fails_the_driver_check(tmp_path, monkeypatch):
    """A node whose torch is a CPU build cannot run the jobs, whatever its driver."""
    monkeypatch.setenv("PATH", str(stand_in_smi(tmp_path, H200_R580)))
    import torch

    if torch.version.cuda is not None:
        pytest.skip("this machine's torch is a CUDA build")
    assert "not a CUDA build" in failed_with_fix(training.check_driver(MIN_DRIVER))


# --- attention --------------------------------------------------------------------------------


def test_the_gpu_attention_is_proven_by_import():
    gpu = training_nodes("h20x32")["attention"]
    assert gpu["implementation"] == "flash_attention_2"
    if importlib.util.find_spec("flash_attn") is not None:
        pytest.skip("flash-attn is installed here")
    detail = failed_with_fix(training.check_attention(gpu))
    assert "No module named 'flash_attn'" in detail and detail.count("flash_attn:") == 1
    assert "[gpu]" in training.check_attention(gpu)["fix"]
    cpu = training.check_attention(training_nodes("this-machine")["attention"])
    assert cpu["ok"] and cpu["detail"].startswith("sdpa: torch ")


# --- Transformer Engine, where a setting trains in FP8 ------------------------------------------


@pytest.fixture
def stand_in_te(tmp_path, monkeypatch):
    """Put a stand-in ``transformer_engine`` first on the path: its ``pytorch`` module's source
    is the argument (a real TE's loads its CUDA extension there); unloaded afterwards."""

    def make(pytorch_source: str) -> None:
        package = tmp_path / "site" / "transformer_engine"
        (package / "pytorch").mkdir(parents=True)
        (package / "__init__.py").write_text('__version__ = "2.9.0+a1b2c3d"\n')
        (package / "pytorch" / "__init__.py").write_text(pytorch_source)
        monkeypatch.syspath_prepend(str(tmp_path / "site"))

    yield make
    for name in [m for m in sys.modules if m.split(".")[0] == "transformer_engine"]:
        del sys.modules[name]


def fp8_need(profile: str) -> dict | None:
    return training_nodes(profile)["fp8_training"]


def test_fp8_training_is_probed_only_where_a_setting_trains_in_fp8():
    assert list(fp8_need("h20x32")["modules"]) == [
        "transformer_engine",
        "transformer_engine.pytorch",
    ]
    for profile in ("h200x8", "this-machine"):  # fp8-e2e trains on FSDP in bf16 there
        assert fp8_need(profile) is None
        assert "not checked" in training.check_fp8_training(fp8_need(profile))["detail"]


def test_a_node_without_transformer_engine_fails_with_the_fix():
    if importlib.util.find_spec("transformer_engine") is not None:
        pytest.skip("Transformer Engine is installed here")
    verdict = training.check_fp8_training(fp8_need("h20x32"))
    detail = failed_with_fix(verdict)
    assert "No module named 'transformer_engine'" in detail
    assert "transformer_engine.pytorch" not in detail  # the same cause, named once
    assert "verl[megatron]==0.9.1" in verdict["fix"] and "torch 2.11.0" in verdict["fix"]


def test_transformer_engine_whose_pytorch_extension_does_not_load_fails(stand_in_te):
    """TE built against another torch imports, and fails where its extension loads."""
    stand_in_te(
        'raise ImportError("transformer_engine_torch.so: undefined symbol: _ZN3c1017RegisterOp")\n'
    )
    detail = failed_with_fix(training.check_fp8_training(fp8_need("h20x32")))
    assert detail.endswith(
        "transformer_engine.pytorch: ImportError: transformer_engine_torch.so: undefined "
        "symbol: _ZN3c1017RegisterOp"
    )


def test_transformer_engine_that_loads_passes_with_its_version(stand_in_te):
    stand_in_te("")
    verdict = training.check_fp8_training(fp8_need("h20x32"))
    assert verdict["ok"], verdict
    assert verdict["detail"] == (
        "FP8 training: transformer_engine 2.9.0+a1b2c3d, transformer_engine.pytorch import"
    )


# --- model folders ----------------------------------------------------------------------------


def test_complete_model_folders_pass(tmp_path):
    single = tiny_model_folder(tmp_path / "single")
    sharded = tiny_model_folder(tmp_path / "sharded", shard="20KB")
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1  # the index names several shards
    assert inputs.model_folder_problems(str(single)) == []
    assert inputs.model_folder_problems(str(sharded)) == []
    assert inputs.check_models(str(tmp_path), [str(single), str(sharded)])["ok"]


def test_incomplete_model_folders_fail_naming_what_is_missing(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert inputs.model_folder_problems(str(empty)) == [
        "no config.json",
        "no tokenizer_config.json",
        "no tokenizer (tokenizer.json, vocab.json + merges.txt, tokenizer.model)",
        "no model.safetensors",
    ]
    sharded = tiny_model_folder(tmp_path / "sharded", shard="20KB")
    shards = sorted(sharded.glob("model-*.safetensors"))
    shards[0].unlink()  # a shard the index names is missing
    with open(shards[1], "r+b") as fh:  # another is cut off, as an interrupted download is
        fh.truncate(shards[1].stat().st_size - 1)
    problems = inputs.model_folder_problems(str(sharded))
    assert problems[0] == f"no {shards[0].name}"
    assert problems[1].startswith(f"{shards[1].name} holds") and "cut-off" in problems[1]
    result = inputs.check_models(str(tmp_path), [str(empty), str(sharded)])
    detail = failed_with_fix(result)
    assert f"{empty}: no config.json" in detail and "hf download" in result["fix"]
    assert "no folder" in failed_with_fix(inputs.check_models(str(tmp_path / "nope"), []))


# --- checkpoint space -------------------------------------------------------------------------


def test_free_space_against_the_plans_need(tmp_path):
    free = shutil.disk_usage(tmp_path).free
    root = str(tmp_path / "not-yet" / "checkpoints")  # created by the jobs: its parent counts
    assert inputs.check_space(root, 1)["ok"]
    assert "the plan writes" in failed_with_fix(inputs.check_space(root, free * 2))
    assert inputs.check_space(root, None)["ok"]  # no need given: not checked
    assert not inputs.check_space(None, 1)["ok"]


def test_what_the_sweep_wrote_already_counts_toward_its_need(tmp_path):
    root = tmp_path / "checkpoints"
    (root / "main-figure" / "abc").mkdir(parents=True)
    written = 1 << 30  # a sparse file: its size counts, it takes no space
    with open(root / "main-figure" / "abc" / "model.pt", "wb") as fh:
        fh.truncate(written)
    free = shutil.disk_usage(tmp_path).free
    # more than is free, less than free + what the sweep wrote (margins far above what other
    # processes write or delete between two calls)
    need = free + written // 2
    assert not inputs.check_space(str(root), need)["ok"]
    ok = inputs.check_space(str(root), need, "main-figure")
    assert ok["ok"] and "written already" in ok["detail"], ok


# --- the Hub ----------------------------------------------------------------------------------


def test_the_hub_answers_for_every_model_or_the_check_fails(hub, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert inputs.check_hub(["Qwen/Qwen3-4B-Base"], hub)["ok"]
    detail = failed_with_fix(inputs.check_hub(["Qwen/Qwen3-4B-Base", "Qwen/Nope"], hub))
    assert "Qwen/Nope (HTTP 404)" in detail and "Qwen3-4B-Base (" not in detail
    closed = hub.rsplit(":", 1)[0] + ":1"
    assert "does not serve" in failed_with_fix(inputs.check_hub(["Qwen/Qwen3-4B-Base"], closed))
    assert "PDM_MODEL_ROOT" in inputs.check_hub(["Qwen/Nope"], hub)["fix"]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert "HF_HUB_OFFLINE" in failed_with_fix(inputs.check_hub(["Qwen/Qwen3-4B-Base"], hub))
    assert inputs.check_hub([], None)["ok"]  # a model root: nothing comes from the Hub


# --- versions ---------------------------------------------------------------------------------


def test_the_source_digest_follows_the_files_not_their_place(tmp_path, monkeypatch):
    package = Path(probe.__file__).parents[2]  # the installed pdmask
    here = probe.source_digest()
    assert here in probe.node_version("pdmask")
    shutil.copytree(package, tmp_path / "pdmask", ignore=shutil.ignore_patterns("*.pyc"))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert probe.package_folder("pdmask") == str(tmp_path / "pdmask")
    assert probe.source_digest() == here  # the same sources elsewhere: the same digest
    with open(tmp_path / "pdmask" / "errors.py", "a") as fh:
        fh.write("# a local edit\n")
    assert probe.source_digest() != here


def test_versions_against_expected_and_across_nodes():
    torch_here = probe.installed("torch")
    assert probe.check_versions({"torch": torch_here})["ok"]
    assert probe.check_versions({"torch": torch_here.split("+")[0]})["ok"]  # any build of it
    wrong = probe.check_versions({"pdmask": "0.1.0 (source 000000000000)", "torch": None})
    detail = failed_with_fix(wrong)
    assert "pdmask 0.1.0 (source" in detail and "(expected: 0.1.0 (source 000000000000))" in detail
    assert wrong["installed"]["torch"] == torch_here  # unpinned: reported for the comparison
    assert not probe.same_version("2.11.0", "2.11.0+cu130") and not probe.same_version(None, "1")
    found = probe.disagreements(
        {
            "node-aaaaaaaa": {"vllm": "0.24.0", "torch": "2.11.0"},
            "node-bbbbbbbb": {"vllm": "0.23.1", "torch": "2.11.0"},
            "head-cccccccc": {},  # not a training node: vllm is not its business
        },
        ["vllm", "torch"],
    )
    assert set(found) == {"node-aaaaaaaa", "node-bbbbbbbb"}
    assert (
        found["node-aaaaaaaa"] == "vllm differs between nodes (node-aaa: 0.24.0, node-bbb: 0.23.1)"
    )


def test_every_failure_reads_with_its_node_check_and_fix():
    node = NodeReport(
        "f" * 32,
        "gpu7",
        "10.0.0.7",
        False,
        {c: {"ok": True, "detail": "fine"} for c in probe.CHECKS}
        | {"driver": training.driver_verdict(training.parse_gpus(H20_R550), "13.0", MIN_DRIVER)},
    )
    (problem,) = ClusterReport("http://head:8265", [node]).problems()
    assert str(problem).startswith("node gpu7 10.0.0.7 ffffffff (worker): driver: driver 550")
    assert str(problem).endswith(
        "Fix: install an NVIDIA driver of the R580 branch or newer on this node"
    )


# --- what the probe may import ----------------------------------------------------------------


def test_the_probe_imports_only_the_standard_library_and_ray_at_its_top():
    """A node without pdmask (or with another) must run the probe: torch is imported inside the
    probes that need it, and the siblings come from the job's folder first."""
    allowed = set(sys.stdlib_module_names) | {Path(f).stem for f in probe.FILES}
    for name in probe.FILES:
        tree = ast.parse((Path(probe.__file__).with_name(name)).read_text())
        for node in tree.body:
            if isinstance(node, ast.Try):  # the siblings' fallback for the package's own import
                node = node.body[0]
            if isinstance(node, ast.Import):
                roots = {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                roots = {(node.module or "").split(".")[0]}
            else:
                continue
            assert roots <= allowed | {"__future__"}, (name, ast.unparse(node))
