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
"""

from __future__ import annotations

import os
import signal
import sys

from pdmask.loopback import LOOPBACK

# Explicit settings that keep a later `ray start` usable (token auth is switched on by an auth token
# file that ray.init() would otherwise create) and keep the machine quiet.
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
# Tune's own console output is replaced by pdmask's progress table (a failed attempt is one line
# with its reason, read from its run: Tune's traceback of a dead actor says nothing of why);
# Tune's SIGINT handler by pdmask's (interrupts.py), which also covers SIGTERM and the moments
# outside Tune.
QUIET_ENV = {
    "RAY_AIR_NEW_OUTPUT": "0",
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
    import ray

    if ray.is_initialized():
        return False
    runtime_env = {"env_vars": {**RAY_ENV, **env_vars}}
    if address:
        ray.init(address=address, runtime_env=runtime_env, log_to_driver=False)
        return False
    from pdmask.orchestration.reaper import reap_own, start_reaper

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
    from pdmask.orchestration.reaper import reap_own

    if _OWN_TOKEN is not None:
        reap_own(_OWN_TOKEN, grace=grace)


def _init_embedded(ray, env_vars: dict[str, str]) -> None:
    ray.init(
        num_cpus=os.cpu_count() or 2,
        object_store_memory=1 << 30,  # 1 GiB: trials exchange metrics, not tensors
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
