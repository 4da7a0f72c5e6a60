"""FP8 (e4m3) emulation and the precision settings' behaviour copies."""

from __future__ import annotations

import pytest
import torch

from pdmask.backends.sim.fp8 import E4M3_MAX, fake_quant_fp8
from pdmask.backends.sim.model import QuantLinear


def test_per_tensor_rounding_lands_on_the_scaled_e4m3_grid():
    x = torch.randn(32, 16)
    q = fake_quant_fp8(x, "per-tensor")
    scale = x.abs().max() / E4M3_MAX
    grid = (q / scale).to(torch.float8_e4m3fn).float() * scale
    assert torch.allclose(q, grid)
    assert 0 < float((q - x).abs().max()) <= float(x.abs().max()) / 16  # 3 mantissa bits


def test_per_channel_scales_each_row_so_small_rows_keep_precision():
    x = torch.randn(4, 64)
    x[0] *= 1e-6  # a small output channel: below e4m3's range under the shared scale
    err_tensor = (fake_quant_fp8(x, "per-tensor") - x)[0].abs().max()
    err_channel = (fake_quant_fp8(x, "per-channel") - x)[0].abs().max()
    assert err_channel < err_tensor / 10


def test_rounding_is_idempotent_and_rejects_unknown_scaling():
    x = torch.randn(8, 8)
    q = fake_quant_fp8(x, "per-channel")
    assert torch.allclose(fake_quant_fp8(q, "per-channel"), q)
    with pytest.raises(ValueError, match="per-block"):
        fake_quant_fp8(x, "per-block")


def test_fp8_linear_rounds_the_forward_and_passes_gradients_straight_through():
    torch.manual_seed(0)
    layer = QuantLinear(8, 4)
    x = torch.randn(3, 8, requires_grad=True)
    plain = layer(x)
    layer.weight_fp8, layer.activation_fp8 = "per-tensor", True
    rounded = layer(x)
    assert not torch.allclose(plain, rounded)
    rounded.sum().backward()
    # Straight-through: the rounding's own derivative is taken as 1, so each operand's gradient
    # is the (rounded) other operand, as in FP8 training.
    w_q = fake_quant_fp8(layer.weight.detach(), "per-tensor")
    x_q = fake_quant_fp8(x.detach(), "per-channel")
    assert torch.allclose(x.grad, w_q.sum(0).expand(3, 8))
    assert torch.allclose(layer.weight.grad, x_q.sum(0).expand(4, 8))


def test_table_decoding_equals_the_float8_cast_for_every_bit_pattern():
    from pdmask.backends.sim.fp8 import decode_e4m3

    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn)
    ours, cast = decode_e4m3(codes), codes.float()
    assert torch.equal(ours.isnan(), cast.isnan())
    assert torch.equal(ours[~ours.isnan()], cast[~cast.isnan()])
    x = torch.randn(3, 5, 7) * 100
    assert torch.equal(decode_e4m3(x.to(torch.float8_e4m3fn)), x.to(torch.float8_e4m3fn).float())


def test_the_cached_rounded_weight_follows_every_in_place_update():
    torch.manual_seed(0)
    layer = QuantLinear(8, 4)
    layer.weight_fp8 = "per-channel"
    first = layer.rounded_weight()
    assert layer.rounded_weight() is first  # no change, no new rounding
    with torch.no_grad():
        layer.weight.mul_(3.0)
    assert torch.equal(layer.rounded_weight(), fake_quant_fp8(layer.weight.detach(), "per-channel"))
    layer.load_state_dict({"weight": torch.randn(4, 8)})
    assert torch.equal(layer.rounded_weight(), fake_quant_fp8(layer.weight.detach(), "per-channel"))


def test_experts_share_one_rounding_of_their_input_with_the_same_result():
    """Per-token scaling makes the rounding of a routed subset equal to the subset of the rounding:
    the mixture's output must equal a per-expert reference that rounds each subset itself."""
    from pdmask.backends.sim.model import MixtureOfExperts

    torch.manual_seed(0)
    moe = MixtureOfExperts(16, 32, n_experts=4, experts_per_token=2)
    for layer in moe.modules():
        if isinstance(layer, QuantLinear):
            layer.activation_fp8, layer.weight_fp8 = True, "per-tensor"
    x = torch.randn(5, 6, 16)
    flat = x.reshape(-1, 16)
    top_val, top_idx = moe.router(flat).topk(2, dim=-1)
    gates = top_val.softmax(-1)
    expected = torch.zeros_like(flat)
    for e, expert in enumerate(moe.experts):
        token, slot = (top_idx == e).nonzero(as_tuple=True)
        expected.index_add_(0, token, expert(flat[token]) * gates[token, slot, None])
    assert torch.equal(moe(x), expected.view_as(x))
