"""Bad input: every mistake reported at once, by file and field (and line), exit 2, nothing written."""

from __future__ import annotations

from .conftest import pdm

BAD_SWEEP = """name: broken
description: several mistakes at once
seeds: 2
figures: [figure-1, figure-99]
grid:
  method: [pdm-agg, pdm-nope]
  model: [qwen3-4b-base, qwen3-70b]
  precision: [bf16]
  delta: [0.15, -1]
  params.topk: [5000]
"""

BAD_RECIPE = """from pdmask.registry import Recipe

RECIPE = Recipe(name="Bad Name", display_name="x", color="red", summary="s",
                proximity="kl_topk", direction="ddot_nope")
"""

BROKEN_PYTHON = "RECIPE = (\n"


def test_many_mistakes_reported_together(project):
    (project / "sweeps" / "broken.yaml").write_text(BAD_SWEEP)
    (project / "recipes" / "bad.py").write_text(BAD_RECIPE)
    (project / "recipes" / "syntax.py").write_text(BROKEN_PYTHON)
    out = pdm("sweep", "broken", "--dry-run", project=project)
    assert out.returncode == 2, out.stderr
    err = out.stderr
    expected = [
        ("broken.yaml:6", "pdm-nope"),  # unknown method, with its line
        ("broken.yaml:7", "qwen3-70b"),  # unknown model
        ("broken.yaml:9", "delta must be a positive number"),
        ("broken.yaml:10", "params.topk"),  # parameter out of range
        ("broken.yaml:4", "figure-99"),  # unknown dashboard
        ("bad.py", "name"),
        ("bad.py", "color"),
        ("syntax.py", "SyntaxError"),
    ]
    for where, what in expected:
        assert any(where in line and what in line for line in err.splitlines()), (where, what, err)
    assert "known:" in err and "pdm-agg" in err  # unknown names list the valid ones
    assert not (project / ".pdm" / "mlflow.db").exists()


def test_schema_errors_name_fields(project):
    (project / "sweeps" / "typo.yaml").write_text(
        "name: typo\ndescription: x\nseed: 3\nretries: -1\ngrid: {method: [pdm-agg]}\nsearch: {metric: m}\n"
    )
    out = pdm("validate", "typo", project=project)
    assert out.returncode == 2
    for field in ("seed", "retries", "search.budget"):
        assert f": {field}:" in out.stderr, (field, out.stderr)
    assert "typo.yaml:3" in out.stderr


def test_yaml_syntax_error_has_line(project):
    (project / "sweeps" / "syntax.yaml").write_text("name: syntax\ngrid: [unclosed\n")
    out = pdm("validate", project=project)
    assert out.returncode == 2 and "syntax.yaml:" in out.stderr


def test_unknown_sweep_lists_known(project):
    out = pdm("sweep", "nope", "--dry-run", project=project)
    assert out.returncode == 2 and "main-figure" in out.stderr


def test_a_mistyped_name_is_answered_with_the_closest_ones(project):
    sweep = pdm("sweep", "main-figur", "--dry-run", project=project)
    assert sweep.returncode == 2 and "did you mean 'main-figure'?" in sweep.stderr, sweep.stderr
    (project / "sweeps" / "typo.yaml").write_text(
        "name: typo\ndescription: x\nseeds: [0]\n"
        "grid: {method: [pdm-ag], model: [qwen3-4b], precision: [bf16]}\n"
    )
    method = pdm("validate", "typo", project=project)
    assert method.returncode == 2 and "did you mean 'pdm-agg'" in method.stderr, method.stderr
    recipe = pdm("recipes", "list", "dppo-topk", project=project)
    offered = recipe.stderr.split("known:")[0]
    assert recipe.returncode == 2 and "did you mean" in offered and "'dppo-topk-kl'" in offered


def test_known_names_offer_close_ones_first_and_nothing_for_a_stranger():
    from pdmask.errors import known_names

    assert known_names("smoek", ["smoke", "main-figure"]).startswith("did you mean 'smoke'? ")
    assert known_names("zzz", ["smoke", "main-figure"]) == "known: main-figure, smoke"
    assert known_names("x", []) == "known: (none)"


def test_all_shipped_files_validate():
    out = pdm("validate")
    assert out.returncode == 0, out.stderr
