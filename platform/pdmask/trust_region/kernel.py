r"""What the network's output layer adds to ``Ddot``: the output-embedding (Gram) kernel term.

``Ddot`` is the derivative of ``D`` when the token's *logits* move along ``v = e_k - pi``. A real
update moves parameters, and the logits follow through the network. For token t with hidden state
``h`` (the lm head's input), output embeddings ``W`` ``[V, d]`` (rows ``w_i``) and ``z = W h``, the
token's own update moves the parameters along ``P grad log pi_k`` (``P`` the optimizer's
preconditioner), so to first order ``D`` changes by ``eta A r <grad D, P grad log pi_k>``. With
``u = dD/dz`` (``pi - mu`` for the full KL) and ``J_h = dh/dtheta``::

    <grad D, grad log pi_k> = |h|^2 <u, v>  +  u^T W K_h W^T v,      K_h = J_h P J_h^T
                              (the lm head)    (every layer below it)

The first part is ``|h|^2 Ddot``: the paper's test, exact when only the lm head moves. With
``K_h ~ c I`` the second is ``c * gram``::

    gram = <W^T u, W^T v> = <W^T u, w_k - W^T pi>

a kernel that couples tokens with similar output embeddings (synonyms): pushing ``k`` up also
pushes up every token whose embedding is close to ``w_k``.

Top-K form (what a trainer that sees mu on its top-K can compute): the support ``S = TopK(mu) ∪
{k}`` plus one tail bucket, as ``Ddot_agg`` treats it, whose embedding is the tail's pi-weighted
mean embedding::

    w_tail    = (W^T pi - sum_S pi_i w_i) / pi_tail
    W^T u_agg = sum_S (pi_i - mu_i) w_i + (pi_tail - mu_tail) w_tail
    gram_agg  = <W^T u_agg, w_k - W^T pi>

``pi_tail w_tail`` is one ``[N, V] x [V, d]`` product (pi off S), walked in row chunks of the
logits and row blocks of ``W``: no ``[N, V]`` float32 copy of the logits, no float32 copy of a bf16
``W``; ``W^T pi`` adds the support's part to it. With ``W = I`` the tail bucket's self-similarity is ``sum_tail pi^2 / pi_tail``, so
``gram_agg`` equals ``Ddot_bucket`` exactly: the check the tests make. The exact full-vocabulary
``gram`` (mu known everywhere) is :func:`pdmask.trust_region.exact.exact_gram`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pdmask.trust_region.logits_pass import compute_dtype, rows_per_chunk
from pdmask.trust_region.support import build_support

VOCAB_BLOCK = 8192
"""Weight rows converted to the compute dtype at a time (the vocabulary's blocks, and the support's
gathered embeddings for ``VOCAB_BLOCK // M`` tokens): 84 MB in float32 at d = 2560."""


@dataclass
class KernelTerms:
    """Per-token terms, shaped like the sampled ids."""

    head: torch.Tensor  # |h|^2: the lm head's share of the own-gradient change is head * Ddot
    gram: torch.Tensor  # <W^T u_agg, w_k - W^T pi>: the output-embedding kernel term

    def combined(self, ddot: torch.Tensor, c: float) -> torch.Tensor:
        """``|h|^2 Ddot + c gram``: the own-gradient change with ``K_h = c I``."""
        return self.head * ddot + c * self.gram


@torch.no_grad()
def kernel_terms(
    logits: torch.Tensor,
    hidden: torch.Tensor,
    weight: torch.Tensor,
    sampled_ids: torch.Tensor,
    mu_topk_ids: torch.Tensor | None,
    mu_topk_logprobs: torch.Tensor | None,
    mu_sampled_logprob: torch.Tensor,
    *,
    chunk_size: int | None = None,
    vocab_block: int | None = None,
) -> KernelTerms:
    """``logits [..., V]`` (= ``hidden @ weight.T``), ``hidden [..., d]``, ``weight [V, d]``, the
    rest as :func:`pdmask.trust_region.compute_token_stats` takes them. Computed in float32
    (float64 from float64 logits), the logits read in row chunks (``chunk_size`` rows) and the
    weight in blocks of ``vocab_block`` rows (default :data:`VOCAB_BLOCK`)."""
    batch_shape = sampled_ids.shape
    vocab = logits.shape[-1]
    if hidden.shape[:-1] != batch_shape or weight.shape != (vocab, hidden.shape[-1]):
        raise ValueError(
            f"hidden {tuple(hidden.shape)} must be {tuple(batch_shape)} + [d] and weight "
            f"{tuple(weight.shape)} [V={vocab}, d]"
        )
    cdt = compute_dtype(logits.dtype)
    z = logits.detach().reshape(-1, vocab)
    n = z.shape[0]
    h = hidden.detach().reshape(n, -1)
    w_src = weight.detach()
    sampled = sampled_ids.reshape(-1).long()
    topk_ids = None if mu_topk_ids is None else mu_topk_ids.reshape(n, -1)
    topk_lp = None if mu_topk_logprobs is None else mu_topk_logprobs.reshape(n, -1)
    mu_k = mu_sampled_logprob.reshape(-1).to(cdt)
    sup = build_support(sampled, mu_k, topk_ids, topk_lp, vocab, dtype=cdt)

    # The tail's embedding sum pi_tail * w_tail straight from pi off S: taking it as W^T pi minus
    # the support's part would cancel catastrophically when pi_tail is tiny. The vocabulary is
    # walked in blocks of the weight, each converted to the compute dtype once (a bf16 lm head is
    # never copied whole to float32), against row chunks of pi = exp(z - logsumexp(z)).
    rows = rows_per_chunk(vocab, chunk_size, z.device)
    lse = torch.cat([torch.logsumexp(z[s : s + rows].to(cdt), -1) for s in range(0, n, rows)])
    valid = sup.valid
    pi_s = torch.where(valid, torch.exp(z.gather(1, sup.ids).to(cdt) - lse[:, None]), 0.0)
    tail_embed = torch.zeros(n, w_src.shape[1], dtype=cdt, device=z.device)
    pi_tail = torch.zeros(n, dtype=cdt, device=z.device)
    block = min(vocab_block or VOCAB_BLOCK, vocab)
    block_rows = rows_per_chunk(block, chunk_size, z.device)
    for v0 in range(0, vocab, block):
        v1 = min(v0 + block, vocab)
        w_block = w_src[v0:v1].to(cdt)
        local = sup.ids - v0
        on_block = valid & (local >= 0) & (local < v1 - v0)
        for r0 in range(0, n, block_rows):
            r1 = min(r0 + block_rows, n)
            probs = torch.exp(z[r0:r1, v0:v1].to(cdt) - lse[r0:r1, None])
            row, slot = on_block[r0:r1].nonzero(as_tuple=True)
            probs[row, local[r0:r1][row, slot]] = 0.0  # the support is not tail
            pi_tail[r0:r1] += probs.sum(-1)  # exact: no 1 - sum
            tail_embed[r0:r1].addmm_(probs, w_block)

    mu_s = sup.mu_logp.exp()  # 0 on invalid slots
    # mu's tail as the statistics take it (an empty tail holds nothing, whatever rounding says)
    mu_tail = (-torch.special.expm1(torch.logsumexp(sup.mu_logp, dim=-1))).clamp_min(0.0)
    mu_tail = torch.where(sup.size >= vocab, 0.0, mu_tail)
    tail_weight = torch.where(pi_tail > 0, (pi_tail - mu_tail) / pi_tail, 0.0)
    # The support's embeddings are gathered for as many rows at a time as a weight block holds
    # (all at once, [n, M, d] in float32, is 880 MB at n = 4096, M = 21, d = 2560), and each
    # row chunk is finished there: only the tail's embeddings are kept for every row.
    gram = torch.empty(n, dtype=cdt, device=z.device)
    head = torch.empty(n, dtype=cdt, device=z.device)
    gather_rows = max(1, block // sup.ids.shape[1])
    for r0 in range(0, n, gather_rows):
        r1 = min(r0 + gather_rows, n)
        w_s = w_src[sup.ids[r0:r1]].to(cdt)  # [rows, M, d]
        tail = tail_embed[r0:r1]
        pi_embed = tail + torch.einsum("nm,nmd->nd", pi_s[r0:r1], w_s)  # W^T pi
        u_embed = torch.einsum("nm,nmd->nd", pi_s[r0:r1] - mu_s[r0:r1], w_s)
        u_embed += tail_weight[r0:r1, None] * tail
        v_embed = w_src[sampled[r0:r1]].to(cdt) - pi_embed
        gram[r0:r1] = torch.linalg.vecdot(u_embed, v_embed)
        h_rows = h[r0:r1].to(cdt)
        head[r0:r1] = torch.linalg.vecdot(h_rows, h_rows)
    return KernelTerms(head=head.reshape(batch_shape), gram=gram.reshape(batch_shape))
