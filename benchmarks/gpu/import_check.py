"""Import every module the GPU check uses and print one JSON line: did they all import, and from what.

On the lent GPU machine, after installing the wheels prepared by ``benchmarks/gpu/prepare.py``::

    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
    PYTHONPATH=/tmp/site python3 benchmarks/gpu/import_check.py

prints ``{"part": "imports", "ok": ..., "standins": [...], "versions": {...}, "errors": [...]}``
and exits 0 if every module imported, 1 if not. pdmask comes from this checkout (``platform/``,
put on the path here as ``gpu_check.py`` does). ``standins`` names the packages replaced by a
stand-in of ``benchmarks/gpu/standins`` (ray: its wheel is too big to travel); ``versions`` gives
the installed version of each package of ``wheels.txt`` and of the machine's own packages that the
closure loads, so the output shows that what was tested here is what runs there.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for _path in (HERE.parents[1] / "platform", HERE):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from standin_path import use_standins_if_missing  # noqa: E402

# What benchmarks/gpu_check.py imports, and the loss path verl's actor worker runs with pdmask.
MODULES = [
    "tensordict",
    "verl.utils.torch_functional",
    "verl.utils.tensordict_utils",
    "verl.utils.fsdp_utils",
    "verl.trainer.ppo.core_algos",
    "verl.workers.config",
    "verl.workers.engine",
    "verl.workers.engine.fsdp.transformer_impl",
    "pdmask.registry",
    "pdmask.trust_region",
    "pdmask.backends.verl.layout",
    "pdmask.backends.verl.processor",
    "pdmask.backends.verl.plugin",
    "pdmask.backends.verl.config",
    "pdmask.backends.verl.loss",
    # parts (e) and (f): the pass on vocabulary shards, Megatron-Core's groups, the Megatron hook
    "pdmask.trust_region.vocab_parallel",
    "megatron.core.parallel_state",
    "verl.models.mcore.util",
    "pdmask.backends.verl.megatron_processor",
]
# The machine's own packages that importing MODULES loads (reported, not carried). Versions that
# matter: pydantic imports typing_extensions.Sentinel (4.14.1 works, 4.12.2 does not); datasets
# declares pyarrow>=24 and verl transformers<5.11 (neither enforced by --no-deps; 5.17 imports).
DEVICE_PACKAGES = [
    "torch",
    "transformers",
    "numpy",
    "typing-extensions",
    "packaging",
    "pyarrow",
    "pandas",
    "fsspec",
    "huggingface-hub",
    "peft",
    "accelerate",
    "xxhash",
    "pillow",
    "einops",
]


def pinned_names() -> list[str]:
    lines = (HERE / "wheels.txt").read_text().splitlines()
    return [ln.split("==")[0].strip() for ln in lines if ln.strip() and not ln.startswith("#")]


def version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "missing"


def main() -> int:
    standins = use_standins_if_missing()
    errors = []
    for name in MODULES:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 (every failure is reported, none stops the rest)
            errors.append(f"{name}: {type(exc).__name__}: {exc}")
    versions = {name: version(name) for name in DEVICE_PACKAGES + pinned_names()}
    versions["python"] = sys.version.split()[0]
    report = {
        "part": "imports",
        "ok": not errors,
        "standins": standins,
        "versions": versions,
        "errors": errors,
    }
    print(json.dumps(report))
    return 0 if not errors else 1


if __name__ == "__main__":
    sys.exit(main())
