"""Methods that exist nowhere, each one file written by someone else: a mask-only one, one that
changes the loss, a sequence-level one. With no other edit they list, validate, train on the
embedded backend (``pdm sweep``: a real local Ray, a real sqlite MLflow store) and their VeRL job
specs carry them; editing one turns its trial back to todo; a bug that only shows in training
fails its trial once, by name, and the sweep exits non-zero."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pdmask.registry.recipe_source import source_hash
from tests.orchestration.conftest import pdm, sweep_runs, write_sweep

pytestmark = [pytest.mark.slow, pytest.mark.processes]

NEW = {
    "kl_pullback.py": '''"""Top-K KL region that masks every out-of-region token not being pulled back by its update."""

from pdmask.registry import Param, Recipe


def pullback_mask(batch):
    s = batch.stats
    outside = s.kl_topk > batch.params["delta"]
    pulled_back = batch.advantages * (s.ratio - 1) < 0
    return outside & ~pulled_back & (batch.advantages != 0)


RECIPE = Recipe(
    name="kl-pullback",
    display_name="KL pull-back",
    color="#112233",
    summary=__doc__.splitlines()[0],
    mask=pullback_mask,
    params={"delta": Param(default=0.1, ge=1e-6, role="delta", description="Region size.")},
    needs=("behaviour_topk",),
)
''',
    "asym_is.py": '''"""Asymmetric IS: tokens with A > 0 keep their ratio, tokens with A < 0 a ratio capped at 1."""

import torch

from pdmask.registry import Recipe


def asymmetric_loss(batch):
    ratio = batch.ratio
    weight = torch.where(batch.advantages < 0, ratio.clamp(max=1.0), ratio)
    return -batch.advantages * weight


RECIPE = Recipe(
    name="asym-is",
    display_name="Asymmetric IS",
    color="#445566",
    summary=__doc__.splitlines()[0],
    loss=asymmetric_loss,
)
''',
    "seq_kl_gate.py": '''"""Drop whole responses whose mean top-K KL is out of region and whose update pushes outward."""

from pdmask.registry import Param, Recipe


def gate(batch):
    kl = batch.sequence_mean(batch.stats.kl_topk)
    push = batch.sequence_mean(batch.advantages * batch.stats.local_term)
    return batch.per_token((kl > batch.params["delta"]) & (push > 0))


RECIPE = Recipe(
    name="seq-kl-gate",
    display_name="Sequence KL gate",
    color="#778899",
    summary=__doc__.splitlines()[0],
    mask=gate,
    params={"delta": Param(default=0.05, ge=1e-6, role="delta", description="Region size.")},
    needs=("behaviour_topk",),
)
''',
}
SWEEP = """backend: sim
profile: smoke
seeds: 1
max_concurrent: 2
retries: 2
grid:
  method: [kl-pullback, asym-is, seq-kl-gate]
  model: [qwen3-4b-base]
  precision: [fp8-rollout]
  delta: [0.1]
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    import shutil

    from tests.orchestration.conftest import ROOT

    for name in ("recipes", "sweeps", "dashboards"):
        shutil.copytree(ROOT / name, tmp_path / name)
    (tmp_path / ".pdm").mkdir()
    for name, text in NEW.items():  # the only change: three new files (and a sweep using them)
        (tmp_path / "recipes" / name).write_text(text)
    write_sweep(tmp_path, "mine", SWEEP)
    return tmp_path


