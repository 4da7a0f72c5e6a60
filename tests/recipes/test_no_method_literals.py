"""Recipes are the only list of methods: no code outside ``recipes/`` names one literally.

Every string constant of the package's code is checked for a method's name (a recipe name, or
its verl loss name) as a whole word. Documentation may name methods: docstrings, and the
``description=``/``help=`` texts of fields and flags. Tests, benchmarks (which measure named
methods), and the sweeps and dashboards YAML (data that selects methods, validated against the
recipes) are outside the package and not checked. verl's own loss names (``VERL_OWN_LOSSES``) are
verl's vocabulary, not pdmask's methods, even where a recipe shares one (``gspo``, ``cispo``).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from pdmask.registry import load_registry

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "platform" / "pdmask"
DOC_KEYWORDS = {"description", "help"}
VERLS_VOCABULARY = {"VERL_OWN_LOSSES"}


def method_names() -> set[str]:
    recipes = load_registry(ROOT).recipes
    return set(recipes) | {r.verl_name for r in recipes.values() if r.verl_loss_mode is None}


def exempt_constants(tree: ast.AST) -> set[int]:
    """ids of the string constants that are documentation or verl's vocabulary."""
    exempt: set[int] = set()
    for node in ast.walk(tree):
        # A bare string statement documents: docstrings, and attribute docstrings after fields.
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            exempt.add(id(node.value))
        if isinstance(node, ast.keyword) and node.arg in DOC_KEYWORDS:
            exempt |= {id(n) for n in ast.walk(node.value)}
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id in VERLS_VOCABULARY for t in node.targets
        ):
            exempt |= {id(n) for n in ast.walk(node.value)}
    return exempt


def literal_mentions(path: Path, names: set[str]) -> list[str]:
    tree = ast.parse(path.read_text())
    exempt = exempt_constants(tree)
    pattern = re.compile(
        r"(?<![\w-])("
        + "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
        + r")(?![\w-])"
    )
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in exempt
        ):
            for match in pattern.finditer(node.value):
                where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
                found.append(f"{where}:{node.lineno}: {match.group(1)!r}")
    return found


def test_no_code_outside_recipes_names_a_method():
    names = method_names()
    assert {"pdm-agg", "grpo-clip-higher", "cispo", "pdm_agg"} <= names
    found = [hit for path in sorted(PACKAGE.rglob("*.py")) for hit in literal_mentions(path, names)]
    assert not found, (
        "methods named outside recipes/ (derive them from the recipes):\n" + "\n".join(found)
    )


def test_the_check_finds_a_literal(tmp_path):
    """Non-vacuous: a name-based special case is found, a docstring mention is not."""
    code = tmp_path / "special.py"
    code.write_text(
        '"""Mentions pdm-agg in a docstring: fine."""\n\n'
        "def loss_mode(method):\n"
        '    return "vanilla" if method == "grpo-clip-higher" else method\n'
    )
    hits = literal_mentions(code, method_names())
    assert len(hits) == 1 and "special.py:4: 'grpo-clip-higher'" in hits[0], hits
