"""One seed of the token-level analysis, end to end, as a JSON-ready record.

Reach the analysed state, measure every token, take one step per test and optimizer, and count.
Besides the counts the record keeps every out-of-region token's quantities and its change of
``D_t`` under each step, so the per-token CSV and later analyses need no recomputation.

``sign_accuracy`` judges the predictions themselves rather than the masks: under the keep-all step
(no mask), how often each test's "grows" prediction matches whether ``D_t`` actually grew, on all
out-of-region tokens and on those where the test disagrees with the ratio test. ``rounding`` is the
float32 rounding of the measured changes (against float64), ``topk_mass`` the quantiles of mu's
top-K mass over the analysed tokens. With several analysed minibatches, each is analysed from its
own state and the records are merged (:func:`merge_minibatches`).
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from pdmask.analysis.config import TokenAnalysisConfig
from pdmask.analysis.isolated import LAYERS, isolated_checks
from pdmask.analysis.outcomes import count_outcomes
from pdmask.analysis.quantities import KEEP_ALL, PREDICTIVE, TESTS, measure_tokens
from pdmask.analysis.setting import TrainingSetting
from pdmask.analysis.state import analysed_minibatches
from pdmask.analysis.steps import run_test_steps


def _values(tensor: torch.Tensor, where: torch.Tensor) -> list[float]:
    return [float(v) for v in tensor[where].tolist()]


def _sign_accuracy(grows, d_kl, where, tol) -> dict[str, int]:
    decided = where & (d_kl.abs() > tol)
    correct = decided & (grows == (d_kl > tol))
    return {"correct": int(correct.sum()), "total": int(decided.sum())}


TOPK_MASS_QUANTILES = (0.01, 0.1, 0.5, 0.9)


def _topk_mass(setup, index: torch.Tensor, valid: torch.Tensor) -> list[float]:
    """Quantiles (``TOPK_MASS_QUANTILES``) of mu's top-K mass over the minibatch's tokens."""
    logprobs = setup.batch.generation.mu_topk_logprobs[index]
    mass = torch.logsumexp(logprobs.double(), dim=-1).exp()[valid]
    if mass.numel() == 0:
        return [math.nan] * len(TOPK_MASS_QUANTILES)
    return torch.quantile(mass, torch.tensor(TOPK_MASS_QUANTILES, dtype=mass.dtype)).tolist()


def _analyse_minibatch(cfg, setting, state, isolated_tokens: int, seed: int) -> dict[str, Any]:
    q = measure_tokens(state.setup, state.index, setting.delta)
    tol = cfg.tie_tol
    outcomes, rates, roundings = run_test_steps(
        state.setup, state.index, q, cfg.optimizers, cfg.sgd_lr, tol
    )
    isolated = {
        layers: isolated_checks(
            state.setup,
            state.index,
            q,
            setting.delta,
            isolated_tokens,
            torch.Generator().manual_seed(seed),  # the same tokens for both variants
            layers,
        )
        for layers in LAYERS
    }
    oor = q.out_of_region
    record: dict[str, Any] = {
        "tokens": int(q.valid.sum()),
        "updated": int((q.valid & (q.advantages != 0)).sum()),
        "out_of_region": int(oor.sum()),
        "disagree": {t: int(q.disagree(t).sum()) for t in PREDICTIVE},
        "kernel_scale": q.kernel_scale,  # the kernel test's fitted c
        "lr": rates,
        "outcomes": {},
        "isolated": isolated,
        "sign_accuracy": {},
        "rounding": roundings,
        "topk_mass": _topk_mass(state.setup, state.index, q.valid),
        "tokens_oor": {
            "minibatch": [state.position] * int(oor.sum()),
            "kl_topk": _values(q.kl_topk, oor),
            "kl_full": _values(q.kl_full, oor),
            "ratio": _values(q.ratio, oor),
            "advantage": _values(q.advantages, oor),
            **{f"ddot_{k}": _values(v, oor) for k, v in q.ddot.items()},
            "d_kl": {},
        },
    }
    for opt, per_test in outcomes.items():
        record["outcomes"][opt] = {}
        for test, outcome in per_test.items():
            counts = count_outcomes(outcome.d_kl, q.kept(test), tol)
            counts["masked"] = int(q.mask(test).sum())
            counts["rms_dlogp"] = outcome.rms_dlogp
            record["outcomes"][opt][test] = counts
        record["tokens_oor"]["d_kl"][opt] = {t: _values(o.d_kl, oor) for t, o in per_test.items()}
        reference = per_test[KEEP_ALL].d_kl
        accuracy = {t: {"all": _sign_accuracy(q.grows[t], reference, oor, tol)} for t in TESTS}
        for t in PREDICTIVE:
            accuracy[t]["disagree"] = _sign_accuracy(q.grows[t], reference, q.disagree(t), tol)
        record["sign_accuracy"][opt] = accuracy
    return record


def merge_minibatches(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One seed's record from its analysed minibatches' records: counts (ints) add up, per-token
    lists are concatenated, rates and step sizes (floats) and the top-K mass quantiles are
    averaged; the rounding keeps the worst case; the isolated checks come from the last
    minibatch, where they were drawn."""

    def merge(values: list[Any]) -> Any:
        first = values[0]
        if isinstance(first, dict):
            return {k: merge([v[k] for v in values]) for k in first}
        if isinstance(first, list):
            return [x for v in values for x in v]
        if isinstance(first, bool) or not isinstance(first, int | float):
            return first
        return sum(values) if isinstance(first, int) else sum(values) / len(values)

    special = ("isolated", "rounding", "topk_mass")
    out = {k: merge([p[k] for p in parts]) for k in parts[0] if k not in special}
    out["topk_mass"] = [
        sum(col) / len(col) for col in zip(*(p["topk_mass"] for p in parts), strict=True)
    ]
    out["isolated"] = parts[-1]["isolated"]
    out["rounding"] = {}
    for opt in parts[0]["rounding"]:
        cells = [p["rounding"][opt] for p in parts]
        merged = merge(cells)  # counts add up
        merged["max_abs"] = max(c["max_abs"] for c in cells)
        merged["max_abs_oor"] = max(c["max_abs_oor"] for c in cells)
        out["rounding"][opt] = merged
    return out


def analyse_seed(cfg: TokenAnalysisConfig, setting: TrainingSetting, seed: int) -> dict[str, Any]:
    """Analyse every analysed minibatch of the seed and merge them into the seed's record."""
    started = time.perf_counter()
    parts, positions, reward_mean = [], [], math.nan
    analysed = list(range(cfg.analysed_minibatches))
    for k, state in zip(analysed, analysed_minibatches(setting, cfg, seed), strict=False):
        last = k == analysed[-1]
        isolated = cfg.isolated_tokens if last else 0  # drawn once, on the most stale minibatch
        parts.append(_analyse_minibatch(cfg, setting, state, isolated, seed))
        positions.append(state.position)
        reward_mean = state.reward_mean
    record = {"seed": seed, "reward_mean": reward_mean, **merge_minibatches(parts)}
    record["analysed_positions"] = positions
    record["wall_s"] = time.perf_counter() - started
    return record
