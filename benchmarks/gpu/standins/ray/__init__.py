"""A stand-in for ray, NOT ray: lets ``import verl`` work on a machine without ray.

Why it exists: the GPU check (``benchmarks/gpu_check.py``) runs verl 0.9.1's loss and FSDP-engine
code on a lent GPU machine that has no ray, and ray cannot travel there (its wheel alone is larger
than the 64 MiB that may be carried). verl imports ray at import time (``verl/protocol.py``, pulled
in by ``import verl``; ``verl/single_controller/base/worker.py``) although the code the check runs
never uses it. ``benchmarks/gpu/standin_path.py`` puts this folder's parent on ``sys.path`` only
when the real ray is missing; wherever ray is installed, the real one is used.

It defines exactly what those modules touch, each name explicitly (no catch-all):

- ``ObjectRef``: a class, because ``verl.protocol`` evaluates it in annotations at import time
  (``DataProtoFuture.futures: list[ray.ObjectRef]``) and uses it in ``isinstance`` checks, which
  are correctly false here: nothing is a ray object reference without ray.
- ``get``, ``get_runtime_context`` and ``util.get_node_ip_address``: what those modules call at
  run time, on Ray-only paths; each raises ``RuntimeError`` saying that it needs the real ray.

``__standin__`` is true here and absent from the real ray, so a check can tell which one it got.
"""

from __future__ import annotations

from ray import util  # noqa: F401 (``ray.util.get_node_ip_address`` after ``import ray``)

__standin__ = True


def needs_ray(name: str) -> RuntimeError:
    """The error of every stand-in call: ``name`` needs the real ray."""
    return RuntimeError(f"ray stand-in: {name} needs the real ray (not installed on this machine)")


class ObjectRef:
    """Only a type here (for annotations and isinstance checks); no instance can exist."""

    def __init__(self, *args, **kwargs):
        raise needs_ray("ray.ObjectRef")


def get(*args, **kwargs):
    raise needs_ray("ray.get")


def get_runtime_context(*args, **kwargs):
    raise needs_ray("ray.get_runtime_context")
