"""A Ray head on this machine for VeRL jobs on a CPU cluster profile (``this-machine``).

``pdm sweep NAME --backend verl`` with no ``--address`` on such a profile starts one, submits the
trials to it as Ray Jobs exactly as to a cluster, and stops it when the sweep ends. Properties:

- **loopback only**: every Ray service binds to 127.0.0.1, the dashboard and job API included.
  ``--node-ip-address=127.0.0.1`` alone is not enough on Linux (Ray replaces a loopback address by
  the machine's own address); ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` keeps Ray in its single-machine
  mode, where the node address, and so every server's bind address, is the loopback address;
- **logical resources**: CPUs and GPUs as the profile's jobs need them (verl places its workers on
  ``GPU`` resources; the transfer queue wants a CPU per actor); no accelerator is touched;
- **its own** temporary folder and free ports (other Ray instances may run on the machine), in a
  session of its own; stopped by PID: every process of that session, and every descendant of the
  head (vLLM engines, Ray workers, raylets), gets SIGTERM, then SIGKILL. Never ``ray stop``, which
  would stop every Ray on the machine.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from pdmask.errors import ConfigError
from pdmask.loopback import LOOPBACK, free_ports
from pdmask.orchestration.cluster.local_ray import LOOPBACK_ENV, RAY_ENV
from pdmask.process_group import signal_when_parent_dies

LOGICAL_CPUS = 16  # verl's transfer queue and agent loops hold one logical CPU per actor
OBJECT_STORE_BYTES = 512 * 1024 * 1024
START_TIMEOUT_S = 120.0
# Every port a Ray node opens (a joining node opens these too), then the head's own.
NODE_PORT_FLAGS = (
    "--dashboard-agent-listen-port",
    "--dashboard-agent-grpc-port",
    "--metrics-export-port",
    "--runtime-env-agent-port",
    "--node-manager-port",
    "--object-manager-port",
)
PORT_FLAGS = ("--port", "--dashboard-port", "--ray-client-server-port", *NODE_PORT_FLAGS)
# A port chosen free can be taken by another process before the head binds it; the head then
# exits at once saying so (Ray's words below), and a second start with fresh ports succeeds.
PORT_TAKEN_MARKERS = ("used by other components", "address already in use")
START_ATTEMPTS = 3


def _proc_stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _processes() -> dict[int, tuple[int, int, str]]:
    """pid -> (parent pid, session id, state) of every process."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _proc_stat(int(entry))) is not None:
            out[int(entry)] = (int(stat[1]), int(stat[3]), stat[0])
    return out


def tree_of(pid: int) -> list[int]:
    """``pid``, its descendants, and every process still in its session (re-parented ones too)."""
    procs = _processes()
    children: dict[int, list[int]] = {}
    for p, (ppid, _, _) in procs.items():
        children.setdefault(ppid, []).append(p)
    found, todo = set(), [pid]
    while todo:
        p = todo.pop()
        if p not in found:
            found.add(p)
            todo.extend(children.get(p, []))
    found.update(p for p, (_, sid, _) in procs.items() if sid == pid)
    return sorted(found)


def _alive(pid: int) -> bool:
    stat = _proc_stat(pid)
    return stat is not None and stat[0] != "Z"


def stop_tree(pid: int, grace_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL, to the head's whole process tree and session."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = [p for p in tree_of(pid) if p != os.getpid()]
        for p in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, sig)
        deadline = time.time() + grace_s
        while time.time() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.2)


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


class _PortTaken(Exception):
    """The head exited because a port chosen for it was taken meanwhile (``start`` retries)."""


