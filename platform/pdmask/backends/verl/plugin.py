"""pdmask's verl plugin: imported by ``import verl`` in every process of a VeRL job.

Two ways in, both set up by the job builder (``overrides.job_env``):

- the ``verl.plugins`` entry point of the installed ``pdmask`` distribution: verl 0.9.1 loads every
  entry point of that group on ``import verl``, in every Ray worker of every node where pdmask is
  installed, but swallows import errors silently;
- ``VERL_USE_EXTERNAL_MODULES=pdmask.backends.verl.plugin`` in the job's runtime env: verl imports
  the module on ``import verl`` and fails loudly if that fails.

Importing this module must stay cheap and safe in every process, vLLM's included: no vllm, no CUDA.
It checks the verl version and registers the policy loss of its job's recipe at once
(``import verl`` then shows it in verl's registry); the loss code itself is imported on the first call. The trainer,
the agent loop and the vLLM replica are registered lazily, right after verl itself imports the
registry they go into, so processes that never use them (vLLM workers, reward workers) do not pay
for importing them.

This module imports no other pdmask module that imports verl: whichever pdmask module a process
imports first may be what triggers ``import verl`` and with it this plugin, and a circular import
here would be swallowed by verl's plugin loader, leaving the methods silently unregistered.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable

from verl.trainer.ppo.core_algos import register_policy_loss

from pdmask.backends.verl import (
    compat,
    cpu_platform,  # noqa: F401 (registers itself when a job selects it)
)
from pdmask.backends.verl.loss_names import pdm_loss_modes

compat.check_version()


def _policy_loss(loss_mode: str) -> Callable:
    """verl's registered loss for ``loss_mode``; the implementation is imported on first use."""

    def policy_loss(*args, **kwargs):
        from pdmask.backends.verl.loss import masked_policy_loss

        return masked_policy_loss(*args, loss_mode=loss_mode, **kwargs)

    policy_loss.__name__ = policy_loss.__qualname__ = f"pdmask_{loss_mode}"
    return policy_loss


def register_losses() -> None:
    """The loss of the recipe this process's job carries into verl's policy-loss registry
    (idempotent; nothing outside such a job)."""
    for loss_mode in pdm_loss_modes():
        register_policy_loss(loss_mode)(_policy_loss(loss_mode))


register_losses()


def _register_trainer() -> None:
    importlib.import_module("pdmask.backends.verl.trainer")


def _register_agent_loop() -> None:
    importlib.import_module("pdmask.backends.verl.agent_loop")


def _load_topk_vllm():
    """Replica loader: pdmask's vLLM replica (identical to verl's unless rollout.custom.pdm_topk)."""
    from pdmask.backends.verl.vllm_server import TopKvLLMReplica

    return TopKvLLMReplica


def _register_replica() -> None:
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    RolloutReplicaRegistry.register("vllm", _load_topk_vllm)


def _size_collectives() -> None:
    importlib.import_module("pdmask.backends.verl.collectives").apply()


# verl module whose import completes a registry -> what pdmask then registers into it.
DEFERRED: dict[str, Callable[[], None]] = {
    "verl.trainer.ppo.v1.trainer_base": _register_trainer,
    "verl.experimental.agent_loop.agent_loop": _register_agent_loop,
    "verl.workers.rollout.replica": _register_replica,
    "verl.workers.engine_workers": _size_collectives,  # the job's collective timeout
}


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a callback right after a given module has executed, once, in whatever process."""

    def __init__(self, callbacks: dict[str, Callable[[], None]]):
        self.callbacks = dict(callbacks)

    def find_spec(self, fullname, path=None, target=None):
        callback = self.callbacks.pop(fullname, None)
        if callback is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            callback()

        spec.loader.exec_module = exec_module
        return spec


def _install_deferred() -> None:
    pending = {}
    for module, callback in DEFERRED.items():
        if module in sys.modules:
            callback()
        else:
            pending[module] = callback
    if pending and not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(pending))


_install_deferred()
