"""A recipe's hooks must not write into their batch: notice it, and find the line that did.

The batch's tensors are the backend's own (``RecipeBatch``: read-only). A write in place would
change what the backend trains on behind its back (advantages scaled in place changed a run's
avg@16 from 0.070 to 0.203, issue 46, with no warning anywhere), so ``Recipe.method``'s hooks
refuse it, in ``pdm validate`` as at train time:

- :func:`versions` / :func:`written`: every tensor's version counter before and after a hook
  call. In-place ops, on a tensor or on any view of it, move the counter; nothing else does. Cheap
  (one integer per tensor), so it runs on every call.
- :func:`first_write`: once a write was seen, the hook runs again under a dispatch mode that
  raises :class:`InputWritten` at the first operator that writes into one of the batch's storages
  (the operator's schema says which arguments it writes), so the traceback holds the recipe's
  line.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pdmask.trust_region.contract import RecipeBatch


class InputWritten(Exception):
    """Raised inside a hook at the operator that writes into the batch input ``names`` (the
    names of one storage)."""

    def __init__(self, names: list[str]):
        super().__init__(f"writes into {', '.join(names)} in place")
        self.names = names


def versions(batch: RecipeBatch) -> dict[str, int]:
    """Each input tensor's version counter, by name (``RecipeBatch.inputs``)."""
    return {name: t._version for name, t in batch.inputs().items()}


def written(batch: RecipeBatch, before: Mapping[str, int]) -> list[str]:
    """The inputs whose version moved since ``before`` (the names of :func:`versions`)."""
    return [name for name, t in batch.inputs().items() if t._version != before.get(name)]


def _storage(t: torch.Tensor) -> int | None:
    try:
        pointer = t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # a tensor without storage writes nothing here
        return None
    return pointer or None


class _WriteTrap(TorchDispatchMode):
    def __init__(self, storages: dict[int, list[str]]):
        super().__init__()
        self.storages = storages

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for index, argument in enumerate(func._schema.arguments):
            if argument.alias_info is None or not argument.alias_info.is_write:
                continue
            value = args[index] if index < len(args) else kwargs.get(argument.name)
            for t in value if isinstance(value, list | tuple) else (value,):
                names = self.storages.get(_storage(t)) if isinstance(t, torch.Tensor) else None
                if names:
                    raise InputWritten(names)
        return func(*args, **kwargs)


def first_write(fn: Callable[[RecipeBatch], Any], batch: RecipeBatch) -> InputWritten | None:
    """Run ``fn(batch)`` again, stopping at its first in-place write into an input: that
    exception (its traceback holds the line), or None when this call writes nothing."""
    storages: dict[int, list[str]] = {}
    for name, t in batch.inputs().items():
        pointer = _storage(t)
        if pointer is not None:
            storages.setdefault(pointer, []).append(name)
    try:
        with _WriteTrap(storages):
            fn(batch)
    except InputWritten as caught:
        return caught
    except Exception:  # the first run's write changed what this one computes: no line then
        return None
    return None
