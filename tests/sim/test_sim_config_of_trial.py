"""Trial -> embedded-backend config: the recipe's parameters reach the trainer."""

from __future__ import annotations

import pytest

from pdmask.backends.sim.backend import sim_config
from pdmask.errors import ConfigError
from pdmask.registry import Trial, load_registry

PDM_AGG = load_registry().recipes["pdm-agg"]
BASE = dict(
    sweep="s",
    method="pdm-agg",
    recipe_version=1,
    recipe_source=PDM_AGG.source,
    params={"delta": 0.05, "topk": 12, "ratio_cap": 3.0},
    model="qwen3-30b-a3b-base",
    precision="fp8-e2e",
    delta=0.05,
    seed=4,
    backend="sim",
    profile="smoke",
)


def test_recipe_parameters_reach_the_sim_config():
    cfg = sim_config(Trial(**BASE))
    assert (cfg.stand_in, cfg.precision, cfg.seed, cfg.profile) == (
        "tiny-30b-a3b",
        "fp8-e2e",
        4,
        "smoke",
    )
    assert (cfg.delta, cfg.top_k, cfg.ratio_cap) == (0.05, 12, 3.0)


def test_invalid_combination_is_a_config_error():
    with pytest.raises(ConfigError, match="embedded backend"):
        sim_config(Trial(**{**BASE, "params": {**BASE["params"], "ratio_cap": 0.5}}))
