"""Orchestration: run a sweep's trials on Ray (embedded or a cluster), resume, retry, report."""

from __future__ import annotations

from typing import Any

__all__ = ["execute", "run_sweep"]


def __getattr__(name: str) -> Any:
    # Resolved on first use: `pdm validate` and the reaper import parts of this package and
    # must not pay for Ray Tune and MLflow, which only running a sweep needs.
    if name in __all__:
        from pdmask.orchestration import runner

        return getattr(runner, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
