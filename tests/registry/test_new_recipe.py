"""A new baseline is one file in recipes/: discovered, listed, planned, with its own math."""

from __future__ import annotations

import json

import torch

from pdmask.registry import load_registry
from pdmask.trust_region import apply_method, composed_mask, compute_token_stats

from .conftest import pdm

NEW_RECIPE = '''"""Hard top-K KL trust region: mask every out-of-region token whatever the direction.

A method that exists nowhere else in pdmask: it brings its own per-token mask.
"""

from pdmask.registry import Param, Recipe


def hard_region_mask(batch):
    # Outside the region and carrying a learning signal: zero the gradient, no direction test.
    return (batch.stats.kl_topk > batch.params["delta"]) & (batch.advantages != 0)


RECIPE = Recipe(
    name="hard-topk-kl",
    display_name="Hard top-K KL",
    color="#000000",
    summary=__doc__.splitlines()[0],
    mask=hard_region_mask,
    params={"delta": Param(default=0.1, ge=1e-6, role="delta", description="Trust-region size.")},
    needs=("behaviour_topk",),
)
'''


def test_dropped_in_recipe_is_listed_and_planned(project):
    (project / "recipes" / "hard_topk_kl.py").write_text(NEW_RECIPE)
    listed = json.loads(pdm("recipes", "list", "--json", project=project, check=True).stdout)
    assert "hard-topk-kl" in {r["name"] for r in listed}
    assert next(r for r in listed if r["name"] == "hard-topk-kl")["custom_mask"] is True
    # A user who followed README's example has a sweep of this method already (`mine`): this
    # test's sweep joins whatever the project's own sweeps are.
    before = next(r for r in listed if r["name"] == "hard-topk-kl")["sweeps"]
    (project / "sweeps" / "hard.yaml").write_text(
        "name: hard\ndescription: new baseline\nseeds: 2\n"
        "grid: {method: [hard-topk-kl, pdm-agg], model: [qwen3-4b-base], precision: [bf16], delta: [0.2]}\n"
    )
    plan = json.loads(
        pdm("sweep", "hard", "--dry-run", "--json", project=project, check=True).stdout
    )
    methods = [r["method"] for r in plan["trials"]]
    assert methods.count("hard-topk-kl") == 2
    # The listing names the sweeps that train it (smallest first) and what its file brings.
    listed = json.loads(pdm("recipes", "list", "--json", project=project, check=True).stdout)
    entry = next(r for r in listed if r["name"] == "hard-topk-kl")
    assert sorted(entry["sweeps"]) == sorted([*before, "hard"]) and entry["custom_loss"] is False
    verbose = pdm("recipes", "list", "-v", "hard-topk-kl", project=project, check=True).stdout
    (used,) = [line for line in verbose.splitlines() if "used by: " in line]
    assert "hard" in used.split("used by: ")[1].split(" (pdm sweep")[0].split(", "), verbose
    assert "hard-topk-kl" in verbose and " mask " in verbose, verbose  # the `own` column
    assert {
        r["config"]["params"]["delta"] for r in plan["trials"] if r["method"] == "hard-topk-kl"
    } == {0.2}

    # Its own math is what the backends will call.
    recipe = load_registry(project).recipes["hard-topk-kl"]
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(50, 30, generator=g, dtype=torch.float64) * 3
    lp, ids = torch.log_softmax(torch.randn(50, 30, generator=g, dtype=torch.float64), -1).topk(
        5, -1
    )
    sampled = ids[:, 0]
    stats = compute_token_stats(logits, sampled, ids, lp, lp[:, 0])
    adv = torch.randn(50, generator=g, dtype=torch.float64)
    valid = torch.ones(50, dtype=torch.bool)
    mask = apply_method(recipe.method({"delta": 0.2}), stats, adv, valid, backend="math").mask
    assert torch.equal(mask, (stats.kl_topk > 0.2) & (adv != 0))


def test_composed_recipe_mask_matches_math_api():
    reg = load_registry()
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(64, 40, generator=g, dtype=torch.float64) * 3
    lp, ids = torch.log_softmax(torch.randn(64, 40, generator=g, dtype=torch.float64), -1).topk(
        5, -1
    )
    stats = compute_token_stats(logits, ids[:, 1], ids, lp, lp[:, 1])
    adv = torch.randn(64, generator=g, dtype=torch.float64)
    valid = torch.ones(64, dtype=torch.bool)
    composed = [r for r in reg.recipes.values() if r.proximity is not None]
    assert len(composed) >= 9
    for recipe in composed:
        params, errors = recipe.resolve_params({"delta": 0.05} if recipe.uses_delta else {})
        assert not errors
        kwargs = {"delta": params.get("delta")}
        if recipe.role_param("clip_low"):
            kwargs.update(eps_low=params["eps_low"], eps_high=params["eps_high"])
        expected = composed_mask(recipe.proximity, recipe.direction, stats, adv, **kwargs)
        got = apply_method(recipe.method(params), stats, adv, valid, backend="math").mask
        assert torch.equal(got, expected), recipe.name
