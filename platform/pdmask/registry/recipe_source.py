"""A recipe file's text as planned, and the identity of its code.

**Identity of the code.** ``RecipeSource.hash`` is part of every trial's identity: editing what a
recipe does turns its trials back to `todo`. It hashes a *normalised* form of the source -- the
abstract syntax tree, dumped without positions, with docstrings removed and without the
``Recipe(...)`` arguments that only say how a method is drawn or described (``display_name``,
``color``, ``summary``, ``launch``) and the ``description`` of each ``Param(...)``. Why: comments, blank lines, formatting (``ruff format``),
docstrings and colours never change a mask or a loss, and re-running a sweep because a comment
changed would waste hours; everything else (names, constants, imports, parameter defaults) can,
so it counts. The dump leaves out empty optional fields, so a Python release that adds a new
optional syntax field does not change the hash of code that does not use it. What the hash
cannot see is code outside the file (pdmask itself, installed packages): ``pdm.git_sha`` and the
package-version tags record that.
"""

from __future__ import annotations

import ast
import hashlib

from pydantic import BaseModel, ConfigDict, Field

# Recipe fields that change how a method is drawn or described, never what it trains: excluded
# from the hash of a recipe's source (``normalised_source``).
COSMETIC_FIELDS = frozenset({"display_name", "color", "summary", "launch"})
# ``Param(...)`` arguments that only describe a parameter (never part of a trial's identity).
COSMETIC_PARAM_FIELDS = frozenset({"description"})


class RecipeSource(BaseModel):
    """A recipe file's text as it was read, and the hash of its normalised code."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    file: str = Field(description="The file's name in recipes/, e.g. `pdm_agg.py` (cosmetic).")
    text: str = Field(description="The file's text as read when the sweep was planned.")
    hash: str = Field(
        description="sha256 (16 hex) of the normalised code: part of the trial's identity."
    )

    @classmethod
    def of(cls, file: str, text: str) -> RecipeSource:
        return cls(file=file, text=text, hash=source_hash(text))


def _strip(tree: ast.AST) -> None:
    """Remove docstrings and the cosmetic ``Recipe(...)`` and ``Param(...)`` arguments, in place."""
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = body[0] if body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                node.body = body[1:] or [ast.Pass()]
        if isinstance(node, ast.Call):
            func = node.func
            callee = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            cosmetic = {"Recipe": COSMETIC_FIELDS, "Param": COSMETIC_PARAM_FIELDS}.get(callee)
            if cosmetic:
                node.keywords = [k for k in node.keywords if k.arg not in cosmetic]


def _dump(node) -> str:
    if isinstance(node, ast.AST):
        fields = [
            f"{name}={_dump(value)}"
            for name, value in ast.iter_fields(node)
            if value is not None and value != [] and name != "ctx"
        ]
        return f"{type(node).__name__}({','.join(fields)})"
    if isinstance(node, list):
        return "[" + ",".join(_dump(x) for x in node) + "]"
    return repr(node)


def normalised_source(text: str) -> str:
    """What the hash covers (see the module docstring). Raises SyntaxError like ``compile``."""
    tree = ast.parse(text)
    _strip(tree)
    return _dump(tree)


def source_hash(text: str) -> str:
    """sha256 (16 hex digits) of ``normalised_source(text)``; of the raw text if it does not parse
    (such a file never trains, but its problem is reported with a stable identity)."""
    try:
        canonical = normalised_source(text)
    except SyntaxError:
        canonical = text
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]
