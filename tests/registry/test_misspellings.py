"""A misspelt name is reported as what it is, once: a `Param` keyword as a keyword of `Param`
(not as an unknown method in every sweep that names the recipe), a sweep axis once for the axis
(not once per value)."""

from __future__ import annotations

from pathlib import Path

from .conftest import pdm

SWEEP = """name: typos
description: one misspelt axis of each kind, each with several values
figures: []
backend: sim
profile: smoke
seeds: 1
grid:
  method: [pdm-2nd, pdm-agg]
  model: [qwen3-4b-base]
  precision: [fp8-rollout]
  delta: [0.1, 0.15, 0.2]
  params.etta: [0.1, 0.2, 0.3]
  sim.lrr: [0.001, 0.002]
"""


def misspell_a_param_keyword(project: Path) -> Path:
    path = project / "recipes" / "pdm_2nd.py"
    text = path.read_text()
    assert text.count("            ge=1e-6,\n") == 1  # the keyword this test misspells
    path.write_text(text.replace("            ge=1e-6,\n", "            gte=1e-6,\n"))
    return path


def problem_lines(project: Path, *args: str) -> list[str]:
    out = pdm(*args, project=project)
    assert out.returncode == 2, out.stdout + out.stderr
    return [line for line in out.stderr.splitlines() if line.startswith("  - ")]


def test_a_misspelt_param_keyword_is_named_and_the_method_is_not_called_unknown(project):
    recipe = misspell_a_param_keyword(project)
    (project / "sweeps" / "typos.yaml").write_text(SWEEP.replace("params.etta", "params.eta"))
    lines = problem_lines(project, "sweep", "typos", "--dry-run")
    keyword = [line for line in lines if "pdm_2nd.py" in line.split(": ")[0]]
    assert len(keyword) == 1, lines
    assert "Param(gte=...)" in keyword[0] and "did you mean 'ge'?" in keyword[0], keyword
    assert f"{recipe.name}:" in keyword[0]  # with its line
    assert not any("unknown method" in line or "did you mean 'pdm-" in line for line in lines)
    method = [line for line in lines if "typos.yaml" in line and "grid.method.0" in line]
    assert len(method) == 1, lines
    assert "'pdm-2nd' is declared in" in method[0] and "does not load" in method[0], method


def test_a_misspelt_recipe_keyword_is_named(project):
    path = project / "recipes" / "pdm_2nd.py"
    path.write_text(path.read_text().replace("needs=(", "neds=("))
    lines = problem_lines(project, "validate")
    assert any("Recipe(neds=...)" in line and "did you mean 'needs'?" in line for line in lines)


def test_a_misspelt_sweep_axis_is_reported_once_per_axis_not_per_value(project):
    (project / "sweeps" / "typos.yaml").write_text(SWEEP)
    lines = problem_lines(project, "validate", "typos")
    params = [line for line in lines if "params.etta" in line]
    # once per recipe that lacks it (two methods on the axis), never once per value or delta
    assert len(params) == 2, lines
    assert all("grid.params.etta:" in line for line in params), params
    assert any("recipe 'pdm-2nd'" in line and "did you mean 'eta'" in line for line in params)
    knobs = [line for line in lines if "sim.lrr" in line]
    assert len(knobs) == 1, lines
    assert "grid.sim.lrr:" in knobs[0] and "unknown knob" in knobs[0], knobs
    assert "did you mean 'lr'?" in knobs[0], knobs


def test_a_wrong_value_of_a_known_axis_is_still_reported_per_value(project):
    sweep = SWEEP.replace("params.etta: [0.1, 0.2, 0.3]", "params.eta: [0.1, -1, 1000]")
    sweep = sweep.replace("method: [pdm-2nd, pdm-agg]", "method: [pdm-2nd]")
    (project / "sweeps" / "typos.yaml").write_text(sweep.replace("  sim.lrr: [0.001, 0.002]\n", ""))
    lines = problem_lines(project, "validate", "typos")
    assert any("grid.params.eta.1:" in line for line in lines), lines
    assert any("grid.params.eta.2:" in line for line in lines), lines
