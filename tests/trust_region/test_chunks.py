"""Rows per chunk of the logits pass: the device type's element budget unless told otherwise."""

from __future__ import annotations

import pytest
import torch

from pdmask.trust_region.logits_pass import CHUNK_ELEMENTS, chunked_logits_pass, rows_per_chunk

QWEN3_VOCAB = 151_936


def test_cpu_chunks_stay_cache_sized_gpu_chunks_amortise_launches():
    assert rows_per_chunk(QWEN3_VOCAB, None, "cpu") == 1  # 2**18 elements: one row, 0.6 MB
    assert rows_per_chunk(QWEN3_VOCAB, None, "cuda") == 441  # 2**26 elements: 256 MiB
    assert rows_per_chunk(QWEN3_VOCAB, None, torch.device("cuda", 3)) == 441
    # a device type with no budget of its own (e.g. an NPU) gets the conservative CPU one
    assert rows_per_chunk(QWEN3_VOCAB, None, "meta") == CHUNK_ELEMENTS["cpu"] // QWEN3_VOCAB


def test_an_explicit_chunk_size_wins_and_is_checked():
    assert rows_per_chunk(QWEN3_VOCAB, 64, "cuda") == 64
    assert rows_per_chunk(2**30, None, "cpu") == 1  # wider than the budget: one row at a time
    with pytest.raises(ValueError, match="chunk_size must be >= 1"):
        rows_per_chunk(QWEN3_VOCAB, 0)


def test_chunking_changes_no_number():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(37, 300, generator=g, dtype=torch.float64)
    sampled = torch.randint(0, 300, (37,), generator=g)
    support = torch.randint(0, 300, (37, 5), generator=g)
    one = chunked_logits_pass(logits, sampled, support, chunk_size=1)
    whole = chunked_logits_pass(logits, sampled, support, chunk_size=37)
    for a, b in zip(
        (one.logp_sampled, one.logp_support, one.tail_mass, one.tail_sum_sq),
        (whole.logp_sampled, whole.logp_support, whole.tail_mass, whole.tail_sum_sq),
        strict=True,
    ):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-15)
