"""The stand-in policy: a small decoder-only transformer built from torch building blocks.

Pre-norm blocks (``nn.LayerNorm``, ``F.scaled_dot_product_attention`` with a causal mask, a GELU
MLP or a top-k routed mixture of experts to mirror Qwen3-30B-A3B), learned positions, an untied
``lm_head`` whose width is the task's vocabulary (>= 1,000, so a top-20 view is a truncation).

Every dense layer inside the blocks is a :class:`QuantLinear`, whose attributes switch an FP8
(e4m3) fake-quantised forward on or off; that is how the behaviour copy and the ``fp8-e2e``
trainer emulate FP8 kernels (see ``precision.py``). Embeddings and ``lm_head`` stay in high
precision, as FP8 serving engines keep them.

Every linear layer computes a bf16 product in float32 and rounds the result to bf16 once
(:func:`linear`): the arithmetic of a bf16 GEMM (float32 accumulation, output rounded), as the
CPU's own bf16 kernel does it, but ~17x faster on a CPU without native bf16 instructions, where
that kernel is a slow reference loop (it dominated the behaviour copy's rollouts and evaluations).

Generation uses a key/value cache (``forward(..., cache=...)``): all sequences of a batch share one
length (fixed-length prompts, lockstep decoding), so the cache is a plain concatenation.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pdmask.backends.sim.fp8 import fake_quant_fp8


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear``; a bf16 product is computed in float32 and rounded to bf16 once.

    A bf16 GEMM accumulates in float32 and rounds its output (CPU oneDNN and GPU tensor cores
    alike); without avx512_bf16/AMX the CPU's bf16 path is a slow reference loop. Only the
    summation order differs, so the result differs from the native kernel's by at most one bf16
    rounding step, on a few outputs in 1e4 (measured; tests/sim/test_model.py checks the bound).
    """
    if x.dtype != torch.bfloat16:
        return F.linear(x, weight, bias)
    out = F.linear(x.float(), weight.float(), None if bias is None else bias.float())
    return out.to(torch.bfloat16)


class Linear(nn.Linear):
    """``nn.Linear`` whose bf16 forward goes through :func:`linear` (same values, fast on CPU)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


class QuantLinear(Linear):
    """``nn.Linear`` with an optional FP8 (e4m3) fake-quantised forward.

    ``weight_fp8`` is ``None`` (weight used as is), ``"per-tensor"`` or ``"per-channel"`` (the
    weight's scaling granularity). ``activation_fp8`` rounds the input per token (FP8 kernels
    quantise both operands). Gradients pass straight through the rounding. The rounded weight is
    cached until the weight changes (its version counter moves on every in-place update: an
    optimizer step, ``load_state_dict``), so it is rounded once per update, not once per forward.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__(in_features, out_features, bias=bias)
        self.weight_fp8: str | None = None
        self.activation_fp8 = False
        self._rounded: tuple[tuple, torch.Tensor] | None = None

    def rounded_weight(self) -> torch.Tensor:
        key = (self.weight._version, self.weight.data_ptr(), self.weight.dtype, self.weight_fp8)
        if self._rounded is None or self._rounded[0] != key:
            self._rounded = (key, fake_quant_fp8(self.weight.detach(), self.weight_fp8))
        return self._rounded[1]

    def quantise_input(self, x: torch.Tensor) -> torch.Tensor:
        """The input as this layer's FP8 kernel sees it (per-token scaling: rows independent)."""
        return _straight_through(x, fake_quant_fp8(x, "per-channel")) if self.activation_fp8 else x

    def forward(self, x: torch.Tensor, *, input_quantised: bool = False) -> torch.Tensor:
        weight = self.weight
        if self.weight_fp8 is not None:
            weight = _straight_through(weight, self.rounded_weight())
        if not input_quantised:
            x = self.quantise_input(x)
        return linear(x, weight, self.bias)


def _straight_through(x: torch.Tensor, rounded: torch.Tensor) -> torch.Tensor:
    """Forward value ``rounded``, gradient of the identity (straight-through estimator)."""
    if not x.requires_grad:
        return rounded
    return x + (rounded - x).detach()


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.qkv = QuantLinear(d_model, 3 * d_model)
        self.out = QuantLinear(d_model, d_model)

    def forward(self, x: torch.Tensor, cache: tuple | None = None):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2) for z in (q, k, v))
        if cache is not None:
            k = torch.cat([cache[0], k], dim=2)
            v = torch.cat([cache[1], v], dim=2)
        # With a cache, the t new queries sit at the end: a causal mask aligned to the bottom right.
        if cache is None or t == 1:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=cache is None)
        else:
            total = k.shape[2]
            mask = torch.ones(t, total, dtype=torch.bool, device=x.device).tril(total - t)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        y = y.transpose(1, 2).reshape(b, t, d)
        return self.out(y), (k, v)


class FeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.up = QuantLinear(d_model, d_ff)
        self.down = QuantLinear(d_ff, d_model)

    def forward(self, x: torch.Tensor, *, input_quantised: bool = False) -> torch.Tensor:
        return self.down(F.gelu(self.up(x, input_quantised=input_quantised)))


class MixtureOfExperts(nn.Module):
    """Top-k routed experts (softmax over the chosen k), as in Qwen3-MoE.

    Tokens are dispatched: each expert runs only on the tokens routed to it, so the compute per
    token is that of ``experts_per_token`` MLPs (the "A3B" of 30B-A3B), whatever ``n_experts``.
    Under FP8 the shared input is rounded once for all experts: the scaling is per token, so a
    routed subset of the rounded rows equals the rounding of that subset.
    """

    def __init__(self, d_model: int, d_ff: int, n_experts: int, experts_per_token: int):
        super().__init__()
        self.router = Linear(d_model, n_experts, bias=False)
        self.experts = nn.ModuleList(FeedForward(d_model, d_ff) for _ in range(n_experts))
        self.k = experts_per_token

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        top_val, top_idx = self.router(flat).topk(self.k, dim=-1)
        gates = top_val.softmax(-1)
        rounded = self.experts[0].up.quantise_input(flat)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            token, slot = (top_idx == e).nonzero(as_tuple=True)
            if token.numel():
                y = expert(rounded[token], input_quantised=True)
                out = out.index_add(0, token, y * gates[token, slot, None])
        return out.view_as(x)


class Block(nn.Module):
    def __init__(self, d_model, n_heads, d_ff, n_experts, experts_per_token):
        super().__init__()
        self.norm_attn = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads)
        self.norm_ff = nn.LayerNorm(d_model)
        if n_experts > 1:
            self.ff = MixtureOfExperts(d_model, d_ff, n_experts, experts_per_token)
        else:
            self.ff = FeedForward(d_model, d_ff)

    def forward(self, x, cache=None):
        h, new_cache = self.attn(self.norm_attn(x), cache)
        x = x + h
        x = x + self.ff(self.norm_ff(x))
        return x, new_cache


class TinyDecoder(nn.Module):
    """Decoder-only transformer: ``forward(ids [B, T]) -> logits [B, T, vocab]``."""

    def __init__(
        self,
        *,
        vocab_size: int,
        max_len: int,
        d_model: int,
        n_layers: int,
        n_heads: int,
        d_ff: int,
        n_experts: int = 1,
        experts_per_token: int = 1,
    ):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(max_len, d_model)
        self.blocks = nn.ModuleList(
            Block(d_model, n_heads, d_ff, n_experts, experts_per_token) for _ in range(n_layers)
        )
        self.norm = nn.LayerNorm(d_model)
        self.lm_head = Linear(d_model, vocab_size, bias=False)
        self.apply(_init_weights)

    def forward(
        self,
        ids: torch.Tensor,
        cache: list | None = None,
        return_cache: bool = False,
        logits_from: int = 0,
    ):
        """Logits at positions ``logits_from..`` (the lm head is the costliest layer: skip what is
        not needed); with ``return_cache`` also the key/value cache for further decoding."""
        start = 0 if cache is None else cache[0][0].shape[2]
        positions = torch.arange(start, start + ids.shape[1], device=ids.device)
        x = self.embed(ids) + self.pos(positions)
        x = x.to(self.lm_head.weight.dtype)
        new_cache = []
        for i, block in enumerate(self.blocks):
            x, layer_cache = block(x, None if cache is None else cache[i])
            new_cache.append(layer_cache)
        logits = self.lm_head(self.norm(x[:, logits_from:]))
        return (logits, new_cache) if return_cache else logits

    def quant_linears(self) -> list[QuantLinear]:
        return [m for m in self.modules() if isinstance(m, QuantLinear)]


def _init_weights(module: nn.Module) -> None:
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, std=0.02)
