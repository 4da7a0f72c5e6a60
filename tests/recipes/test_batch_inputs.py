"""What a recipe receives beyond the statistics, and what it may not do with it (issue 46):

- the sampled token's id (``batch.token_id``) and the inputs in the statistics' dtype
  (``batch.fp32``: float32 whatever ``batch.dtype``, so a loss can equal one verl computes from
  float32 inputs), with ``batch.dtype`` still the loss's;
- inputs that cannot be corrupted: a write in place into any batch tensor (or a view of one) is
  refused, naming the tensor and the line, by ``pdm validate`` and by the backends at train time;
- a random draw from a global generator is refused however rarely it changes a decision; one
  seeded from the batch is a function of it and passes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pdmask.errors import RecipeError
from pdmask.registry import load_registry
from pdmask.registry.recipe_check import check_recipes, synthetic_batch
from pdmask.registry.recipe_files import load_recipe_file
from pdmask.trust_region import Method, apply_method
from tests.registry.conftest import pdm

from .recipe_writing import recipe_call, write


def _seen(layout: str, dtype: str, needs=()):
    """The batch a spy mask receives on a synthetic batch of ``layout``."""
    seen = {}

    def spy(batch):
        seen["batch"] = batch
        return torch.zeros_like(batch.response_mask)

    data = synthetic_batch(layout, dtype, inputs=needs)
    apply_method(
        Method("spy", mask=spy, needs=frozenset(needs)),
        data.stats,
        data.advantages,
        data.response_mask,
        log_prob=data.log_prob,
        mu_log_prob=data.mu_log_prob,
        backend=layout,
    )
    return seen["batch"], data


def test_bf16_log_probs_leave_every_input_in_float32_beside_the_losss_dtype():
    batch, data = _seen("verl", "bfloat16", needs=("support_log_probs",))
    assert batch.dtype == torch.bfloat16 and batch.advantages.dtype == torch.bfloat16
    fp32 = batch.fp32
    for name in ("log_prob", "mu_log_prob", "advantages"):
        assert getattr(fp32, name).dtype == torch.float32, name
    # the originals, not bf16 copies brought back: verl's float32 old log-probs and advantages
    assert torch.equal(fp32.mu_log_prob, data.mu_log_prob.float())
    assert not torch.equal(fp32.mu_log_prob, batch.mu_log_prob.float())  # bf16 rounds them
    assert torch.equal(fp32.advantages, data.advantages.float())
    assert fp32.log_prob.requires_grad  # the policy's log-probs, upcast: still differentiable
    assert fp32.support.log_prob.dtype == torch.float32
    assert batch.support.log_prob.dtype == torch.bfloat16
    valid = fp32.support.valid
    assert torch.equal(fp32.support.log_prob[valid], batch.stats.support.log_prob[valid])


def test_float64_stays_float64_and_the_token_id_is_the_sampled_token():
    batch, data = _seen("sim", "float64")
    assert batch.fp32.mu_log_prob.dtype == torch.float64 == batch.dtype
    assert batch.token_id.dtype == torch.long
    assert torch.equal(batch.token_id, data.stats.token_id)
    # the id's log-prob under pi is the sampled token's: log_softmax(logits)[token_id]
    logits = data.leaf.detach()
    logp = torch.log_softmax(logits, -1).gather(-1, batch.token_id[..., None]).squeeze(-1)
    torch.testing.assert_close(logp, batch.stats.logp, rtol=1e-12, atol=1e-12)


# -- writes in place -------------------------------------------------------------------------

WRITERS = {
    "scale_adv": (
        "loss",
        "advantages",
        "batch.advantages.mul_(2.0)",
        """
def scaled(batch):
    weight = batch.ratio
    batch.advantages.mul_(2.0)
    return -batch.advantages * weight
""",
        "loss=scaled",
    ),
    "stats_item": (
        "mask",
        "stats.ratio",
        "batch.stats.ratio[:, 0] = 1.0",
        """
def clipped(batch):
    batch.stats.ratio[:, 0] = 1.0
    return batch.stats.ratio > 1.5
""",
        "mask=clipped",
    ),
    "view_write": (
        "loss",
        "fp32.advantages",
        "flat[:2].zero_()",
        """
def through_a_view(batch):
    flat = batch.fp32.advantages.view(-1)
    flat[:2].zero_()
    return -batch.ratio * batch.advantages
""",
        "loss=through_a_view",
    ),
    "out_arg": (
        "mask",
        "mu_log_prob",
        "out=batch.mu_log_prob",
        """
