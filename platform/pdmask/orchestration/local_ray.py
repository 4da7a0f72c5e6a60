"""Connect to Ray: an embedded local instance sized for this machine, or an existing cluster."""

from __future__ import annotations

import os

# Explicit settings that keep a later `ray start` usable (token auth is switched on by an auth token
# file that ray.init() would otherwise create) and keep the machine quiet.
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
# Tune's own console output is replaced by pdmask's progress table.
QUIET_ENV = {"RAY_AIR_NEW_OUTPUT": "0"}


def connect(address: str | None, env_vars: dict[str, str]) -> bool:
    """Initialise Ray; returns True when we started an embedded instance (ours to shut down)."""
    for k, v in {**RAY_ENV, **QUIET_ENV}.items():
        os.environ.setdefault(k, v)
    import ray

    if ray.is_initialized():
        return False
    runtime_env = {"env_vars": {**RAY_ENV, **env_vars}}
    if address:
        ray.init(address=address, runtime_env=runtime_env, log_to_driver=False)
        return False
    cpus = os.cpu_count() or 2
    ray.init(
        num_cpus=cpus,
        object_store_memory=1 << 30,  # 1 GiB: trials exchange metrics, not tensors
        include_dashboard=False,
        log_to_driver=False,
        runtime_env=runtime_env,
        configure_logging=False,
    )
    return True
