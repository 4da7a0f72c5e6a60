"""How a trial uses the CPU: one thread, deterministic kernels.

Two trials share two cores, and these models are far too small for intra-op threads to pay off:
on a busy machine a second thread mostly waits (measured: a warm start ran 10x slower with two
threads under load than with one). Deterministic algorithms cost nothing here and make a trial
reproducible given its seed on one machine.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def single_threaded() -> Iterator[None]:
    """Run the block with one intra-op thread and deterministic algorithms, then restore both."""
    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
