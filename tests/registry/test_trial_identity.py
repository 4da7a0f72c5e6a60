"""Trial identity: stable across processes and machines, sensitive to every semantic field."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pdmask.registry import Trial, load_registry
from pdmask.registry.recipe_source import RecipeSource

PDM_AGG = (load_registry().root / "recipes" / "pdm_agg.py").read_text()
BASE = dict(
    sweep="s",
    method="pdm-agg",
    recipe_version=1,
    recipe_source=RecipeSource.of("pdm_agg.py", PDM_AGG),
    params={"delta": 0.15, "topk": 20, "ratio_cap": None},
    model="qwen3-4b-base",
    precision="bf16",
    delta=0.15,
    seed=0,
    backend="sim",
    profile="default",
)


def test_hash_is_stable_across_processes():
    hashes = [t.trial_hash for t in load_registry().expand("main-figure")]
    code = (
        "from pdmask.registry import load_registry;"
        "print(' '.join(t.trial_hash for t in load_registry().expand('main-figure')))"
    )
    for seed in ("0", "12345"):  # different hash randomisation per process
        out = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed, "PATH": ""},
        )
        assert out.stdout.split() == hashes
    assert len(set(hashes)) == len(hashes) == 72


@pytest.mark.parametrize(
    "change",
    [
        {"method": "pdm-uni"},
        {"recipe_version": 2},
        {"params": {**BASE["params"], "topk": 10}},
        {"model": "qwen3-8b-base"},
        {"precision": "fp8-e2e"},
        {"delta": 0.05},
        {"seed": 1},
        {"backend": "verl"},
        {"profile": "full"},
        {"steps": 10},
        {"mu_source": "recompute"},
        {"recipe_source": RecipeSource.of("pdm_agg.py", PDM_AGG.replace("ddot_agg", "ddot_uni"))},
    ],
)
def test_every_semantic_field_changes_the_hash(change):
    assert Trial(**{**BASE, **change}).trial_hash != Trial(**BASE).trial_hash


def test_cosmetic_fields_do_not():
    assert Trial(**{**BASE, "sweep": "other"}).trial_hash == Trial(**BASE).trial_hash
    renamed = RecipeSource.of("renamed.py", PDM_AGG + "\n# a comment\n")
    assert Trial(**{**BASE, "recipe_source": renamed}).trial_hash == Trial(**BASE).trial_hash
    assert (
        Trial(**{**BASE, "params": dict(reversed(list(BASE["params"].items())))}).trial_hash
        == Trial(**BASE).trial_hash
    )
