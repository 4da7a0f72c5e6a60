"""The logits pass's CPU kernels compiled by inductor (``compiled_pass``): held to float64 like
the Triton kernels, the caller's logits left bit for bit as they were, and a fall back to the
chunked pass where the kernels cannot be built.

The kernels are compiled once per test process (inductor's cache makes later processes faster);
the cases go through ``_ChunkedLogitsPass`` with the kernels named, so they need not be as wide
as ``MIN_VOCAB``, the width from which ``chunked_logits_pass`` picks them itself."""

from __future__ import annotations

import pytest
import torch

from pdmask.trust_region import compiled_pass
from pdmask.trust_region.logits_pass import _ChunkedLogitsPass, chunked_logits_pass, fused_kernels

from .fused_cases import (
    assert_matches_float64,
    assert_second_order_matches_float64,
    case,
    second_order_case,
)

pytestmark = pytest.mark.skipif(
    not compiled_pass.available(), reason="no C++ compiler: the chunked pass serves"
)


@pytest.mark.parametrize(
    "args, flags",
    [
        ((0, 37, 5000, 21, torch.bfloat16), {"second_order": True}),
        ((1, 9, 2048, 6, torch.float32), {}),
        ((2, 5, 300, 3, torch.float16), {"second_order": True, "strided": True}),
        ((3, 0, 300, 3, torch.bfloat16), {}),  # no rows
        ((4, 23, 5000, 21, torch.bfloat16), {"entropy": True}),
        ((5, 23, 5000, 21, torch.bfloat16), {"support_grad": True}),
        ((6, 11, 3000, 8, torch.float32), {"entropy": True, "support_grad": True}),
        ((7, 13, 3000, 8, torch.bfloat16), {"entropy": True, "support_grad": True, "padded": 96}),
    ],
)
def test_the_compiled_pass_equals_float64_forward_and_backward(args, flags):
    assert_matches_float64(case(compiled_pass, *args, **flags))
    assert compiled_pass.available(), compiled_pass._failure  # built, not the chunks' fallback


def test_the_second_order_statistics_from_the_compiled_pass_equal_float64():
    """``compute_token_stats(inputs=("second_order",))`` at a real LLM's width (the pass picks
    the compiled kernels itself from ``MIN_VOCAB`` on) against the float64 reference."""
    assert_second_order_matches_float64(
        second_order_case(8, 4, compiled_pass.MIN_VOCAB, 20, torch.bfloat16)
    )
    assert compiled_pass.available(), compiled_pass._failure


def test_the_chunked_pass_equals_float64_on_a_padded_vocabulary():
    """The same padded case through the chunks (``pi log pi`` and ``g_H z`` at ``-inf``)."""
    flags = {"entropy": True, "support_grad": True, "padded": 96}
    assert_matches_float64(case(None, 7, 13, 3000, 8, torch.bfloat16, **flags))


