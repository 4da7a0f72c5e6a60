"""Figures from MLflow runs: declarative specs in ``dashboards/`` → paper figures.

    from pdmask.figures import build_figure
    result = build_figure("figure-1")           # sweep main-figure, the project's MLflow store
    result.paths["png"], result.paths["data_csv"], result.paths["manifest"]

Modules, in the order data flows through them: ``spec`` (the YAML schema), ``runs`` (which runs,
which cell), ``history`` (metric histories via a cache), ``metric_names`` (``@`` vs ``_at_``),
``series`` (per-step statistics), ``cells`` / ``panels`` (what is drawn), ``render``
(matplotlib), ``summary`` (the table), ``build`` (all of it, plus the files written).
"""

from pdmask.figures.build import FigureResult, build_figure
from pdmask.figures.spec import FigureSpec, available_specs, figures_for_sweep, load_spec
from pdmask.figures.styles import MethodStyle, resolve_styles

__all__ = [
    "FigureResult",
    "FigureSpec",
    "MethodStyle",
    "available_specs",
    "build_figure",
    "figures_for_sweep",
    "load_spec",
    "resolve_styles",
]
