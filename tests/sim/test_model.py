"""The stand-in transformer: decoding with the cache, the MoE's routing, the stand-in presets."""

from __future__ import annotations

import torch

from pdmask.backends.sim import STAND_INS
from pdmask.backends.sim.model import MixtureOfExperts
from pdmask.backends.sim.task import DEFAULT_TASK
from pdmask.backends.sim.warmstart import new_model


def _params(name: str) -> int:
    return sum(p.numel() for p in new_model(STAND_INS[name]).parameters())


def test_stand_ins_grow_and_the_30b_one_is_a_mixture_of_experts():
    assert _params("tiny-4b") < _params("tiny-8b") < _params("tiny-30b-a3b")
    moe = STAND_INS["tiny-30b-a3b"]
    assert moe.n_experts > moe.experts_per_token > 0
    model = new_model(moe)
    assert any(isinstance(m, MixtureOfExperts) for m in model.modules())
    assert model.lm_head.out_features == DEFAULT_TASK.vocab_size >= 1000


def test_cached_decoding_matches_the_full_forward():
    torch.manual_seed(0)
    for name in ("tiny-4b", "tiny-30b-a3b"):
        model = new_model(STAND_INS[name]).eval()
        ids = torch.randint(0, DEFAULT_TASK.vocab_size, (3, DEFAULT_TASK.seq_len))
        with torch.no_grad():
            full = model(ids)
            prompt = DEFAULT_TASK.prompt_len
            logits, cache = model(ids[:, :prompt], return_cache=True)
            steps = [logits]
            for t in range(prompt, ids.shape[1]):
                logits, cache = model(ids[:, t : t + 1], cache=cache, return_cache=True)
                steps.append(logits)
        assert torch.allclose(torch.cat(steps, 1), full, atol=1e-5), name


def test_logits_from_returns_the_tail_positions_only():
    torch.manual_seed(0)
    model = new_model(STAND_INS["tiny-4b"]).eval()
    ids = torch.randint(0, DEFAULT_TASK.vocab_size, (2, 9))
    with torch.no_grad():
        assert torch.allclose(model(ids, logits_from=6), model(ids)[:, 6:], atol=1e-6)


def test_each_token_uses_exactly_k_experts():
    torch.manual_seed(0)
    moe = MixtureOfExperts(d_model=16, d_ff=8, n_experts=4, experts_per_token=2)
    x = torch.randn(5, 16)
    out = moe(x)
    # Reference: per token, the softmax-weighted sum of its top-2 experts only.
    scores = moe.router(x)
    for i in range(5):
        top = scores[i].topk(2)
        gates = top.values.softmax(-1)
        expected = sum(
            g * moe.experts[int(e)](x[i : i + 1]) for g, e in zip(gates, top.indices, strict=True)
        )
        assert torch.allclose(out[i : i + 1], expected, atol=1e-6)


def test_bf16_linear_rounds_the_float32_product_like_the_native_bf16_kernel():
    """Both accumulate in float32 and round once to bf16; only the summation order differs. Two
    float32 sums of the same K terms differ by at most 2 K 2^-24 sum|x w| (the accumulation
    error bound), and each is then rounded to bf16 (one step, 2^-7 relative, apart at most)."""
    from pdmask.backends.sim.model import linear

    torch.manual_seed(0)
    for rows, k, out in ((256, 64, 192), (64 * 11, 256, 64), (512, 64, 1025)):
        x = torch.randn(rows, k).bfloat16()
        w = (torch.randn(out, k) * 0.1).bfloat16()
        ours = linear(x, w, None)
        native = torch.nn.functional.linear(x, w)
        assert ours.dtype == torch.bfloat16
        step = torch.finfo(torch.bfloat16).eps * torch.maximum(ours.abs(), native.abs()).float()
        terms = x.float().abs() @ w.float().abs().T
        accumulation = 2 * k * torch.finfo(torch.float32).eps / 2 * terms
        assert ((ours.float() - native.float()).abs() <= step + accumulation).all()
        assert (ours == native).float().mean() > 0.99  # a boundary case is rare, not the rule
    x32 = torch.randn(8, 64)
    w32 = torch.randn(16, 64)
    assert torch.equal(linear(x32, w32, None), torch.nn.functional.linear(x32, w32))
