"""One state folder per test session (the smoke base model is built once) and a tiny analysed state.

``analysed`` is a real analysis state of the smoke profile: the trial trained one RL step, a small
rollout, its first minibatch trained. The smoke base model rarely solves a problem, so the rollout's
advantages are replaced by fixed random values: every response token then takes part, which is what
the brute-force checks need (the quantities do not depend on where the advantages came from).
"""

from __future__ import annotations

import pytest
import torch

from pdmask.analysis.config import TokenAnalysisConfig
from pdmask.analysis.setting import resolve_setting
from pdmask.analysis.state import guarded_update, reach_analysis_state

STALE_UPDATES = 4
SMALL = {
    "profile": "smoke",
    "train_steps": 1,
    "prompts": 6,
    "minibatches": 2,
    "analysed_minibatches": 1,
    "isolated_tokens": 4,
    "delta": 0.02,
}


@pytest.fixture(scope="session")
def pdm_home(tmp_path_factory):
    """``PDM_HOME`` for the whole session (child processes inherit it)."""
    home = tmp_path_factory.mktemp("pdm-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PDM_HOME", str(home))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        yield home


@pytest.fixture
def small_config():
    return TokenAnalysisConfig(**SMALL, seeds=1)


@pytest.fixture
def analysed(pdm_home, small_config):
    """(setting, AnalysedState) with random, all non-zero advantages."""
    setting = resolve_setting(small_config)
    torch.set_num_threads(1)
    state = reach_analysis_state(setting, small_config, seed=0)
    batch = state.setup.batch
    generator = torch.Generator().manual_seed(1)
    batch.advantages = torch.randn(batch.size, generator=generator).clamp(-2, 2)
    batch.advantages[batch.advantages.abs() < 0.05] = 0.5
    # Stale updates with these advantages on the other sequences, so pi drifts away from mu as it
    # does for a late minibatch (the smoke rollout's own updates had no reward signal to follow).
    others = torch.tensor([i for i in range(batch.size) if i not in set(state.index.tolist())])
    for _ in range(STALE_UPDATES):
        guarded_update(state.setup, torch.zeros_like(batch.valid[others]), others)
    return setting, state


@pytest.fixture
def median_delta(analysed):
    """A threshold that puts about half the tokens out of region."""
    from pdmask.analysis.quantities import measure_tokens

    setting, state = analysed
    q = measure_tokens(state.setup, state.index, setting.delta)
    return float(q.kl_topk[q.valid].median())
