"""The probes of ``pdm cluster check`` that concern a node where a job's workers run (a training
node: one with the spec's Ray resource, ``GPU``): its NVIDIA driver, its GPUs, the attention the
jobs ask for, Transformer Engine where a setting trains in FP8, and an all-reduce across all
such nodes.

Shipped next to ``probe.py`` in the check job's working directory and imported there, so
it holds to the same rule: the standard library and Ray only at import time. torch is imported
inside the probes that need it, and an import failure is the finding, not a crash. Each probe's
decision is a pure function of what it read (``parse_gpus``, ``driver_verdict``, ``gpus_verdict``)
so that the GPU cases are tested with recorded ``nvidia-smi`` output on machines without one.
"""

from __future__ import annotations

import importlib
import shutil
import socket
import subprocess
from datetime import timedelta

try:  # in the check job: shipped beside this file
    from probe_inputs import result
except ImportError:  # imported from the package
    from pdmask.orchestration.cluster.probe_inputs import result

NVIDIA_SMI = (
    "nvidia-smi",
    "--query-gpu=index,name,memory.total,driver_version",
    "--format=csv,noheader,nounits",
)
NVIDIA_SMI_TIMEOUT_S = 30.0
COLLECTIVE_TIMEOUT_S = 60.0  # below the probe's round timeout: a rank that never joins is named


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}".rstrip(": ")


# --- nvidia-smi --------------------------------------------------------------------------------


def parse_gpus(text: str) -> list[dict]:
    """``nvidia-smi``'s CSV rows (``NVIDIA_SMI``) as ``index``, ``name``, ``memory_mib``,
    ``driver``; ValueError on a row of another shape."""
    gpus = []
    for line in text.strip().splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != 4:
            raise ValueError(f"not a row of {NVIDIA_SMI[1]}: {line!r}")
        index, name, memory, driver = cells
        gpus.append(
            {"index": int(index), "name": name, "memory_mib": int(memory), "driver": driver}
        )
    return gpus


