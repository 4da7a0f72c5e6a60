"""The committed JSON Schemas (schemas/) are current for the files they name, every sweep and
dashboard they name starts with its schema line and validates, and the schema's names (methods,
models, precisions) refuse a file that uses others.

Editors read the first line (`# yaml-language-server: $schema=...`) and mostly implement JSON
Schema draft 7, pydantic emits 2020-12: each file is checked under both.

A user's own recipe, sweep or dashboard changes no verdict here (README: "nothing else
changes"): the committed schemas are held to the recipes, sweeps and dashboards they name, so a
file they do not name yet is the user's, not a stale schema, until `pdm schema` names it.
`pdm schema --check` (CI's) holds them to every file of the project.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import jsonschema
import pytest
import yaml

from pdmask.cli.schema import FORMS, schema_line, schema_text, schemas
from pdmask.registry.sweep_schema import named_files

from .conftest import ROOT, pdm


def committed(form: str) -> dict:
    return json.loads((ROOT / "schemas" / f"{form}.schema.json").read_text())


def _named() -> dict[str, list[str]]:
    return named_files({form: committed(form) for form in FORMS})


# The sweeps and dashboards the committed schemas name (those the project shipped with them).
NAMED = [
    (form, ROOT / folder / f"{name}.yaml")
    for form, folder in FORMS.items()
    for name in _named()[folder.removesuffix("s")]
    if (ROOT / folder / f"{name}.yaml").is_file()
]


@cache
def current() -> dict[str, dict]:
    """The schemas `pdm schema` would write now, for every file of the project."""
    return schemas(ROOT)


def validators(schema: dict) -> list[jsonschema.protocols.Validator]:
    declared = jsonschema.validators.validator_for(schema)
    declared.check_schema(schema)
    jsonschema.Draft7Validator.check_schema(schema)
    return [declared(schema), jsonschema.Draft7Validator(schema)]


def _leaves(error: jsonschema.ValidationError):
    """The innermost errors: an `anyOf` (a grid node) reports why each branch failed."""
    if not error.context:
        yield error
    for sub in error.context:
        yield from _leaves(sub)


def errors(schema: dict, document: object) -> list[str]:
    """Every validator's innermost error messages (a file must pass or fail under each)."""
    return [
        f"{v.__class__.__name__} at {list(leaf.absolute_path)}: {leaf.message[:300]}"
        for v in validators(schema)
        for e in v.iter_errors(document)
        for leaf in _leaves(e)
    ]


def test_committed_schemas_are_what_pdm_schema_writes_for_the_files_they_name():
    names = (ROOT / "schemas").glob("*.json")
    assert sorted(p.name for p in names) == [f"{form}.schema.json" for form in sorted(FORMS)]
    for form, body in schemas(ROOT, only=_named()).items():
        assert schema_text(body) == (ROOT / "schemas" / f"{form}.schema.json").read_text(), (
            f"schemas/{form}.schema.json is stale (the models, the catalog or a shipped recipe, "
            "sweep or dashboard changed): run `pdm schema` and commit schemas/"
        )


def test_the_schemas_name_the_catalogs_models_and_precisions():
    from pdmask.registry import MODELS, PRECISIONS, load_registry

    defs = committed("sweep")["$defs"]
    assert set(defs["Axis.method"]["enum"]) <= set(load_registry(ROOT).recipes)
    assert {"pdm-agg", "dppo-topk-kl", "grpo-clip-higher"} <= set(defs["Axis.method"]["enum"])
    assert defs["Axis.model"]["enum"] == sorted(MODELS)
    assert defs["Axis.precision"]["enum"] == sorted(PRECISIONS)
    panel = committed("dashboard")["$defs"]["PanelSpec"]["properties"]
    assert panel["model"]["enum"] == sorted(MODELS)


@pytest.mark.parametrize(("form", "path"), NAMED, ids=lambda x: getattr(x, "name", x))
def test_every_named_file_starts_with_its_schema_line_and_validates(form, path):
    first = path.read_text(encoding="utf-8").splitlines()[0]
    assert first == schema_line(form), f"{path.name}: the first line must be {schema_line(form)!r}"
    target = (path.parent / first.split("$schema=", 1)[1]).resolve()
    assert target.is_file(), f"{path.name} names {target}, which does not exist"
    # against what `pdm schema` writes now: a shipped sweep a user edited to run their own
    # recipe is valid, and stays so once `pdm schema` has named it
    problems = errors(current()[form], yaml.safe_load(path.read_text()))
    assert not problems, f"{path.name}:\n" + "\n".join(problems)


def test_the_schemas_name_shipped_files_of_every_form():
    assert {form for form, _ in NAMED} == set(FORMS)
    assert {"main-figure.yaml", "figure-1.yaml"} <= {path.name for _, path in NAMED}


