"""A CPU platform for verl 0.9.1, registered through verl's own platform registry.

verl 0.9.1 knows CUDA, Ascend NPUs and ROCm; on a machine without any it falls back to CUDA and
fails. This platform lets verl's unmodified trainer, FSDP2 engine and vLLM rollout (vLLM's CPU
build) run on CPU cores, for integration tests and the ``verl-smoke`` sweep. It is switched on
only by ``VERL_PLATFORM=pdmask-cpu`` in a job's environment, which the job builder sets only for
a cluster profile whose device is ``cpu`` (``cpu_profile.py``): GPU clusters never see it. The
module registers the platform itself when it is selected; pdmask's worker also registers verl's
FSDP engine for ``cpu`` and creates the gloo process group (``register_engine``,
``init_process_group``).

What verl needs from it, and why each answer is what it is:

- the device is ``cpu``, so verl keeps ``trainer.device=cpu`` (``auto_set_device`` rewrites any
  other device to the platform's) and moves tensors to ``torch.device("cpu")``; the current
  device is that ``torch.device``, not an index (an int means "accelerator 0" to ``.to()``);
- Ray's resource is ``GPU``: the Ray head advertises logical GPUs (one per training process), so
  verl's resource pools, which count ``GPU``, can be placed; no accelerator is touched;
- collectives run over gloo; verl's worker builds its process-group string as
  ``cpu:gloo,<device>:<backend>``, which on CPU names ``cpu`` twice (torch refuses), so pdmask's
  worker creates the group first with plain gloo (``init_process_group``);
- the device module is ``torch.cpu`` plus what verl calls on a CUDA module that CPU lacks:
  memory statistics (not tracked on CPU: 0), ``mem_get_info`` (the machine's RAM), RNG state
  (the CPU generator), ``empty_cache`` / ``ipc_collect`` (nothing to release);
- no CUDA IPC, so verl syncs weights into vLLM through shared memory;
- verl's FSDP engine is registered for CUDA and NPU only; the same class serves ``cpu``.
"""

from __future__ import annotations

import os
import types
from contextlib import contextmanager
from typing import Any

import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry

from pdmask.backends.verl.cpu_profile import PLATFORM_ENV, PLATFORM_NAME, STORE_DIR_ENV


def selected() -> bool:
    """True in a process of a job that asked for the CPU platform."""
    return os.environ.get(PLATFORM_ENV, "").strip().lower() == PLATFORM_NAME


def _meminfo() -> tuple[int, int]:
    """(available, total) bytes of this machine's RAM."""
    values = {}
    with open("/proc/meminfo") as fh:
        for line in fh:
            key, _, rest = line.partition(":")
            values[key] = int(rest.split()[0]) * 1024
    return values.get("MemAvailable", 0), values.get("MemTotal", 0)


def _device_module() -> types.ModuleType:
    """``torch.cpu`` plus the CUDA-module functions verl calls that CPU does not have."""
    module = types.ModuleType("pdmask_torch_cpu", "torch.cpu with verl's CUDA-module extras")
    for name in dir(torch.cpu):
        if not name.startswith("_"):
            setattr(module, name, getattr(torch.cpu, name))

    def nothing(*args, **kwargs) -> None:
        return None

    def zero(*args, **kwargs) -> int:
        return 0

    module.is_available = lambda: True
    module.current_device = lambda: torch.device("cpu")
    module.empty_cache = nothing
    module.ipc_collect = nothing
    module.reset_peak_memory_stats = nothing
    module.set_per_process_memory_fraction = nothing
    module.memory_allocated = zero
    module.memory_reserved = zero
    module.max_memory_allocated = zero
    module.max_memory_reserved = zero
    module.mem_get_info = lambda *args: _meminfo()
    module.get_rng_state = lambda *args: torch.get_rng_state()
    module.set_rng_state = lambda state, *args: torch.set_rng_state(state)
    module.manual_seed = torch.manual_seed
    module.manual_seed_all = torch.manual_seed
    module.get_device_name = lambda *args: "cpu"
    return module


class PlatformCPU(PlatformBase):
    """verl's platform interface on CPU cores (logical GPUs for Ray placement)."""

    _module = None

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        if PlatformCPU._module is None:
            PlatformCPU._module = _device_module()
        return PlatformCPU._module

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check=False) -> bool:
        # Never auto-detected: only VERL_PLATFORM selects it, so no GPU machine picks it up.
        return False

    def current_device(self):
        return torch.device("cpu")

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index) -> None:
        return None

    def synchronize(self, device_index=None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0):
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # Ray sets it for actors holding (logical) GPUs; verl reads it to name devices.
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {"num_gpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def rollout_env_vars(self) -> dict[str, str]:
        # vLLM's own platform detection reads the `vllm` distribution's version (cpu_setup.py);
        # the variable makes the choice explicit in the server processes too.
        return {"VLLM_TARGET_DEVICE": "cpu"}

    def cudart(self):
        return None


def init_process_group() -> None:
    """The training processes' process group over gloo, bound to loopback.

    Called by pdmask's worker before verl's, whose default backend string would name ``cpu``
    twice; verl then finds the group initialised and keeps it. torch's default rendezvous
    (``env://``, a TCPStore) and gloo's transport listen on every interface; on one machine a
    file store and gloo on ``lo`` need no socket beyond loopback.
    """
    import tempfile

    import torch.distributed as dist

    if dist.is_initialized():
        return
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    # The same file for every rank of this group: verl gives them one MASTER_ADDR:MASTER_PORT.
    name = (
        f"pdmask-gloo-{os.environ.get('MASTER_ADDR', 'local')}-{os.environ.get('MASTER_PORT', 0)}"
    )
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    # pdmask's local Ray head names its own folder, which goes away with it (STORE_DIR_ENV).
    folder = os.environ.get(STORE_DIR_ENV) or tempfile.gettempdir()
    store = dist.FileStore(os.path.join(folder, name), world_size)
    dist.init_process_group(
        backend="gloo", store=store, rank=int(os.environ.get("RANK", 0)), world_size=world_size
    )


def register_engine() -> None:
    """verl's FSDP language-model engine for ``cpu`` too (registered for cuda/npu only)."""
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    backends = EngineRegistry._engines.get("language_model", {})
    if all("cpu" in backends.get(b, {}) for b in ("fsdp", "fsdp2")):
        return
    EngineRegistry.register("language_model", ["fsdp", "fsdp2"], device="cpu")(FSDPEngineWithLMHead)


def register() -> None:
    """The platform into verl's registry (idempotent)."""
    if PlatformRegistry.get(PLATFORM_NAME) is None:
        PlatformRegistry.register(platform=PLATFORM_NAME)(PlatformCPU)


# Registered by the module itself, at the end of its import: the plugin imports it on `import
# verl`, and if this module was what triggered that import, the plugin sees it half-initialised.
if selected():
    register()
