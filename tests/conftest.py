"""Suite-wide settings from the environment, so CI can run the same tests under other conditions.

``PDM_TEST_TORCH_THREADS=N``: torch's intra-op threads for the whole session (CI's second pass
uses 1, with another ``PYTHONHASHSEED``): a result that holds only at one thread count, or only
with one reduction order, is a test tuned to one machine.
"""

from __future__ import annotations

import os

THREADS_ENV = "PDM_TEST_TORCH_THREADS"


def pytest_configure(config) -> None:
    threads = os.environ.get(THREADS_ENV)
    if threads:
        import torch

        torch.set_num_threads(int(threads))


def pytest_report_header(config) -> str:
    return (
        f"{THREADS_ENV}={os.environ.get(THREADS_ENV, '(unset)')} "
        f"PYTHONHASHSEED={os.environ.get('PYTHONHASHSEED', '(random)')}"
    )
