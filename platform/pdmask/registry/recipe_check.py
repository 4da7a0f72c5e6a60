"""Run every recipe on small synthetic batches before anything launches.

A recipe's mask and loss are code; the registry's field checks cannot tell that a mask returns
``[B]`` instead of ``[B, T]`` or that a loss is NaN on short responses. So ``pdm validate`` and
``pdm sweep`` (``--dry-run`` too) run each recipe's mask and loss, through the math API's
``apply_method`` exactly as training does, on a tiny synthetic batch in the layout of each backend:

- ``sim``: the embedded trainer's frame; padding holds real (meaningless) statistics; float32 and
  float64 (the math keeps float64 in float64);
- ``verl``: verl's padded response frame; padding is zero-filled; log-probs come from a separate
  leaf, as verl's do, in float32 and in bf16 (a real FSDP job's; the statistics stay float32: a
  loss must still return the log-probs' dtype) (skipped for a recipe that needs an input verl cannot supply: the
  plan refuses it there).

Each batch has responses of different lengths (one of a single token) and advantages of both
signs, and is checked under every precision setting (``batch.precision``: a branch that runs only
under ``fp8-rollout`` is checked too). A recipe passes when its mask is a bool ``[B, T]``, its loss
a ``[B, T]`` tensor of the batch's dtype that is finite on every valid token and carries a finite
gradient to the policy's log-probs, and both are functions of the batch: they draw nothing from
a global random generator (torch's, Python's ``random``, numpy's), and a second call on the same
batch returns the same mask and loss (a random mask would make a run irreproducible and its
masked share meaningless; a draw seeded from the batch, e.g. a ``torch.Generator`` seeded from
``batch.token_id``, is a function of it). A write into the batch's tensors is refused by the
hooks themselves (``Recipe.method``), here as in training. Every problem names the recipe file,
the function (``mask``/``loss``) and its line.
"""

from __future__ import annotations

import json
import pickle
import random
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from typing import Any

from pdmask.errors import Problem, RecipeError
from pdmask.registry.backends import BACKENDS
from pdmask.registry.catalog import PRECISIONS
from pdmask.registry.recipes import Recipe

# verl's log-probs are the model's dtype: bf16 in a real FSDP job, float32 in a float32 one.
LAYOUTS = (("sim", "float32"), ("sim", "float64"), ("verl", "float32"), ("verl", "bfloat16"))
_LENGTHS = (6, 1, 4, 3)  # one full row, one single-token response, padding of every width
_ADVANTAGES = (1.0, -1.0, 0.5, -0.7)
_VOCAB, _TOPK = 24, 4


@dataclass
class _Synthetic:
    stats: Any
    advantages: Any
    response_mask: Any
    log_prob: Any  # the differentiable log pi passed to the method (None: stats.logp)
    mu_log_prob: Any
    leaf: Any  # what the gradient must reach


