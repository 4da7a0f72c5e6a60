"""Recipe files: read once, executed from that text, hashed by what their code does.

A recipe is read from its file **once** (per sweep: when the sweep is planned) and every later use
executes that same text -- the trial carries it (``RecipeSource``), so a file edited while a sweep
runs changes nothing in that sweep, and a VeRL job carries the same text to its workers.

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
import sys
import traceback
import types
from functools import lru_cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pdmask.errors import Problem, validation_problems
from pdmask.registry.recipes import COSMETIC_FIELDS, COSMETIC_PARAM_FIELDS, Recipe

# Files in recipes/ that are not recipes and are left alone: hidden files, `_helpers.py`,
# `__pycache__/`, and documentation.
IGNORED_PREFIXES = (".", "_")
DOC_SUFFIXES = (".md",)


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


@lru_cache(maxsize=256)
def recipe_from_source(label: str, text: str) -> Recipe:
    """Execute a recipe file's ``text`` (compiled as ``label``, which tracebacks then name) and
    return its ``RECIPE``. The same text gives the same object. Raises what the file raises."""
    source = RecipeSource.of(Path(label).name, text)
    stem = Path(label).stem.replace("-", "_")
    # One module per version of a file: an edited recipe never replaces a loaded one.
    module_name = f"pdmask_recipe_{stem}_{source.hash}"
    module = types.ModuleType(module_name)
    module.__file__ = label
    sys.modules[module_name] = module  # pydantic and pickling look a module up by name
    code = compile(text, label, "exec")
    exec(code, module.__dict__)
    recipe = module.__dict__.get("RECIPE")
    if not isinstance(recipe, Recipe):
        raise TypeError("the file must define RECIPE = Recipe(...)")
    recipe._origin = label
    recipe._source = source
    recipe._line = _assignment_line(text)
    return recipe


def _assignment_line(text: str) -> int | None:
    for node in ast.parse(text).body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if any(isinstance(t, ast.Name) and t.id == "RECIPE" for t in targets):
            return node.lineno
    return None


def load_recipe_file(path: Path) -> tuple[Recipe | None, list[Problem]]:
    """Read one recipe file once and execute that text; problems name the file and line."""
    label = str(path)
    try:
        text = path.read_text()
    except OSError as err:
        return None, [Problem(label, "(file)", f"cannot read: {err.strerror}")]
    try:
        return recipe_from_source(label, text), []
    except SyntaxError as err:
        return None, [Problem(label, "(module)", f"SyntaxError: {err.msg}", err.lineno)]
    except ValidationError as err:
        line = _line_in(err.__traceback__, label)
        return None, validation_problems(err, label, line_of=lambda _: line, whole="RECIPE")
    except Exception as err:  # a broken recipe must not hide the others' problems
        line = _line_in(err.__traceback__, label)
        field = "RECIPE" if isinstance(err, TypeError) and "RECIPE" in str(err) else "(module)"
        return None, [Problem(label, field, f"{type(err).__name__}: {err}", line)]


def _line_in(tb, label: str) -> int | None:
    frames = [f for f in traceback.extract_tb(tb) if f.filename == label]
    return frames[-1].lineno if frames else None


def discover_recipes(folder: Path) -> tuple[dict[str, Recipe], dict[str, Path], list[Problem]]:
    """Every recipe in ``folder``, validated; every problem at once, a stray file included."""
    recipes: dict[str, Recipe] = {}
    sources: dict[str, Path] = {}
    problems: list[Problem] = []
    if not folder.is_dir():
        return recipes, sources, [Problem(str(folder), "(folder)", "recipes folder not found")]
    for path in sorted(folder.iterdir()):
        if path.name.startswith(IGNORED_PREFIXES) or path.suffix in DOC_SUFFIXES:
            continue
        if path.is_dir() or path.suffix != ".py":
            problems.append(
                Problem(
                    str(path),
                    "(file)",
                    "not a recipe: recipes/ holds one Python file (*.py) per method, each "
                    "defining RECIPE = Recipe(...); move this elsewhere (or prefix it with '_')",
                )
            )
            continue
        recipe, errs = load_recipe_file(path)
        problems += errs
        if recipe is None:
            continue
        if recipe.name in recipes:
            problems.append(
                Problem(
                    str(path),
                    "name",
                    f"{recipe.name!r} is also declared in {sources[recipe.name]}",
                    recipe._line,
                )
            )
            continue
        recipes[recipe.name] = recipe
        sources[recipe.name] = path
    return recipes, sources, problems
