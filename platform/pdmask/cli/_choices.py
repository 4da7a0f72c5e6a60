"""What a command-line value can be, read from where it lives, when a command needs it.

Two kinds:

- **Choice types** (``Backend``, ``Profile``, ``Cluster``): ``Literal`` types made
  from the registry's own lists, for option annotations. They are module attributes resolved on
  first use, i.e. when typer builds a command, so listing the commands never imports the registry.
  Write them as ``_choices.Backend`` in an annotation (annotations are evaluated lazily).
- **Completions** of names that live in files (sweeps, recipes, dashboards), for
  ``autocompletion=``: each reads the project's registry when the shell asks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal


def _backends() -> list[str]:
    from pdmask.registry.backends import BACKENDS

    return sorted(BACKENDS)


def _profiles() -> list[str]:
    from pdmask.registry.sweeps import SIM_PROFILES

    return list(SIM_PROFILES)


def _clusters() -> list[str]:
    from pdmask.registry import CLUSTERS

    return sorted(CLUSTERS)


_SOURCES: dict[str, Callable[[], list[str]]] = {
    "Backend": _backends,
    "Profile": _profiles,
    "Cluster": _clusters,
}


def __getattr__(name: str):
    if name not in _SOURCES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    choice = Literal[tuple(_SOURCES[name]())]
    globals()[name] = choice  # resolved once per process
    return choice


def _matching(incomplete: str, named: dict[str, str]) -> list[tuple[str, str]]:
    return [(name, help_) for name, help_ in sorted(named.items()) if name.startswith(incomplete)]


def complete_sweep(incomplete: str) -> list[tuple[str, str]]:
    """Sweep names of the project's ``sweeps/``, with their descriptions."""
    from pdmask.registry import load_registry

    sweeps = load_registry().sweeps
    return _matching(incomplete, {name: s.description for name, s in sweeps.items()})


def complete_recipe(incomplete: str) -> list[tuple[str, str]]:
    """Recipe names of the project's ``recipes/``, with their summaries."""
    from pdmask.registry import load_registry

    recipes = load_registry().recipes
    return _matching(incomplete, {name: r.summary for name, r in recipes.items()})


def complete_dashboard(incomplete: str) -> list[tuple[str, str]]:
    """Figure spec names of the project's ``dashboards/``."""
    from pdmask.registry import load_registry

    dashboards = load_registry().dashboards
    return _matching(incomplete, {name: str(path.name) for name, path in dashboards.items()})