def synthetic_batch(
    layout: str, dtype_name: str, seed: int = 0, inputs: Iterable[str] = ()
) -> _Synthetic:
    """A small batch of ``len(_LENGTHS)`` responses in a backend's layout (see the docstring);
    a fresh one per check, so that a recipe that writes into its inputs harms no other check."""
    import torch

    from pdmask.trust_region import compute_token_stats, kernel_terms
    from pdmask.trust_region.logits_pass import compute_dtype
    from pdmask.trust_region.stats import OUTPUT_KERNEL

    inputs = tuple(inputs)
    dtype = getattr(torch, dtype_name)
    gen = torch.Generator().manual_seed(seed)
    b, t = len(_LENGTHS), max(_LENGTHS)
    valid = torch.arange(t)[None, :] < torch.tensor(_LENGTHS)[:, None]
    logits = (2 * torch.randn(b, t, _VOCAB, generator=gen, dtype=torch.float64)).to(dtype)
    mu_logp = torch.log_softmax(logits.double() + torch.randn(logits.shape, generator=gen), -1)
    sampled = torch.multinomial(mu_logp.exp().reshape(-1, _VOCAB), 1, generator=gen).reshape(b, t)
    top_lp, top_ids = mu_logp.topk(_TOPK, -1)
    mu_k = mu_logp.gather(-1, sampled[..., None]).squeeze(-1)
    # The behaviour's log-probs and the advantages in float32 whatever the logits (verl's are:
    # vLLM's log-probs, the trainer's advantages); float64 in a float64 batch.
    wide = compute_dtype(dtype)
    advantages = torch.where(valid, torch.tensor(_ADVANTAGES, dtype=wide)[:, None], 0.0)
    leaf = logits.clone().requires_grad_(True)
    stats = compute_token_stats(
        leaf, sampled, top_ids, top_lp.to(wide), mu_k.to(wide), inputs=inputs
    )
    if OUTPUT_KERNEL in inputs:  # the embedded backend's lm-head input and weight
        hidden = torch.randn(b, t, 8, generator=gen, dtype=torch.float64).to(dtype)
        weight = torch.randn(_VOCAB, 8, generator=gen, dtype=torch.float64).to(dtype)
        kernel = kernel_terms(logits, hidden, weight, sampled, top_ids, top_lp, mu_k)
        stats = replace(stats, kernel=kernel)
    if layout == "sim":
        return _Synthetic(stats, advantages, valid, None, None, leaf)
    # verl: every statistic zero on padding (no_padding_2_padding), log-probs its own leaf.
    zeroed = {}
    for f in fields(stats):
        value = getattr(stats, f.name)
        if isinstance(value, torch.Tensor):  # the entropy keeps its gradient, as on verl
            kept = value if f.name == "entropy" else value.detach()
            value = torch.where(valid, kept, torch.zeros_like(value))
        zeroed[f.name] = value
    stats = type(stats)(**zeroed)
    log_prob = stats.logp.to(dtype).clone().requires_grad_(True)
    return _Synthetic(stats, advantages, valid, log_prob, stats.mu_logp, log_prob)


