"""Put the stand-ins of ``benchmarks/gpu/standins`` on ``sys.path``, each only if the real one is missing.

Used by the GPU check on the lent GPU machine, where ray cannot travel (its wheel alone is larger
than everything that may be carried there) but ``import verl`` imports it::

    from standin_path import use_standins_if_missing
    for name in use_standins_if_missing():
        print(f"{name}: stand-in (benchmarks/gpu/standins/{name}), not the real package")

Where the real package is installed it is always the one used and nothing is added.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

STANDINS = Path(__file__).resolve().parent / "standins"
# The packages with a stand-in, one folder each under STANDINS.
NAMES = ("ray",)


def _is_standin(name: str) -> bool:
    spec = importlib.util.find_spec(name)
    return spec is not None and Path(spec.origin or "").is_relative_to(STANDINS)


def use_standins_if_missing() -> list[str]:
    """Append STANDINS to ``sys.path`` if a real package of NAMES is missing; the stand-ins used.

    Idempotent: a second call returns the same names (the stand-ins then found on the path).
    """
    missing = [name for name in NAMES if importlib.util.find_spec(name) is None]
    if missing and str(STANDINS) not in sys.path:
        sys.path.append(str(STANDINS))
    return [name for name in NAMES if _is_standin(name)]