def read_gpus() -> tuple[list[dict] | None, str]:
    """This node's GPUs from ``nvidia-smi`` (which ignores ``CUDA_VISIBLE_DEVICES``), or None and
    why not."""
    if shutil.which(NVIDIA_SMI[0]) is None:
        return None, "nvidia-smi is not on this node's PATH: no NVIDIA driver installed?"
    try:
        out = subprocess.run(
            NVIDIA_SMI, capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return None, f"nvidia-smi did not run: {_first_line(err)}"
    if out.returncode != 0:
        said = (out.stdout + out.stderr).strip().splitlines()
        return None, f"nvidia-smi failed (exit {out.returncode}): {said[0] if said else ''}"
    try:
        gpus = parse_gpus(out.stdout)
    except ValueError as err:
        return None, str(err)
    return (gpus, "") if gpus else (None, "nvidia-smi lists no GPU")


def version_key(version: str) -> tuple[int, ...]:
    """``"580.65.06"`` -> ``(580, 65, 6)``: driver versions compare number by number."""
    return tuple(int(part) for part in version.split(".") if part.isdigit())


def driver_verdict(gpus: list[dict], cuda: str | None, min_driver: dict[str, str]) -> dict:
    """The driver against the CUDA the node's torch is built for (``min_driver``: CUDA major ->
    the oldest driver that runs its builds)."""
    if cuda is None:
        return result(
            False,
            "this node's torch is not a CUDA build (torch.version.cuda is None)",
            "install the CUDA build of torch the GPU extra pins",
        )
    need = min_driver.get(cuda.split(".")[0])
    if need is None:
        return result(
            False,
            f"torch here is built for CUDA {cuda}, for which no driver requirement is known "
            f"(known: CUDA {', '.join(sorted(min_driver))})",
            "install the torch the GPU extra pins",
        )
    drivers = sorted({g["driver"] for g in gpus}, key=version_key)
    oldest = drivers[0]
    if version_key(oldest) < version_key(need):
        return result(
            False,
            f"driver {oldest} cannot run CUDA {cuda} builds (torch, vLLM): they need {need} or "
            "newer",
            f"install an NVIDIA driver of the R{need.split('.')[0]} branch or newer on this node",
        )
    return result(True, f"driver {', '.join(drivers)} runs CUDA {cuda} (needs >= {need})")


def gpus_verdict(gpus: list[dict], ray_gpus: float, want: dict) -> dict:
    """The GPUs ``nvidia-smi`` sees and Ray advertises against the cluster profile's ``count``
    per node and ``memory_gb`` per GPU (decimal GB, as GPUs are sold; nvidia-smi reports MiB)."""
    count, kind = want["count"], want.get("kind", "")
    problems = []
    if len(gpus) < count:
        problems.append(f"{len(gpus)} GPU(s) visible, the profile's {kind} nodes have {count}")
    if ray_gpus > len(gpus):
        problems.append(f"Ray advertises {ray_gpus:g} GPUs, nvidia-smi sees {len(gpus)}")
    elif ray_gpus < count:
        problems.append(f"Ray advertises {ray_gpus:g} GPUs here, the profile places {count}")
    small = [g for g in gpus if g["memory_mib"] * 2**20 < want["memory_gb"] * 1e9]
    if small:
        have = ", ".join(f"{g['index']}: {g['memory_mib'] / 1024:.1f} GiB" for g in small)
        problems.append(f"GPU memory below the profile's {want['memory_gb']} GB ({have})")
    names = sorted({g["name"] for g in gpus})
    if problems:
        return result(
            False,
            "; ".join(problems) + f" [{len(gpus)} x {', '.join(names)}]",
            "start Ray on this node with --num-gpus equal to its GPUs, or plan with the cluster "
            "profile these nodes have (--cluster)",
        )
    memory = min(g["memory_mib"] for g in gpus) / 1024
    return result(
        True,
        f"{len(gpus)} x {', '.join(names)}, {memory:.1f} GiB each; Ray: {ray_gpus:g} "
        f"(profile: {count} x {want['memory_gb']} GB)",
    )


def install_driver(min_driver: dict[str, str]) -> str:
    newest = max(min_driver, key=int)
    return (
        f"install the NVIDIA driver on this node (R{min_driver[newest].split('.')[0]} or newer "
        f"for CUDA {newest} builds)"
    )


def check_driver(min_driver: dict[str, str] | None) -> dict:
    if min_driver is None:
        return result(True, "not checked on this cluster profile (no GPUs)")
    gpus, why = read_gpus()
    if gpus is None:
        return result(False, why, install_driver(min_driver))
    try:
        import torch
    except Exception as err:  # the finding: verl's workers import torch first
        return result(False, f"torch does not import: {_first_line(err)}", "install torch")
    return driver_verdict(gpus, torch.version.cuda, min_driver)


def check_gpus(want: dict | None, ray_gpus: float) -> dict:
    if want is None:
        return result(True, "not checked on this cluster profile (no GPUs)")
    gpus, why = read_gpus()
    if gpus is None:
        return result(False, why, "install the NVIDIA driver, so that nvidia-smi lists the GPUs")
    return gpus_verdict(gpus, ray_gpus, want)


# --- imports: attention, FP8 training -----------------------------------------------------------


def import_modules(names) -> tuple[list[str], list[str]]:
    """Import each module here (in a Ray worker, as verl's workers would): the failures
    (``name: error``; a submodule of a package that failed is not tried again, the same cause)
    and what loaded (``name version`` where the module has one)."""
    failed, loaded = [], []
    for name in names:
        if any(name.startswith(f"{bad.split(':')[0]}.") for bad in failed):
            continue
        try:
            module = importlib.import_module(name)
        except Exception as err:  # an ImportError, or an ABI mismatch of a compiled extension
            failed.append(f"{name}: {_first_line(err)}")
        else:
            version = getattr(module, "__version__", None)
            loaded.append(f"{name} {version}" if version else name)
    return failed, loaded


def check_attention(attention: dict) -> dict:
    """Every module the jobs' attention implementation needs imports here."""
    failed, loaded = import_modules(attention["modules"])
    impl = attention["implementation"]
    if failed:
        return result(
            False,
            f"the jobs ask for {impl}, and on this node " + "; ".join(failed),
            attention["fix"],
        )
    return result(True, f"{impl}: {', '.join(loaded)} import")


def check_fp8_training(need: dict | None) -> dict:
    """Where some setting trains in FP8 (``need``: the spec's ``fp8_training``), Transformer
    Engine imports here, with its version, and so does its PyTorch extension, which loads TE's
    CUDA library against this node's torch (without TE, Megatron's FP8 is a silent no-op)."""
    if need is None:
        return result(True, "not checked: no setting of this cluster profile trains in FP8")
    failed, loaded = import_modules(need["modules"])
    if failed:
        return result(
            False,
            "a setting trains in FP8 (Transformer Engine), and on this node " + "; ".join(failed),
            need["fix"],
        )
    return result(True, f"FP8 training: {', '.join(loaded)} import")


# --- all-reduce --------------------------------------------------------------------------------


def listening_socket(address: str) -> socket.socket:
    """A socket listening on ``address`` only, at a port the system picks: rank 0's store is
    handed it (``master_listen_fd``), so the store listens on that address and no other."""
    sock = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET)
    sock.bind((address, 0))
    sock.listen()
    return sock