class LocalRayHead:
    """A Ray head on loopback, started by pdmask and stopped by PID (a context manager)."""

    def __init__(
        self, num_gpus: int, num_cpus: int = LOGICAL_CPUS, log=print, scratch_env: str | None = None
    ):
        """``scratch_env``: the variable through which the jobs find a folder that lives and dies
        with this head (``JobBatch.scratch_env``)."""
        self.num_gpus, self.num_cpus, self.log = num_gpus, num_cpus, log
        self.scratch_env = scratch_env
        self.process: subprocess.Popen | None = None
        self.address = ""
        self.folder: Path | None = None

    def __enter__(self) -> LocalRayHead:
        # SIGTERM/SIGHUP end the sweep like Ctrl-C, so the head is stopped on the way out.
        self._handlers = {
            sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)
        }
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.stop()
        finally:
            for sig, handler in self._handlers.items():
                signal.signal(sig, handler)

    def env(self) -> dict[str, str]:
        """The environment of the head, hence of every Ray process and job it starts."""
        # The jobs' `python3 -m verl...` must be this environment's Python, activated or not.
        path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        scratch = {self.scratch_env: str(self.folder)} if self.scratch_env else {}
        return {**os.environ, **RAY_ENV, **LOOPBACK_ENV, "PATH": path, **scratch}

    def start(self) -> str:
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                return self._start_once()
            except _PortTaken as taken:
                if attempt == START_ATTEMPTS:
                    raise ConfigError(str(taken)) from None
                self.log("a port chosen for the local Ray head was taken meanwhile; retrying")
        raise AssertionError("unreachable")

    def _start_once(self) -> str:
        # Short: Ray's socket paths are length-capped.
        self.folder = Path(tempfile.mkdtemp(prefix="pdmray", dir="/tmp"))
        ports = dict(zip(PORT_FLAGS, free_ports(len(PORT_FLAGS)), strict=True))
        cmd = [
            str(Path(sys.executable).with_name("ray")),
            "start",
            "--head",
            "--block",
            f"--node-ip-address={LOOPBACK}",
            f"--dashboard-host={LOOPBACK}",
            "--include-dashboard=true",
            "--disable-usage-stats",
            f"--num-cpus={self.num_cpus}",
            f"--num-gpus={self.num_gpus}",
            f"--object-store-memory={OBJECT_STORE_BYTES}",
            f"--temp-dir={self.folder}",
            *(f"{flag}={port}" for flag, port in ports.items()),
        ]
        log_path = self.folder / "head.log"
        with open(log_path, "w") as log:
            self.process = subprocess.Popen(
                cmd,
                env=self.env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                # Jobs run in the head's folder: what verl writes relative to its working
                # directory (Hydra's outputs/) goes away with the head, not into the project.
                cwd=self.folder,
                start_new_session=True,  # its own session: stopped as a whole, by PID
                preexec_fn=signal_when_parent_dies,  # SIGTERM when pdmask's process dies
            )
        self.address = f"http://{LOOPBACK}:{ports['--dashboard-port']}"
        self.log(
            f"starting a local Ray head on {self.address} ({self.num_gpus} logical GPU(s), "
            f"{self.num_cpus} logical CPUs, loopback only)"
        )
        try:
            self._wait(log_path)
        except BaseException:
            self.stop()
            raise
        return self.address

    def _wait(self, log_path: Path) -> None:
        deadline = time.time() + START_TIMEOUT_S
        while time.time() < deadline:
            if self.process.poll() is not None:
                message = (
                    f"the local Ray head exited ({self.process.returncode}):\n"
                    + log_path.read_text()[-3000:]
                )
                if any(marker in message.lower() for marker in PORT_TAKEN_MARKERS):
                    raise _PortTaken(message)
                raise ConfigError(message)
            if self._node_ready():
                return
            time.sleep(0.5)
        raise ConfigError(
            f"the local Ray head's job API did not come up at {self.address} within "
            f"{START_TIMEOUT_S:.0f} s:\n" + log_path.read_text()[-3000:]
        )

    def _node_ready(self) -> bool:
        """The job API answers and the head's node is registered with its logical GPUs."""
        try:
            with urllib.request.urlopen(f"{self.address}/api/version", timeout=2):
                pass
            from ray.util.state import list_nodes

            nodes = list_nodes(address=self.address, detail=True, raise_on_missing_output=False)
        except Exception:  # not up yet: connection refused, state API still starting
            return False
        return any(
            n.state == "ALIVE" and (n.resources_total or {}).get("GPU", 0) >= self.num_gpus
            for n in nodes
        )

    def stop(self) -> None:
        if self.process is not None:
            stop_tree(self.process.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=10)
            self.process = None
            self.log("stopped the local Ray head")
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None
