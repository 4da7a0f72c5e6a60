"""The committed JSON Schemas (schemas/) are current, every shipped YAML names and satisfies its
schema, and the schema's names (methods, models, precisions) refuse a file that uses others.

Editors read the first line (`# yaml-language-server: $schema=...`) and mostly implement JSON
Schema draft 7, pydantic emits 2020-12: each file is checked under both.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from .conftest import ROOT, pdm

FORMS = {"sweep": "sweeps", "dashboard": "dashboards"}  # schema name -> folder of its files
SHIPPED = [
    (form, path) for form, folder in FORMS.items() for path in (ROOT / folder).glob("*.yaml")
]


def schema_line(form: str) -> str:
    return f"# yaml-language-server: $schema=../schemas/{form}.schema.json"


def committed(form: str) -> dict:
    return json.loads((ROOT / "schemas" / f"{form}.schema.json").read_text())


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


def test_committed_schemas_are_what_pdm_schema_writes(tmp_path):
    done = pdm("schema", "--out", str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == sorted(p.name for p in (ROOT / "schemas").glob("*.json")), (
        f"pdm schema writes {written}: run `pdm schema` and commit schemas/"
    )
    assert written == [f"{form}.schema.json" for form in sorted(FORMS)]
    for name in written:
        assert (tmp_path / name).read_text() == (ROOT / "schemas" / name).read_text(), (
            f"schemas/{name} is stale (the models or the project's names changed): run "
            "`pdm schema` and commit schemas/"
        )


def test_the_schemas_name_the_projects_methods_models_and_precisions():
    from pdmask.registry import MODELS, PRECISIONS, load_registry

    defs = committed("sweep")["$defs"]
    assert defs["Axis.method"]["enum"] == sorted(load_registry(ROOT).recipes)
    assert defs["Axis.model"]["enum"] == sorted(MODELS)
    assert defs["Axis.precision"]["enum"] == sorted(PRECISIONS)
    panel = committed("dashboard")["$defs"]["PanelSpec"]["properties"]
    assert panel["model"]["enum"] == sorted(MODELS)


@pytest.mark.parametrize(("form", "path"), SHIPPED, ids=lambda x: getattr(x, "name", x))
def test_every_shipped_file_starts_with_its_schema_line_and_validates(form, path):
    first = path.read_text(encoding="utf-8").splitlines()[0]
    assert first == schema_line(form), f"{path.name}: the first line must be {schema_line(form)!r}"
    target = (path.parent / first.split("$schema=", 1)[1]).resolve()
    assert target.is_file(), f"{path.name} names {target}, which does not exist"
    problems = errors(json.loads(target.read_text()), yaml.safe_load(path.read_text()))
    assert not problems, f"{path.name}:\n" + "\n".join(problems)


def test_every_form_has_shipped_files():
    assert {form for form, _ in SHIPPED} == set(FORMS)


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
