"""Figures from MLflow runs: declarative specs in ``dashboards/`` → paper figures.

    from pdmask.figures import build_figure
    result = build_figure("figure-1")           # sweep main-figure, the project's MLflow store
    result.paths["png"], result.paths["data_csv"], result.paths["manifest"]

Modules, in the order data flows through them: ``spec`` (the YAML schema), ``runs`` (which runs,
which cell), ``history`` (metric histories via a cache),
``series`` (per-step statistics), ``cells`` / ``panels`` (what is drawn), ``render``
(matplotlib), ``summary`` (the table), ``build`` (all of it, plus the files written).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

# Names resolve on first use: checking a spec (`pdm validate`, a sweep's preflight) must not pay
# for pandas, matplotlib and scipy, which only drawing needs.
_HOMES = {
    "FigureResult": "build",
    "build_figure": "build",
    "FigureSpec": "spec",
    "available_specs": "spec",
    "figures_for_sweep": "spec",
    "load_spec": "spec",
    "MethodStyle": "styles",
    "resolve_styles": "styles",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_HOMES[name]}"), name)
