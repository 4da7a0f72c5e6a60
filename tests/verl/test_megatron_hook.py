"""pdmask's logits hook inside verl's Megatron engine (``backends/verl/megatron_processor.py``),
on a real TP-2 group (gloo over loopback, Megatron-Core's ``parallel_state``): on each rank's
vocabulary shard, with mu's top-K rows and the sampled ids placed by verl's own Megatron
preprocessing (packed ``thd``, with and without FP8 padding, and padded ``bshd``), every output
equals the FSDP hook's on the full logits of the same micro-batch, back in the samples' rows
through verl's postprocessing. Context parallelism and the old-policy pass are refused by name.

Tolerance: float32 logits, the full pass's and the shards' sums in another order: 1e-5."""

from __future__ import annotations

import json

import pytest
import torch.multiprocessing as mp

pytest.importorskip("verl")
pytest.importorskip("megatron.core")
pytestmark = pytest.mark.verl

from pdmask.backends.verl.megatron_processor import refuse_unsupported  # noqa: E402
from pdmask.errors import ConfigError  # noqa: E402

from .megatron_hook_ranks import RANKS, run  # noqa: E402


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    folder = tmp_path_factory.mktemp("megatron-hook")
    mp.spawn(run, args=(str(folder),), nprocs=RANKS, join=True)
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(RANKS)]


@pytest.mark.parametrize("layout", ["thd", "thd-fp8-padding", "bshd"])
def test_the_hook_on_shards_equals_the_fsdp_hook_on_full_logits(ranks, layout):
    for rank, result in enumerate(ranks):
        assert result["keys_equal"]
        case = result[layout]
        for key, error in case["errors"].items():
            assert error <= 1e-5, (rank, layout, key, case)
    padded = [ranks[0][name]["rows"] for name in ("thd", "thd-fp8-padding")]
    assert padded[0] != padded[1]  # FP8 padding moves the rows: the hook must follow it


def test_context_parallel_and_the_old_policy_pass_are_refused_by_name():
    with pytest.raises(ConfigError, match="context_parallel_size=2"):
        refuse_unsupported(2, old_phase=False)
    with pytest.raises(ConfigError, match="pdm_mu_source=recompute"):
        refuse_unsupported(1, old_phase=True)
    refuse_unsupported(1, old_phase=False)
