"""Connect to Ray: an embedded local instance sized for this machine, or an existing cluster.

The embedded instance is private to the sweep that starts it:

- **Loopback only.** On Linux Ray runs in cluster mode by default: its GCS, raylet, workers and
  agents listen on every interface without authentication, so any host that can reach this one
  could run code in the sweep's workers. ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` selects Ray's
  single-machine mode (its default on macOS and Windows), in which the node's address is the
  loopback one and every server binds to 127.0.0.1; ``_node_ip_address`` says the same to the
  driver. Nothing can join or reach it from another host.
- **Deaf to Ctrl-C.** A terminal's Ctrl-C signals the whole foreground process group: Ray's own
  processes would die under the driver while it still talks to them (tracebacks, a segfault, a
  different exit code in every timing). They are started with SIGINT blocked (the signal mask
  is inherited), so only the driver hears it and stops them in order.
- **Reaped with the driver.** A reaper process (``reaper.py``) kills every process of the
  instance, Ray's renamed agents included, when the driver exits for any reason, SIGKILL included.
- **In the state folder.** Its temp and session folders (logs, sockets, spilled objects) are
  ``paths.ray_temp_dir()``, not the system's ``/tmp/ray``. Ray puts its AF_UNIX sockets there,
  whose paths may not exceed 107 bytes (103 on macOS): under a deeper state folder, Ray is given a
  short link in the system temp folder that points into the state folder (``ray_temp_folder``);
  one line says so, and the link is removed when the driver exits (a SIGKILLed driver's link is
  removed by the next sweep that needs one).
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import tempfile
from datetime import datetime
from pathlib import Path

from pdmask.console import redact
from pdmask.loopback import LOOPBACK

# Explicit settings that keep a later `ray start` usable (token auth is switched on by an auth token
# file that ray.init() would otherwise create) and keep the machine quiet.
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
# Tune's own console output is replaced by pdmask's progress table (a failed attempt is one line
# with its reason, read from its run: Tune's traceback of a dead actor says nothing of why);
# Tune's SIGINT handler by pdmask's (interrupts.py), which also covers SIGTERM and the moments
# outside Tune. Tune's result files (CSV, JSON, TensorBoard) duplicate the MLflow runs, and on a
# full state folder TensorBoard's writer fails at exit with a traceback: they are not written.
QUIET_ENV = {
    "RAY_AIR_NEW_OUTPUT": "0",
    "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1",
    "TUNE_DISABLE_SIGINT_HANDLER": "1",
    "TUNE_PRINT_ALL_TRIAL_ERRORS": "0",
}
# Ray's single-machine mode: every process of the instance binds to loopback (see above).
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
START_ATTEMPTS = 2


def connect(address: str | None, env_vars: dict[str, str]) -> bool:
    """Initialise Ray; returns True when we started an embedded instance (ours to shut down)."""
    for k, v in {**RAY_ENV, **QUIET_ENV}.items():
        os.environ.setdefault(k, v)
    if not address:
        _loopback_mode()
        # The embedded Ray's processes inherit this process's environment: a credential (a
        # tracking URI's password) goes there, never into a runtime env, which Ray writes into
        # its logs in the state folder.
        secret = {k: v for k, v in env_vars.items() if redact(v) != v}
        os.environ.update(secret)
        env_vars = {k: v for k, v in env_vars.items() if k not in secret}
    import ray

    if ray.is_initialized():
        return False
    runtime_env = {"env_vars": {**RAY_ENV, **env_vars}}
    if address:
        ray.init(address=address, runtime_env=runtime_env, log_to_driver=False)
        return False
    from pdmask.orchestration.cluster.reaper import reap_own, start_reaper

    token = start_reaper()
    global _OWN_TOKEN
    _OWN_TOKEN = token
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                _init_embedded(ray, runtime_env["env_vars"])
                break
            except Exception as err:
                # Ray's raylet gives its agents 15 s to start; on a loaded machine their first
                # imports can take longer. The next attempt finds them in the page cache.
                if attempt == START_ATTEMPTS or "timed out during startup" not in str(err):
                    raise
                print(f"Ray did not start in time ({err}); trying again", file=sys.stderr)
                reap_own(token, grace=2.0)  # what the failed attempt left running
    finally:
        # A Ctrl-C pressed meanwhile was held back, not lost: it is delivered now.
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    node_ip = ray.get_runtime_context().worker.node.node_ip_address
    if node_ip != LOOPBACK:  # fail closed: never train on an instance reachable from outside
        ray.shutdown()
        raise RuntimeError(f"the embedded Ray started on {node_ip}, not on {LOOPBACK}")
    return True


_OWN_TOKEN: str | None = None  # the embedded instance this process started (reaper.py's mark)


def reap_embedded(grace: float = 2.0) -> None:
    """Kill what is left of the embedded instance this process started: after its raylet died,
    its trials' processes live on, orphaned, and would keep writing to their runs."""
    from pdmask.orchestration.cluster.reaper import reap_own

    if _OWN_TOKEN is not None:
        reap_own(_OWN_TOKEN, grace=grace)