def _inputs(n=6, vocab=4000, m=5, seed=0, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    logits = (3 * torch.randn(n, vocab, generator=g)).to(dtype)
    sampled = torch.randint(0, vocab, (n,), generator=g)
    support = torch.randint(0, vocab, (n, m), generator=g)
    support[:, -1] = sampled
    return logits, sampled, support


def _run(kernels, logits, sampled, support, entropy=True, support_grad=True):
    x = logits.detach().clone().requires_grad_(True)
    out = _ChunkedLogitsPass.apply(x, sampled, support, 1, False, entropy, support_grad, kernels)
    g = torch.Generator().manual_seed(1)
    n, m = support.shape
    total = (out[0] * torch.randn(n, generator=g)).sum()
    if support_grad:
        total = total + (out[1] * torch.randn(n, m, generator=g)).sum()
        total = total + (out[2] * torch.randn(n, generator=g)).sum()
    if entropy:
        total = total + (out[5] * torch.randn(n, generator=g)).sum()
    total.backward()
    return [o.detach() for o in out if o is not None], x.grad


def test_padded_rows_are_summed_again_a_block_of_rows_at_a_time(monkeypatch):
    monkeypatch.setattr(compiled_pass, "_RERUN_ROWS", 4)  # 13 padded rows: blocks of 4, 4, 4, 1
    flags = {"entropy": True, "support_grad": True, "padded": 96}
    assert_matches_float64(case(compiled_pass, 8, 13, 3000, 8, torch.bfloat16, **flags))


def test_the_callers_logits_are_left_bit_for_bit_and_unversioned():
    logits, sampled, support = _inputs()
    before = logits.clone()
    x = logits.requires_grad_(True)
    version = x._version
    out = _ChunkedLogitsPass.apply(x, sampled, support, 1, False, True, True, compiled_pass)
    assert torch.equal(x.detach(), before)  # -inf written at the support, then restored
    assert x._version == version  # written through an alias: autograd's counter did not move
    (out[0].sum() + out[5].sum()).backward()  # and the graph still differentiates
    assert torch.isfinite(x.grad.float()).all()


def test_a_failed_compilation_restores_the_logits_and_the_chunks_serve(monkeypatch):
    logits, sampled, support = _inputs()
    want, want_grad = _run(None, logits, sampled, support)

    def kernel_that_cannot_be_built(*_flags):
        def run(_logits):
            raise torch._dynamo.exc.BackendCompilerFailed(run, RuntimeError("no compiler"), None)

        return run

    monkeypatch.setattr(compiled_pass, "_forward_kernel", kernel_that_cannot_be_built)
    monkeypatch.setattr(compiled_pass, "_failure", None)
    before = logits.clone()
    with pytest.warns(RuntimeWarning, match="chunked pass runs instead"):
        got, got_grad = _run(compiled_pass, logits, sampled, support)
    assert torch.equal(logits, before)
    for a, b in zip(got, want, strict=True):  # the chunked pass's results, exactly
        assert torch.equal(a, b)
    assert torch.equal(got_grad, want_grad)
    assert not compiled_pass.available()  # and later passes go straight to the chunks
    assert fused_kernels(torch.zeros(2, compiled_pass.MIN_VOCAB), None) is None


def test_no_compiler_means_the_chunks(monkeypatch):
    monkeypatch.setattr(compiled_pass, "_failure", None)
    monkeypatch.setattr(compiled_pass, "_compiler", lambda: "no-such-compiler-for-pdmask")
    assert not compiled_pass.available()
    assert fused_kernels(torch.zeros(2, compiled_pass.MIN_VOCAB), None) is None


def test_chunked_logits_pass_picks_the_compiled_kernels_from_min_vocab_on():
    wide = torch.zeros(2, compiled_pass.MIN_VOCAB, dtype=torch.bfloat16)
    assert fused_kernels(wide, None) is compiled_pass
    assert fused_kernels(wide.float(), None) is compiled_pass
    assert fused_kernels(wide[:, :-1], None) is None  # a toy vocabulary: compiling costs more
    assert fused_kernels(wide, 1) is None  # a chunk size asks for chunks
    assert fused_kernels(wide.double(), None) is None  # float64 math stays float64
    logits, sampled, support = _inputs(n=3, vocab=compiled_pass.MIN_VOCAB, seed=3)
    via_rule = chunked_logits_pass(logits, sampled, support, entropy=True)
    direct, _ = _run(compiled_pass, logits, sampled, support, support_grad=False)
    assert torch.equal(via_rule.entropy, direct[-1])


def test_ids_at_minus_infinity_are_padding_and_an_empty_tail_sums_to_zero():
    """Logits at -inf (a padded vocabulary) change nothing but the width: every output equals the
    unpadded logits' and their gradient is 0; a row whose tail is all -inf has a zero tail."""
    logits, sampled, support = _inputs(n=4, vocab=3000)
    padded = torch.cat([logits, torch.full((4, 96), float("-inf"), dtype=logits.dtype)], 1)
    padded[3, :3000] = float("-inf")  # row 3: only its support is finite
    padded[3, support[3]] = logits[3, support[3]]
    unpadded = padded[:, :3000].clone()
    got, got_grad = _run(compiled_pass, padded, sampled, support)
    want, want_grad = _run(None, unpadded, sampled, support)
    assert all(torch.isfinite(t).all() for t in got)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert got[2][3] == 0  # the empty tail
    assert torch.equal(got_grad[:, 3000:], torch.zeros_like(got_grad[:, 3000:]))
    torch.testing.assert_close(got_grad[:, :3000].float(), want_grad.float(), rtol=2**-7, atol=1e-6)


def test_rows_that_share_their_entries_are_copied_first():
    row = 3 * torch.randn(1, 2000, generator=torch.Generator().manual_seed(4))
    logits = row.bfloat16().expand(3, 2000)  # one row seen three times
    sampled = torch.tensor([0, 1, 2])
    support = torch.tensor([[0, 5], [1, 6], [2, 7]])
    out = _ChunkedLogitsPass.apply(logits, sampled, support, 1, False, True, False, compiled_pass)
    want = _ChunkedLogitsPass.apply(
        logits.contiguous(), sampled, support, 1, False, True, False, None
    )
    for a, b in zip(out, want, strict=True):
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_every_kernel_variant_compiles_on_its_own_code():
    """dynamo runs a code object eagerly after 8 recompilations (float32 ``[N, V]`` copies here):
    each dtype and flag set gets its own."""
    variants = [
        compiled_pass._forward_kernel(dtype, entropy, cube, padded)
        for dtype in (torch.bfloat16, torch.float16, torch.float32)
        for entropy in (False, True)
        for cube in (False, True)
        for padded in (False, True)
    ]
    variants += [
        compiled_pass._backward_kernel(dtype, entropy, padded)
        for dtype in (torch.bfloat16, torch.float16, torch.float32)
        for entropy in (False, True)
        for padded in (False, True)
    ]
    codes = {id(v._torchdynamo_orig_callable.__code__) for v in variants}
    assert len(codes) == len(variants)