def _main_figure() -> dict:
    return yaml.safe_load((ROOT / "sweeps" / "main-figure.yaml").read_text())


def _wrong_sweeps() -> dict[str, tuple[dict, str]]:
    """A shipped sweep with one mistake each, and what the error about it says."""
    out: dict[str, tuple[dict, str]] = {}

    def wrong(label: str, needle: str):
        doc = _main_figure()
        out[label] = (doc, needle)
        return doc

    wrong("unknown method", "'pdm-nope' is not one of")["grid"]["union"][0]["product"][0]["method"][
        0
    ] = "pdm-nope"
    zipped = wrong("unknown model in a zip", "'qwen3-70b' is not one of")["grid"]["union"][0][
        "product"
    ][1]["zip"]
    zipped["model"][0] = "qwen3-70b"
    wrong("unknown precision", "'fp4' is not one of")["grid"]["union"][1]["product"][1]["zip"][
        "precision"
    ] = ["fp4"] * 4
    axes = wrong("misspelled axis", "'modle' was unexpected")["grid"]["union"][0]["product"][1][
        "zip"
    ]
    axes["modle"] = axes.pop("model")
    wrong("misspelled key", "'seed' was unexpected")["seed"] = 3
    wrong("unknown parameter", "'params.topkk' was unexpected")["grid"]["union"][0]["product"][
        2
    ] = {"params.topkk": [20]}
    wrong("unknown profile", "'defualt' is not one of")["profile"] = "defualt"
    wrong("unknown dashboard", "'figure-99' is not one of")["figures"] = ["figure-99"]
    wrong("repeated value", "has non-unique elements")["grid"]["union"][1]["product"][0][
        "method"
    ] = [
        "pdm-agg",
        "pdm-agg",
    ]
    wrong("override of an unknown method", "'pdm-nope' is not one of")["overrides"] = [
        {"where": {"method": "pdm-nope"}, "set": {"delta": 0.1}}
    ]
    return out


def test_the_unchanged_sweep_validates():  # so each refusal below is its one mistake's
    assert not errors(committed("sweep"), _main_figure())


@pytest.mark.parametrize("label", sorted(_wrong_sweeps()))
def test_a_wrong_sweep_does_not_validate(label):
    doc, needle = _wrong_sweeps()[label]
    problems = errors(committed("sweep"), doc)
    assert problems, f"{label}: the schema accepted it"
    # Both validators refuse it, each with the message about the mistake.
    assert {p.split(" at ")[0] for p in problems} == {"Draft202012Validator", "Draft7Validator"}
    for name in ("Draft202012Validator", "Draft7Validator"):
        assert any(p.startswith(name) and needle in p for p in problems), (name, problems)


def test_a_wrong_dashboard_does_not_validate():
    schema = committed("dashboard")
    good = yaml.safe_load((ROOT / "dashboards" / "figure-1.yaml").read_text())
    for change, needle in (
        (lambda d: d["methods"].append("pdm-nope"), "'pdm-nope' is not one of"),
        (lambda d: d["panels"][0].update(precision="fp4"), "'fp4' is not one of"),
        (lambda d: d.update(method=["pdm-agg"]), "'method' was unexpected"),
        (
            lambda d: d["linestyles"].update({"pdm-unu": "dashed"}),
            "'pdm-unu' is not one of",
        ),  # `methods`, misspelled
    ):
        doc = copy.deepcopy(good)
        change(doc)
        problems = errors(schema, doc)
        assert any(needle in p for p in problems), (needle, problems)


OWN_RECIPE = """from pdmask.registry import Recipe
from pdmask.registry.common_params import DELTA

RECIPE = Recipe(
    name="own-method",
    display_name="Own",
    color="#123456",
    summary="A recipe only this project has.",
    proximity="kl_topk",
    direction="ratio",
    params={"delta": DELTA},
    needs=("behaviour_topk",),
)
"""


def test_a_projects_schema_has_its_own_recipes(project: Path, tmp_path: Path):
    (project / "recipes" / "own_method.py").write_text(OWN_RECIPE)
    (project / "recipes" / "gspo.py").unlink()
    out = tmp_path / "schemas"
    done = pdm("schema", "--out", str(out), project=project)
    assert done.returncode == 0, done.stdout + done.stderr
    own = json.loads((out / "sweep.schema.json").read_text())
    methods = own["$defs"]["Axis.method"]["enum"]
    assert "own-method" in methods and "gspo" not in methods
    doc = _main_figure()
    doc["grid"]["union"][0]["product"][0]["method"] = ["own-method"]
    assert not errors(own, doc)
    assert any("'own-method' is not one of" in p for p in errors(committed("sweep"), doc))
    # pdm schema's default folder is the project's own.
    assert pdm("schema", project=project).returncode == 0
    assert (project / "schemas" / "sweep.schema.json").read_text() == json.dumps(
        own, indent=2
    ) + "\n"