@contextmanager
def _one_thread() -> Iterator[None]:
    """Tiny tensors: torch's thread pool only costs here (seconds on a busy machine)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def check_recipe(recipe: Recipe, params: Mapping[str, Any] | None = None) -> list[Problem]:
    """Every contract problem of ``recipe`` with ``params`` (default: its defaults)."""
    if params is None:
        params, errors = recipe.resolve_params({})
        if errors:  # already reported by the recipe's own validation
            return []
    with _one_thread():
        return _check(recipe, params)


def _check(recipe: Recipe, params: Mapping[str, Any]) -> list[Problem]:
    method = recipe.method(params)
    for layout, dtype_name in LAYOUTS:
        if not set(recipe.needs) <= BACKENDS[layout].supplies:
            continue  # that backend refuses the recipe at plan time
        for precision in PRECISIONS:
            problem = _check_one(recipe, method, layout, dtype_name, precision)
            if problem is not None:
                return [problem]  # the same bug fails every layout: report it once
    return []


def _global_generators() -> dict[str, bytes]:
    """The state of every global random generator a recipe could draw from, by name."""
    import torch

    states = {  # torch's as raw bytes: a pickled tensor holds a serialization id of its own
        "torch": torch.get_rng_state().numpy().tobytes(),
        "random": pickle.dumps(random.getstate()),
    }
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        states["numpy"] = pickle.dumps(numpy.random.get_state())
    return states


def _watched(hook: Callable | None, kind: str, drew: dict[str, str]) -> Callable | None:
    """``hook``, recording in ``drew[kind]`` which global generator a call draws from."""
    if hook is None:
        return None

    def watched(batch):
        before = _global_generators()
        try:
            return hook(batch)
        finally:
            after = _global_generators()
            moved = [name for name, state in before.items() if after.get(name) != state]
            if moved:
                drew.setdefault(kind, moved[0])

    return watched


_GENERATOR_CALLS = {
    "torch": "torch's (torch.rand, torch.randn, torch.multinomial, ... without a generator)",
    "random": "Python's (the random module)",
    "numpy": "numpy's (numpy.random)",
}


def _apply(
    method, layout: str, dtype_name: str, precision: str, drew: dict[str, str] | None = None
):
    from pdmask.trust_region import apply_method

    if drew is not None:
        method = replace(
            method,
            mask=_watched(method.mask, "mask", drew),
            loss=_watched(method.loss, "loss", drew),
        )
    data = synthetic_batch(layout, dtype_name, inputs=method.needs)
    out = apply_method(
        method,
        data.stats,
        data.advantages,
        data.response_mask,
        log_prob=data.log_prob,
        mu_log_prob=data.mu_log_prob,
        backend=layout,
        precision=precision,
    )
    return data, out


def _differing(first, second) -> int:
    """How many entries of two results differ (NaN equals NaN: a loss's own NaN is reported as
    not finite, not as irreproducible)."""
    if first.shape != second.shape:
        return first.numel()
    same = first == second
    if first.is_floating_point():
        same |= first.isnan() & second.isnan()
    return int((~same).sum())


def _check_one(recipe: Recipe, method, layout: str, dtype_name: str, precision: str):
    import torch

    where = f"on a synthetic {layout} batch ({dtype_name}, {precision})"
    loss_line = recipe.line_of(recipe.loss)
    drew: dict[str, str] = {}
    try:
        data, out = _apply(method, layout, dtype_name, precision, drew)
        _, again = _apply(method, layout, dtype_name, precision)
    except RecipeError as err:
        p = err.problem
        return Problem(p.file, p.field, f"{p.message} {where}", p.line)
    for kind, generator in drew.items():
        return Problem(
            recipe.origin,
            kind,
            f"draws from {_GENERATOR_CALLS[generator]} global random generator {where}: a mask or "
            "loss must be a function of its batch (seed a torch.Generator from the batch, e.g. "
            "from batch.token_id, or drop the draw)",
            recipe.line_of(getattr(recipe, kind)),
        )
    for kind, first, second, line in (
        ("mask", out.mask, again.mask, recipe.line_of(recipe.mask)),
        ("loss", out.token_loss.detach(), again.token_loss.detach(), loss_line),
    ):
        differ = _differing(first, second)
        if differ:
            return Problem(
                recipe.origin,
                kind,
                f"is not a function of its batch: two calls on the same batch differ on {differ} "
                f"token(s) {where} (seed any randomness from the batch, or drop it)",
                line,
            )
    valid = data.response_mask
    bad = int((~torch.isfinite(out.token_loss) & valid).sum())
    if bad:
        return Problem(
            recipe.origin, "loss", f"not finite on {bad} valid token(s) {where}", loss_line
        )
    if not out.token_loss.requires_grad:
        return Problem(
            recipe.origin,
            "loss",
            "carries no gradient: build it from batch.log_prob (batch.stats is detached)",
            loss_line,
        )
    torch.where(valid, out.token_loss, 0.0).sum().backward()
    grad = data.leaf.grad
    if grad is None or not bool(torch.isfinite(grad).all()):
        return Problem(recipe.origin, "loss", f"its gradient is not finite {where}", loss_line)
    return None


def check_recipes(
    recipes: Mapping[str, Recipe], trials: Iterable[Any] = (), *, defaults: bool = True
) -> list[Problem]:
    """Run the check for every recipe with its defaults (``defaults``) and for every distinct
    (recipe, parameters) of ``trials``; each problem once."""
    todo: dict[tuple[str, str], tuple[Recipe, Mapping[str, Any] | None]] = {}
    if defaults:
        for name, recipe in recipes.items():
            todo[(name, "")] = (recipe, None)
    for trial in trials:
        recipe = recipes.get(trial.method)
        if (
            recipe is None
            or recipe.source is None
            or recipe.source.hash != trial.recipe_source.hash
        ):
            recipe = trial.recipe()
        todo.setdefault(
            (trial.method, json.dumps(trial.params, sort_keys=True)), (recipe, trial.params)
        )
    problems: list[Problem] = []
    for recipe, params in todo.values():
        for problem in check_recipe(recipe, params):
            if problem not in problems:
                problems.append(problem)
    return problems
