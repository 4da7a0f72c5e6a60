"""Recipe files: read once, executed from that text, hashed by what their code does.

A recipe is read from its file **once** (per sweep: when the sweep is planned) and every later use
executes that same text -- the trial carries it (``RecipeSource``), so a file edited while a sweep
runs changes nothing in that sweep, and a VeRL job carries the same text to its workers.

The identity of a recipe's code (what its hash covers) is ``recipe_source.py``'s.
"""

from __future__ import annotations

import ast
import sys
import traceback
import types
from contextlib import suppress
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from pydantic import ValidationError

from pdmask.errors import Problem, known_names, validation_problems
from pdmask.registry.recipe_source import RecipeSource
from pdmask.registry.recipes import Param, Recipe

# Files in recipes/ that are not recipes and are left alone: hidden files, `_helpers.py`,
# `__pycache__/`, and documentation.
IGNORED_PREFIXES = (".", "_")
DOC_SUFFIXES = (".md",)


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
        return None, _declaration_problems(err, label, line)
    except Exception as err:  # a broken recipe must not hide the others' problems
        line = _line_in(err.__traceback__, label)
        field = "RECIPE" if isinstance(err, TypeError) and "RECIPE" in str(err) else "(module)"
        return None, [Problem(label, field, f"{type(err).__name__}: {err}", line)]


# The classes a recipe file calls with keywords, by name (a ValidationError's ``title``).
_DECLARATIONS = {cls.__name__: cls for cls in (Param, Recipe)}


def _declaration_problems(err: ValidationError, label: str, line: int | None) -> list[Problem]:
    """A failed ``Param(...)`` or ``Recipe(...)`` call's problems; a misspelt keyword named as
    one, with the keywords meant (pydantic says only "Extra inputs are not permitted")."""
    problems = validation_problems(err, label, line_of=lambda _: line, whole="RECIPE")
    cls = _DECLARATIONS.get(err.title)
    if cls is None:
        return problems
    for i, error in enumerate(err.errors()):
        if error["type"] == "extra_forbidden" and len(error["loc"]) == 1:
            keyword = str(error["loc"][0])
            problems[i] = Problem(
                label,
                f"{cls.__name__}({keyword}=...)",
                f"{cls.__name__} has no keyword {keyword!r}; {known_names(keyword, cls.model_fields)}",
                line,
            )
    return problems


def declared_name(text: str) -> str | None:
    """The method name a recipe file's ``Recipe(name=...)`` call spells, read without running
    the file: a file that fails to load still says which method it is, so a sweep naming that
    method is told the file is broken, not that the method is unknown."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        callee = (
            node.func.attr
            if isinstance(node.func, ast.Attribute)
            else getattr(node.func, "id", None)
        )
        if callee != "Recipe":
            continue
        for keyword in node.keywords:
            if keyword.arg == "name" and isinstance(keyword.value, ast.Constant):
                return str(keyword.value.value)
    return None


def _line_in(tb, label: str) -> int | None:
    frames = [f for f in traceback.extract_tb(tb) if f.filename == label]
    return frames[-1].lineno if frames else None


@dataclass
class RecipeFolder:
    """What ``recipes/`` holds: the recipes that load, their files, every problem, and the
    methods whose files do not load (name -> file, as ``declared_name`` reads it)."""

    recipes: dict[str, Recipe] = field(default_factory=dict)
    files: dict[str, Path] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    broken: dict[str, Path] = field(default_factory=dict)


def discover_recipes(folder: Path) -> RecipeFolder:
    """Every recipe in ``folder``, validated; every problem at once, a stray file included."""
    found = RecipeFolder()
    recipes, sources, problems = found.recipes, found.files, found.problems
    if not folder.is_dir():
        problems.append(Problem(str(folder), "(folder)", "recipes folder not found"))
        return found
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
            with suppress(OSError, UnicodeDecodeError):
                if name := declared_name(path.read_text()):
                    found.broken.setdefault(name, path)
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
    for name in recipes:  # a method that one file declares and loads is not broken
        found.broken.pop(name, None)
    return found