def test_a_shipped_files_errors_still_name_its_line(project: Path):
    """The schema line is a comment: the loader skips it and counts it, so an error in a shipped
    file names the line an editor shows."""
    path = project / "sweeps" / "main-figure.yaml"
    lines = path.read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if "method: [grpo-clip-higher," in line)
    lines[at] = lines[at].replace("grpo-clip-higher", "pdm-nope")
    path.write_text("".join(lines))
    done = pdm("validate", "main-figure", project=project)
    assert done.returncode == 2, done.stdout + done.stderr
    assert (
        f"main-figure.yaml:{at + 1}: grid.union.0.product.0.method.0: unknown method 'pdm-nope'"
        in (done.stdout + done.stderr)
    )


# -- a user's own files ----------------------------------------------------------------------


def _readme_block(opening: str, after: str = "") -> str:
    """The README's code block whose first line is ``opening`` (after the text ``after``)."""
    text = (ROOT / "README.md").read_text()
    start = text.index(opening, text.index(after) if after else 0)
    return text[start : text.index("```", start)]


def users_files(project: Path) -> None:
    """README's own example, as written: `recipes/hard_topk_kl.py` and `sweeps/mine.yaml`."""
    recipe = _readme_block("# recipes/hard_topk_kl.py")
    sweep = _readme_block("name: mine", after="Then use it in a sweep")
    (project / "recipes" / "hard_topk_kl.py").write_text(recipe.split("\n", 1)[1])
    (project / "sweeps" / "mine.yaml").write_text(sweep)


OWN_SWEEP = """name: own
description: a sweep of this project alone
grid: {method: [own-method, pdm-agg], model: [qwen3-4b-base], precision: [bf16]}
"""


def test_pdm_schema_check_and_the_schema_line(project: Path):
    assert pdm("schema", project=project).returncode == 0
    assert pdm("schema", "--check", project=project).returncode == 0
    (project / "recipes" / "own_method.py").write_text(OWN_RECIPE)
    (project / "sweeps" / "own.yaml").write_text(OWN_SWEEP)
    done = pdm("schema", "--check", project=project)
    assert done.returncode == 1 and "sweep.schema.json is stale" in done.stderr, done.stderr
    assert (project / "sweeps" / "own.yaml").read_text() == OWN_SWEEP  # --check writes nothing
    done = pdm("schema", project=project)
    assert done.returncode == 0 and "added the schema line to" in done.stdout, done.stdout
    assert (project / "sweeps" / "own.yaml").read_text() == schema_line("sweep") + "\n" + OWN_SWEEP
    assert pdm("schema", "--check", project=project).returncode == 0
    assert pdm("validate", "own", project=project).returncode == 0  # the line is a comment


@pytest.mark.slow
def test_a_users_recipe_and_sweep_leave_these_tests_green(tmp_path: Path):
    """README's example recipe and sweep dropped into a copy of the project (its tests too):
    this module passes there, before `pdm schema` and after it, and so does the new-recipe
    module (which writes a recipe of the same name and lists the sweeps that use it)."""
    copy_ = tmp_path / "project"
    for name in ("recipes", "sweeps", "dashboards", "schemas", "tests/registry"):
        shutil.copytree(ROOT / name, copy_ / name)
    for name in ("pyproject.toml", "README.md", "tests/__init__.py", "tests/conftest.py"):
        shutil.copy(ROOT / name, copy_ / name)
    users_files(copy_)
    env = {**os.environ, "PDM_PROJECT": str(copy_), "PDM_HOME": str(copy_ / ".pdm")}
    run = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider"]
    module = ["tests/registry/test_schema_files.py", "-k", "not users_recipe"]
    for stage in ("before `pdm schema`", "after `pdm schema`"):
        modules = [*module, "tests/registry/test_new_recipe.py"] if "before" in stage else module
        done = subprocess.run([*run, *modules], cwd=copy_, env=env, capture_output=True, text=True)
        assert done.returncode == 0, (stage, done.stdout[-3000:])
        assert " passed" in done.stdout.splitlines()[-1]
        if stage.startswith("before"):
            schema = [sys.executable, "-m", "pdmask", "schema"]
            subprocess.run(schema, cwd=copy_, env=env, check=True, capture_output=True)
            names = json.loads((copy_ / "schemas" / "sweep.schema.json").read_text())
            assert "hard-topk-kl" in names["$defs"]["Axis.method"]["enum"]