def into_mu(batch):
    torch.add(batch.log_prob.detach(), 0.0, out=batch.mu_log_prob)
    return batch.response_mask & False
""",
        "mask=into_mu",
    ),
}


def test_a_write_into_the_batch_is_refused_naming_the_tensor_and_the_line(project):
    paths = {
        stem: write(project, stem, body + "\n\n" + recipe_call(stem.replace("_", "-"), extra))
        for stem, (_, _, _, body, extra) in WRITERS.items()
    }
    problems = {Path(p.file).stem: p for p in check_recipes(load_registry(project).recipes)}
    for stem, (kind, tensor, code, _, _) in WRITERS.items():
        problem = problems[stem]
        lines = paths[stem].read_text().splitlines()
        assert problem.field == kind, problem
        assert "writes into its batch in place: batch." in problem.message, problem
        assert f"batch.{tensor}," in problem.message or f"batch.{tensor} (" in problem.message
        assert code in lines[problem.line - 1], (problem, lines[problem.line - 1])


def test_pdm_validate_refuses_a_recipe_that_scales_its_advantages(project):
    stem = "scale_adv"
    kind, tensor, code, body, extra = WRITERS[stem]
    path = write(project, stem, body + "\n\n" + recipe_call("scale-adv", extra))
    line = 1 + next(i for i, t in enumerate(path.read_text().splitlines()) if code in t)
    out = pdm("validate", project=project)
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"{path}:{line}: loss: writes into its batch in place: batch.advantages" in out.stderr


def test_the_backends_refuse_the_write_at_train_time(project, model_cache):
    """The embedded trainer's update (the hooks every backend calls): a recipe error with the
    tensor and the line, which fails the trial at once (never retried)."""
    from pdmask.backends.sim import SimTrialConfig
    from pdmask.backends.sim.runtime import single_threaded
    from pdmask.backends.sim.state import TrialState, step_generator
    from pdmask.backends.sim.trainer import _update

    kind, tensor, code, body, extra = WRITERS["scale_adv"]
    path = write(project, "scale_adv", body + "\n\n" + recipe_call("scale-adv", extra))
    recipe, problems = load_recipe_file(path)
    assert not problems
    cfg = SimTrialConfig(
        stand_in="tiny-4b",
        precision="bf16",
        profile="smoke",
        base_model="quick",  # built in seconds: the update is what is tested
        seed=2,
        delta=0.15,
        cache_dir=str(model_cache / "sim"),
    )
    with single_threaded():
        state = TrialState(cfg)
        batch = state.rollout(step_generator(cfg.seed, 1, "rollout"))
        before = batch.token_advantages.clone()
        with pytest.raises(RecipeError) as err:
            _update(state, batch, torch.arange(batch.size // 2), recipe.method({}), step=1)
    problem = err.value.problem
    assert problem.file == str(path) and problem.field == "loss" and err.value.exit_code == 2
    assert "batch.advantages" in problem.message
    assert code in path.read_text().splitlines()[problem.line - 1]
    assert torch.equal(batch.token_advantages, before)  # the rollout's own advantages are intact


# -- random draws ----------------------------------------------------------------------------

DRAWS = {
    # a draw that almost never changes a decision on a small batch: seen all the same
    "rare_coin": ("mask", "torch's", "torch.rand(batch.response_mask.shape) < 1e-6"),
    "py_coin": ("mask", "Python's", "random.random() < 1e-9"),
}


def test_a_draw_from_a_global_generator_is_refused_one_seeded_from_the_batch_is_not(project):
    for stem, (_, _, draw) in DRAWS.items():
        body = f"""
import random


def coin(batch):
    return ({draw}) & batch.response_mask
"""
        write(project, stem, body + "\n\n" + recipe_call(stem.replace("_", "-"), "mask=coin"))
    seeded = """
def seeded(batch):
    seed = int(batch.token_id.sum()) + 1000 * int(batch.response_mask.sum())
    gen = torch.Generator().manual_seed(seed)
    return (torch.rand(batch.response_mask.shape, generator=gen) < 0.3) & batch.response_mask
"""
    write(project, "seeded", seeded + "\n\n" + recipe_call("seeded", "mask=seeded"))
    problems = {Path(p.file).stem: p for p in check_recipes(load_registry(project).recipes)}
    assert "seeded" not in problems, problems.get("seeded")
    for stem, (kind, generator, _) in DRAWS.items():
        problem = problems[stem]
        assert problem.field == kind, problem
        assert f"draws from {generator}" in problem.message and "global random" in problem.message