# AF_UNIX socket paths: sun_path is 108 bytes on Linux, 104 on macOS, NUL included.
SOCKET_PATH_MAX = (104 if sys.platform == "darwin" else 108) - 1


def _longest_socket_under(temp: Path) -> int:
    """The length of the longest socket path Ray makes under ``temp`` (node.py: the session
    folder is named by the start time and the driver's pid; ``.N`` when a name is taken)."""
    session = f"session_{datetime.now().strftime('%Y-%m-%d_%H-%M-%S_%f')}_{'9' * 7}"
    return len(os.fsencode(temp / session / "sockets" / "plasma_store.99"))


def ray_temp_folder() -> str:
    """The folder given to Ray as its temp folder: the state folder's ``ray/``, or a short link
    to it when that path is too long for Ray's sockets (see the module's docstring)."""
    from pdmask.paths import ray_temp_dir

    target = ray_temp_dir()
    target.mkdir(parents=True, exist_ok=True)
    if _longest_socket_under(target) <= SOCKET_PATH_MAX:
        return str(target)
    short = Path(tempfile.gettempdir())
    if _longest_socket_under(short / "pdm-ray-0000000") > SOCKET_PATH_MAX:
        short = Path("/tmp")  # the system temp folder itself is too deep (a TMPDIR)
    _remove_stale_links(short)
    link = short / f"pdm-ray-{os.getpid()}"
    if link.is_symlink():  # a SIGKILLed driver's, whose pid this process now has
        link.unlink()
    link.symlink_to(target, target_is_directory=True)
    atexit.register(_remove_link, link, target)
    print(
        f"Ray's folder {target} is too deep for its sockets ({SOCKET_PATH_MAX} bytes at most): "
        f"Ray reaches it through the link {link}, removed when this sweep ends",
        file=sys.stderr,
    )
    return str(link)


def _remove_stale_links(folder: Path) -> None:
    """The links SIGKILLed drivers left in ``folder`` (their pid is gone): links only, never
    followed, so nothing they point to is touched."""
    for link in folder.glob("pdm-ray-*"):
        pid = link.name.removeprefix("pdm-ray-")
        if not (link.is_symlink() and pid.isdigit()):
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            link.unlink(missing_ok=True)
        except OSError:  # someone else's live process: its link
            pass


def _remove_link(link: Path, target: Path) -> None:
    import ray

    if ray.is_initialized():  # its processes use the link until they stop
        ray.shutdown()
    link.unlink(missing_ok=True)
    latest = target / "session_latest"  # Ray's pointer to its session, made through the link
    if latest.is_symlink():
        session = Path(os.readlink(latest)).name
        latest.unlink()
        latest.symlink_to(session, target_is_directory=True)  # relative: valid without the link


def _state_caches() -> dict[str, str]:
    """Caches torch keeps in the system temp folder by default (inductor's, which the trials'
    imports create): in the state folder's cache instead, unless the site chose a place."""
    from pdmask.paths import state_dir

    caches = {"TORCHINDUCTOR_CACHE_DIR": str(state_dir() / "cache" / "torchinductor")}
    return {k: v for k, v in caches.items() if k not in os.environ}


def _init_embedded(ray, env_vars: dict[str, str]) -> None:
    env_vars = {**_state_caches(), **env_vars}
    ray.init(
        _temp_dir=ray_temp_folder(),
        num_cpus=os.cpu_count() or 2,
        object_store_memory=1 << 30,  # 1 GiB: trials exchange metrics, not tensors
        # ... so nothing is spilled to disk. Spilling would also make ray.shutdown() recreate its
        # folder in the session: it fails (and leaves Ray's processes up) once the state folder
        # is deleted or full, and hides the store's own error line.
        _system_config={"automatic_object_spilling_enabled": False},
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {**env_vars, **LOOPBACK_ENV}},
        configure_logging=False,
        _node_ip_address=LOOPBACK,
    )


def _loopback_mode() -> None:
    """Ray's single-machine mode, for this process and every process it starts."""
    os.environ.update(LOOPBACK_ENV)
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None:  # Ray was imported already: its switch was read from the old env
        constants.ENABLE_RAY_CLUSTER = False
