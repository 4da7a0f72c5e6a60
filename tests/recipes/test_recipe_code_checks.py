"""Recipe code runs before anything launches: every problem names the file, function and line, and
`pdm validate`, `pdm sweep` and `pdm recipes list` refuse or report a broken recipe."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pdmask.errors import RecipeError
from pdmask.registry import load_registry
from pdmask.registry.recipe_check import check_recipes
from pdmask.registry.recipe_files import load_recipe_file
from tests.registry.conftest import ROOT, pdm

from .recipe_writing import recipe_call, write

# -- recipe code runs before anything launches ---------------------------------------------------

WRONG_SHAPE = """
def per_sequence(batch):
    return batch.stats.kl_topk.max(-1).values > 0.1  # [B], not [B, T]


""" + recipe_call("wrong-shape", "mask=per_sequence")

NAN_ON_SHORT = """
def unstable(batch):
    per_row = batch.sequence_sum(batch.log_prob) / (batch.sequence_lengths - 1)
    return -batch.advantages * batch.per_token(per_row)


""" + recipe_call("nan-on-short", "loss=unstable")

DETACHED = """
def detached(batch):
    return -batch.advantages * batch.stats.ratio


""" + recipe_call("detached", "loss=detached")

RAISES = """
def broken(batch):
    value = batch.params["missing"]
    return batch.response_mask


""" + recipe_call("raises", "mask=broken")


RANDOM_MASK = """
import torch


def coin(batch):
    return torch.rand(batch.response_mask.shape) < 0.5


""" + recipe_call("random-mask", "mask=coin")

FP8_ONLY_BUG = """
def only_in_fp8_rollout(batch):
    if batch.precision == "fp8-rollout":
        return batch.response_mask[:, 0]
    return batch.response_mask & False


""" + recipe_call("fp8-only", "mask=only_in_fp8_rollout")


def test_recipe_code_problems_name_the_file_function_and_line(project):
    paths = {
        "wrong-shape": write(project, "wrong_shape", WRONG_SHAPE),
        "nan-on-short": write(project, "nan_on_short", NAN_ON_SHORT),
        "detached": write(project, "detached", DETACHED),
        "raises": write(project, "raises", RAISES),
        "random-mask": write(project, "random_mask", RANDOM_MASK),
        "fp8-only": write(project, "fp8_only", FP8_ONLY_BUG),
    }
    reg = load_registry(project)
    assert not reg.recipe_problems  # their fields are fine: only running them shows the bugs
    problems = {Path(p.file).stem: p for p in check_recipes(reg.recipes)}
    assert set(problems) == {p.stem for p in paths.values()}, problems
    lines = {name: path.read_text().splitlines() for name, path in paths.items()}

    def line_of(name, text):
        return 1 + next(i for i, line in enumerate(lines[name]) if text in line)

    shape = problems["wrong_shape"]
    assert shape.field == "mask" and "shape (4,)" in shape.message and "[B, T]" in shape.message
    assert shape.line == line_of("wrong-shape", "def per_sequence")
    nan = problems["nan_on_short"]
    assert nan.field == "loss" and "not finite" in nan.message
    assert nan.line == line_of("nan-on-short", "def unstable")
    assert "no gradient" in problems["detached"].message
    raised = problems["raises"]
    assert "KeyError" in raised.message and raised.line == line_of("raises", 'params["missing"]')
    random = problems["random_mask"]
    assert random.field == "mask" and "draws from torch's" in random.message
    assert random.line == line_of("random-mask", "def coin")
    fp8 = problems["fp8_only"]  # a branch that runs only under one precision is checked too
    assert fp8.field == "mask" and "fp8-rollout" in fp8.message, fp8
    assert not check_recipes({n: r for n, r in reg.recipes.items() if n in project_names()})


def project_names():
    return set(load_registry(ROOT).recipes)


def test_a_recipe_error_during_training_names_its_file(project):
    path = write(project, "wrong_shape", WRONG_SHAPE)
    recipe, problems = load_recipe_file(path)
    assert not problems
    from pdmask.registry.recipe_check import synthetic_batch
    from pdmask.trust_region import apply_method

    data = synthetic_batch("sim", "float32")
    with pytest.raises(RecipeError) as err:
        apply_method(
            recipe.method({}), data.stats, data.advantages, data.response_mask, backend="sim"
        )
    assert err.value.problem.file == str(path) and err.value.exit_code == 2
    assert f"{path}:" in str(err.value)


def test_validate_and_sweep_refuse_a_wrong_shape_before_launch(project):
    path = write(project, "wrong_shape", WRONG_SHAPE)
    (project / "sweeps" / "bad.yaml").write_text(
        "name: bad\ndescription: x\nseeds: 1\nprofile: smoke\n"
        "grid: {method: [wrong-shape], model: [qwen3-4b-base], precision: [bf16]}\n"
    )
    line = 1 + next(
        i for i, t in enumerate(path.read_text().splitlines()) if "def per_sequence" in t
    )
    for args in (("validate",), ("sweep", "bad", "--dry-run"), ("sweep", "bad")):
        out = pdm(*args, project=project)
        assert out.returncode == 2, (args, out.stderr)
        assert f"{path}:{line}: mask:" in out.stderr and "[B, T]" in out.stderr, out.stderr
    assert not (project / ".pdm" / "mlflow.db").exists()


def test_recipes_list_shows_the_valid_and_reports_the_broken(project):
    (project / "recipes" / "syntax.py").write_text("RECIPE = (\n")
    (project / "recipes" / "notes.yaml").write_text("a: 1\n")
    out = pdm("recipes", "list", "--json", project=project)
    assert out.returncode == 2
    listed = {r["name"] for r in json.loads(out.stdout)}
    assert {"pdm-agg", "cispo", "gspo"} <= listed
    assert "syntax.py:1" in out.stderr and "notes.yaml" in out.stderr
