"""The recipe contract: parameters and their roles, and what a recipe's functions receive and
may return (the batch, the mask a loss sees, the metric names)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from pdmask.registry import Param, load_registry
from pdmask.registry.recipe_source import RecipeSource, source_hash

from .recipe_writing import recipe_call, write

# -- parameters ----------------------------------------------------------------------------------


def test_param_check_refuses_nan_inf_and_floats_for_integers():
    delta = Param(default=0.1, ge=0.0, description="d")
    topk = Param(default=20, ge=0, description="k")
    for bad in (math.nan, math.inf, -math.inf):
        assert "finite" in delta.check(bad)
        assert topk.check(bad) is not None
    assert "integer" in topk.check(2.5)
    assert "integer" in topk.check(20.0)  # an integral float is still not an int
    assert topk.check(True) is not None and delta.check(True) is not None
    assert topk.check(12) is None and delta.check(1) is None
    assert delta.normalise(1) == 1.0 and isinstance(delta.normalise(1), float)
    typed = Param(default=None, type="int", description="an integer without a default")
    assert typed.check(3) is None and "integer" in typed.check(3.5)


def test_roles_are_declared_once_and_typed(project):
    write(
        project,
        "two_ks",
        recipe_call(
            "two-ks",
            'proximity="kl_topk", direction="ratio", '
            'params={"a": Param(default=8, role="topk", description="x"), '
            '"b": Param(default=20, role="topk", description="y")}',
        ),
    )
    write(
        project,
        "float_k",
        recipe_call(
            "float-k",
            'proximity="kl_topk", direction="ratio", '
            'params={"k": Param(default=2.0, role="topk", description="x")}',
        ),
    )
    reg = load_registry(project)
    messages = {Path(p.file).name: p.message for p in reg.recipe_problems}
    assert "already played" in messages["two_ks.py"]
    assert "needs a int parameter" in messages["float_k.py"]


def test_backends_ask_the_recipe_for_its_roles(project):
    """A recipe naming its parameters its own way: the roles, not the names, reach the backends."""
    from pdmask.backends.sim.backend import sim_config

    write(
        project,
        "renamed",
        recipe_call(
            "renamed",
            'proximity="kl_topk", direction="ddot_agg", '
            'params={"radius": Param(default=0.1, ge=1e-6, role="delta", description="r"), '
            '"k": Param(default=12, ge=1, role="topk", description="k"), '
            '"cap": Param(default=3.0, ge=1.0, role="ratio_cap", description="c")}, '
            'needs=("behaviour_topk",)',
        ),
    )
    (project / "sweeps" / "renamed.yaml").write_text(
        "name: renamed\ndescription: x\nseeds: 1\nprofile: smoke\n"
        "grid: {method: [renamed], model: [qwen3-4b-base], precision: [bf16], delta: [0.07]}\n"
    )
    reg = load_registry(project)
    (trial,) = reg.expand("renamed")
    assert trial.delta == 0.07 and trial.params["radius"] == 0.07  # the axis sets the role
    cfg = sim_config(trial)
    assert (cfg.delta, cfg.top_k, cfg.ratio_cap) == (0.07, 12, 3.0)
    pytest.importorskip("verl")
    from pdmask.backends.verl.jobs import trial_overrides

    kv = dict(o.split("=", 1) for o in trial_overrides(trial, reg.sweep("renamed"), "h20x32"))
    assert kv["+actor_rollout_ref.actor.policy_loss.pdm_delta"] == "0.07"
    assert kv["+actor_rollout_ref.actor.policy_loss.pdm_topk"] == "12"
    assert kv["+actor_rollout_ref.actor.policy_loss.pdm_ratio_cap"] == "3.0"


def test_a_stray_file_in_recipes_is_a_problem(project):
    (project / "recipes" / "notes.yaml").write_text("a: 1\n")
    (project / "recipes" / "README.md").write_text("documentation is fine\n")
    (project / "recipes" / "_helpers.py").write_text("x = 1\n")
    reg = load_registry(project)
    (problem,) = reg.recipe_problems
    assert problem.file.endswith("notes.yaml") and "not a recipe" in problem.message
    assert "pdm-agg" in reg.recipes  # the others still load


def test_the_contract_states_what_a_recipe_receives():
    from pdmask.registry.recipe_check import synthetic_batch
    from pdmask.trust_region import Method, apply_method

    seen = {}

    def spy(batch):
        seen["batch"] = batch
        return torch.zeros_like(batch.response_mask)

    data = synthetic_batch("verl", "float32")
    apply_method(
        Method("spy", mask=spy, params={"x": 1}),
        data.stats,
        data.advantages,
        data.response_mask,
        log_prob=data.log_prob,
        mu_log_prob=data.mu_log_prob,
        backend="verl",
        precision="fp8-rollout",
    )
    batch = seen["batch"]
    b, t = batch.response_mask.shape
    assert batch.sequence_lengths.tolist() == [6, 1, 4, 3] and batch.dtype == torch.float32
    assert batch.log_prob.requires_grad and not batch.stats.logp.requires_grad
    assert batch.stats.kl_topk.shape == (b, t) and batch.advantages.shape == (b, t)
    assert (batch.backend, batch.precision, dict(batch.params)) == ("verl", "fp8-rollout", {"x": 1})
    with pytest.raises(TypeError):
        batch.params["x"] = 2  # read-only
    assert RecipeSource.of("x.py", "x = 1").hash == source_hash("x = 1")


def _outside(batch):
    kl = batch.stats.kl_topk  # the synthetic batch's KL is large: mask its upper half
    return kl > kl[batch.response_mask].median()


def _pg_plus_penalty(batch):
    """-r A everywhere, plus 0.1 * log pi on the masked tokens (acts only where the mask is)."""
    pg = -torch.exp(batch.log_prob - batch.mu_log_prob) * batch.advantages
    penalty = torch.where(batch.mask, 0.1 * batch.log_prob, torch.zeros_like(batch.log_prob))
    return torch.where(batch.mask, penalty, pg)


def _pg_only(batch):
    return -torch.exp(batch.log_prob - batch.mu_log_prob) * batch.advantages


def test_a_loss_that_sees_the_mask_acts_on_masked_tokens_and_the_share_stays_the_masks():
    """float64 reference: on masked tokens the loss is the recipe's own penalty (not 0), on the
    others the policy-gradient term; the mask the backends log is the recipe's."""
    from pdmask.registry import Recipe
    from pdmask.registry.recipe_check import synthetic_batch
    from pdmask.trust_region import apply_method

    def run(recipe):
        data = synthetic_batch("sim", "float64")
        out = apply_method(
            recipe.method({}), data.stats, data.advantages, data.response_mask, backend="sim"
        )
        return data, out

    common = dict(display_name="x", color="#123456", summary="s", mask=_outside)
    sees = Recipe(name="sees-mask", loss=_pg_plus_penalty, loss_sees_mask=True, **common)
    blind = Recipe(name="blind", loss=_pg_only, **common)
    data, out = run(sees)
    valid = data.response_mask
    logp = data.stats.logp.detach()
    mu = data.stats.mu_logp.detach()
    kl = data.stats.kl_topk
    expected_mask = (kl > kl[valid].median()) & valid
    assert torch.equal(out.mask, expected_mask) and 0 < int(expected_mask.sum()) < int(valid.sum())
    expected = torch.where(expected_mask, 0.1 * logp, -torch.exp(logp - mu) * data.advantages)
    expected = torch.where(valid, expected, 0.0)
    assert torch.allclose(out.token_loss.detach(), expected, rtol=1e-12, atol=1e-12)
    assert bool((out.token_loss[expected_mask] != 0).all())  # kept where the mask is

    data, out = run(blind)  # the default composition: masked tokens contribute nothing
    assert out.batch.mask is None
    assert bool((out.token_loss[out.mask] == 0).all())
    assert torch.equal(out.mask, expected_mask)


def test_loss_sees_mask_without_an_own_loss_is_refused():
    from pdmask.registry import Recipe

    with pytest.raises(ValueError, match="loss_sees_mask"):
        Recipe(
            name="nothing-to-see",
            display_name="x",
            color="#123456",
            summary="s",
            mask=_outside,
            loss_sees_mask=True,
        )


def test_a_recipe_metric_name_verl_would_misreduce_or_a_non_finite_value_is_refused():
    from pdmask.registry.recipe_check import synthetic_batch
    from pdmask.trust_region import Method, apply_method

    def reports(name, value):
        def mask(batch):
            batch.report(name, value)
            return batch.response_mask & False

        data = synthetic_batch("sim", "float32")
        return apply_method(
            Method("r", mask=mask), data.stats, data.advantages, data.response_mask, backend="sim"
        )

    assert reports("bonus_size", torch.tensor(0.5)).batch.reported == {"bonus_size": 0.5}
    for name in ("kl_max", "Bonus", "share-of"):  # verl would take the max; not a plain name
        with pytest.raises(ValueError, match="recipe metric name"):
            reports(name, 1.0)
    with pytest.raises(ValueError, match="not finite"):
        reports("bonus_size", math.nan)