def test_new_methods_are_one_file_each(project):
    listed = json.loads(pdm(project, "recipes", "list", "--json").stdout)
    by_name = {r["name"]: r for r in listed}
    assert by_name["kl-pullback"]["custom_mask"] and not by_name["kl-pullback"]["custom_loss"]
    assert by_name["asym-is"]["custom_loss"] and not by_name["asym-is"]["custom_mask"]
    assert by_name["seq-kl-gate"]["custom_mask"]
    checked = pdm(project, "validate", "mine")
    assert checked.returncode == 0, checked.stderr

    out = pdm(project, "sweep", "mine")
    assert out.returncode == 0, out.stdout + out.stderr
    runs = {r.data.tags["pdm.method"]: r for r in sweep_runs(project, "mine")}
    assert set(runs) == {"kl-pullback", "asym-is", "seq-kl-gate"}
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{project / '.pdm' / 'mlflow.db'}")
    files = {
        "kl-pullback": "kl_pullback.py",
        "asym-is": "asym_is.py",
        "seq-kl-gate": "seq_kl_gate.py",
    }
    for method, run in runs.items():
        assert run.info.status == "FINISHED"
        text = NEW[files[method]]
        assert run.data.tags["pdm.recipe_hash"] == source_hash(text)
        assert run.data.tags["pdm.recipe_file"] == files[method]
        stored = client.download_artifacts(run.info.run_id, f"recipe/{files[method]}", str(project))
        assert Path(stored).read_text() == text  # the code that trained it
        assert (
            "critic/score/mean" in run.data.metrics and "actor/pdm/masked_frac" in run.data.metrics
        )
        assert run.data.tags["pdm.git_dirty"] in ("true", "false")
    assert runs["asym-is"].data.tags["pdm.delta"] == ""  # no delta: not crossed with the axis
    assert runs["kl-pullback"].data.tags["pdm.delta"] == "0.1"

    # The VeRL job of each carries its file as planned.
    plan = json.loads(
        pdm(project, "sweep", "mine", "--backend", "verl", "--dry-run", "--json").stdout
    )
    for row in plan["trials"]:
        env = row["job"]["runtime_env"]["env_vars"]
        (entry,) = json.loads(env["PDM_FILE_RECIPES"]).values()
        assert entry["source"] == NEW[entry["file"]] and entry["name"] == row["method"]
        mode = next(o for o in row["job"]["overrides"] if ".policy_loss.loss_mode=" in o)
        assert mode.endswith("=" + entry["loss_mode"])

    # Editing one recipe's mask turns its trial, and only its, back to todo, saying why.
    gate = project / "recipes" / "seq_kl_gate.py"
    gate.write_text(gate.read_text().replace("(push > 0)", "(push >= 0)"))
    plan = json.loads(pdm(project, "sweep", "mine", "--dry-run", "--json").stdout)
    status = {row["method"]: row["status"] for row in plan["trials"]}
    assert status == {
        "kl-pullback": "done",
        "asym-is": "done",
        "seq-kl-gate": "todo (recipe changed)",
    }


BREAKS_IN_TRAINING = '''"""Fine on the validation batch, broken on a real minibatch."""

import torch

from pdmask.registry import Recipe


def fragile(batch):
    if batch.response_mask.shape[0] > 8:
        raise ValueError("fragile recipe: minibatches above 8 responses are not handled")
    return torch.zeros_like(batch.response_mask)


RECIPE = Recipe(
    name="fragile",
    display_name="Fragile",
    color="#990000",
    summary=__doc__.splitlines()[0],
    mask=fragile,
)
'''


def test_a_recipe_error_in_training_fails_once_by_name(project):
    (project / "recipes" / "fragile.py").write_text(BREAKS_IN_TRAINING)
    write_sweep(
        project, "fragile", SWEEP.replace("[kl-pullback, asym-is, seq-kl-gate]", "[fragile]")
    )
    assert pdm(project, "validate", "fragile").returncode == 0  # the synthetic batch has 4 rows
    out = pdm(project, "sweep", "fragile")
    assert out.returncode != 0
    text = " ".join((out.stdout + out.stderr).split())  # the console wraps long lines
    assert "minibatches above 8 responses are not handled" in text
    assert "recipes/fragile.py:10: mask: raised ValueError" in text
    (run,) = sweep_runs(project, "fragile")
    assert run.info.status == "FAILED"
    assert run.data.tags["pdm.attempts"] == "1"  # a recipe bug is not retried
    assert "recipes/fragile.py:" in run.data.tags["pdm.failure_reason"]
    # the recipe's error, named as such: never "configuration" (exit 2: fix it, then rerun)
    assert out.returncode == 2
    assert run.data.tags["pdm.failure_reason"].startswith("recipe error: ")
    assert run.data.tags["pdm.failure_kind"] == "recipe"
    assert "configuration" not in text.replace("configuration refused", "")
    row = next(ln for ln in out.stdout.splitlines() if "recipe error (fix the recipe file" in ln)
    assert row.split()[-1] == "1", row
