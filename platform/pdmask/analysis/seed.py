"""One seed of the token-level analysis, end to end, as a JSON-ready record.

Reach the analysed state, measure every token, take one step per test and optimizer, and count.
Besides the counts the record keeps every out-of-region token's quantities and its change of
``D_t`` under each step, so the per-token CSV and later analyses need no recomputation.

``sign_accuracy`` judges the predictions themselves rather than the masks: under the keep-all step
(no mask), how often each test's "grows" prediction matches whether ``D_t`` actually grew, on all
out-of-region tokens and on those where the test disagrees with the ratio test.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from pdmask.analysis.config import TokenAnalysisConfig
from pdmask.analysis.isolated import LAYERS, isolated_checks
from pdmask.analysis.outcomes import count_outcomes
from pdmask.analysis.quantities import KEEP_ALL, PREDICTIVE, TESTS, measure_tokens
from pdmask.analysis.setting import TrainingSetting
from pdmask.analysis.state import reach_analysis_state
from pdmask.analysis.steps import run_test_steps


def _values(tensor: torch.Tensor, where: torch.Tensor) -> list[float]:
    return [float(v) for v in tensor[where].tolist()]


def _sign_accuracy(grows, d_kl, where, tol) -> dict[str, int]:
    decided = where & (d_kl.abs() > tol)
    correct = decided & (grows == (d_kl > tol))
    return {"correct": int(correct.sum()), "total": int(decided.sum())}


def analyse_seed(cfg: TokenAnalysisConfig, setting: TrainingSetting, seed: int) -> dict[str, Any]:
    started = time.perf_counter()
    state = reach_analysis_state(setting, cfg, seed)
    q = measure_tokens(state.setup, state.index, setting.delta)
    outcomes, rates = run_test_steps(state.setup, state.index, q, cfg.optimizers, cfg.sgd_lr)
    isolated = {
        layers: isolated_checks(
            state.setup,
            state.index,
            q,
            setting.delta,
            cfg.isolated_tokens,
            torch.Generator().manual_seed(seed),  # the same tokens for both variants
            layers,
        )
        for layers in LAYERS
    }
    oor, tol = q.out_of_region, cfg.tie_tol
    record: dict[str, Any] = {
        "seed": seed,
        "reward_mean": state.reward_mean,
        "tokens": int(q.valid.sum()),
        "updated": int((q.valid & (q.advantages != 0)).sum()),
        "out_of_region": int(oor.sum()),
        "disagree": {t: int(q.disagree(t).sum()) for t in PREDICTIVE},
        "lr": rates,
        "outcomes": {},
        "isolated": isolated,
        "sign_accuracy": {},
        "tokens_oor": {
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
    record["wall_s"] = time.perf_counter() - started
    return record
