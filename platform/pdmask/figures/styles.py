"""Method styles (display name, colour): from the recipe registry, else a fixed palette.

A method keeps one colour across every panel and every figure, so colours are looked up by recipe
name, never assigned by position within a panel. The recipes are the only home of a method's
name and colour; the palette is only for runs whose recipe is no longer in ``recipes/``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from matplotlib.colors import is_color_like


@dataclass(frozen=True)
class MethodStyle:
    """How one method (recipe) is drawn."""

    display_name: str
    color: str


# Colour-blind-safe (Okabe-Ito, then Tol's muted) colours for methods without a recipe, in the
# order the figure lists them, skipping colours already in use.
EXTRA_COLORS = ("#E69F00", "#CC79A7", "#56B4E9", "#F0E442", "#000000", "#882255", "#44AA99")


def _registry_styles(methods: Iterable[str]) -> dict[str, MethodStyle]:
    """Styles declared in the recipe registry, for the methods it knows; {} if unavailable."""
    try:
        from pdmask.registry import load_registry
    except ImportError:
        return {}
    try:
        recipes = load_registry().recipes
    except AttributeError:  # the registry's API is not the expected one (yet)
        return {}
    found: dict[str, MethodStyle] = {}
    for method in methods:
        recipe = recipes.get(method) if hasattr(recipes, "get") else None
        name = getattr(recipe, "display_name", None)
        color = getattr(recipe, "color", None)
        if recipe is not None and name and color and is_color_like(color):
            found[method] = MethodStyle(str(name), str(color))
    return found


def resolve_styles(
    methods: Iterable[str],
    styles: Mapping[str, MethodStyle] | None = None,
    *,
    use_registry: bool = True,
) -> dict[str, MethodStyle]:
    """One style per method: the given ``styles`` first, then the recipes, then the palette."""
    methods = list(methods)
    chosen: dict[str, MethodStyle] = {}
    if styles:
        chosen.update({m: styles[m] for m in methods if m in styles})
    missing = [m for m in methods if m not in chosen]
    if missing and use_registry:
        chosen.update(_registry_styles(missing))
    used = {s.color.lower() for s in chosen.values()}
    spare = [c for c in EXTRA_COLORS if c.lower() not in used]
    for method in methods:
        if method in chosen:
            continue
        chosen[method] = MethodStyle(method, spare.pop(0) if spare else "#333333")
        used.add(chosen[method].color.lower())
    return chosen