class Rank:
    """One rank of the probe's process group, a Ray actor on one training node: rank 0 opens the
    store (``open``) before any rank joins (``all_reduce``), so nobody races for a port."""

    def __init__(self) -> None:
        self.sock: socket.socket | None = None

    def open(self, address: str) -> int:
        self.sock = listening_socket(address)
        return self.sock.getsockname()[1]

    def all_reduce(
        self,
        backend: str,
        master: str,
        port: int,
        rank: int,
        world: int,
        own_address: str,
        timeout_s: float = COLLECTIVE_TIMEOUT_S,
    ) -> dict:
        return all_reduce(backend, master, port, rank, world, own_address, self.sock, timeout_s)


def all_reduce(backend, master, port, rank, world, own_address, sock, timeout_s) -> dict:
    """A one-element all-reduce over ``world`` ranks (``nccl`` on GPU 0, or ``gloo`` bound to
    ``own_address``): the sum must be ``world``."""
    where = f"{backend} all-reduce, rank {rank} of {world}, master {master}:{port}"
    fix = (
        "let the nodes reach each other on every port (NCCL_SOCKET_IFNAME names the interface "
        "NCCL must use) and install the CUDA torch the GPU extra pins"
        if backend == "nccl"
        else "let the nodes reach each other on every port"
    )
    try:
        import torch
        import torch.distributed as dist
    except Exception as err:
        return result(False, f"torch does not import: {_first_line(err)}", "install torch")
    if backend == "nccl" and not (torch.cuda.is_available() and dist.is_nccl_available()):
        return result(
            False,
            f"{where}: torch {torch.__version__} here cannot run NCCL (a GPU visible: "
            f"{torch.cuda.is_available()}, NCCL built in: {dist.is_nccl_available()})",
            fix,
        )
    timeout = timedelta(seconds=timeout_s)
    try:
        store = dist.TCPStore(
            master,
            port,
            world,
            rank == 0,
            timeout=timeout,
            **({"master_listen_fd": sock.fileno()} if rank == 0 else {}),
        )
        options = None
        if backend == "gloo":  # gloo's transport on this node's own address, not every interface
            options = dist.ProcessGroupGloo._Options()
            options._devices = [dist.ProcessGroupGloo.create_device(hostname=own_address)]
            options._timeout = timeout
        device = "cpu"
        if backend == "nccl":
            # A zero-GPU actor sees the node's GPUs: Ray 2.60 sets no CUDA_VISIBLE_DEVICES for
            # it (unless RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=1, and then no GPU is visible).
            torch.cuda.set_device(0)
            device = "cuda"
        dist.init_process_group(
            backend, store=store, rank=rank, world_size=world, timeout=timeout, pg_options=options
        )
        value = torch.ones(1, device=device)
        dist.all_reduce(value)
        total = float(value.item())
    except Exception as err:
        return result(False, f"{where}: {_first_line(err)}", fix)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if total != world:
        return result(False, f"{where}: the sum is {total:g}, not {world}", fix)
    return result(True, f"{backend} all-reduce across {world} node(s): sum {total:g}")
