"""Orchestration: run a sweep's trials on Ray (embedded or a cluster), resume, retry, report."""

from pdmask.orchestration.runner import execute, run_sweep

__all__ = ["execute", "run_sweep"]
