"""What each rank of ``test_vocab_parallel.py``'s process group computes (not a test module).

One spawn of four processes on gloo over loopback holds both tensor-parallel sizes: two TP-2
groups (ranks 0-1 and 2-3) and one TP-4 group (all four). Every rank builds the same full logits
from a seed, takes its shard of the vocabulary (Megatron's split: rank ``r`` holds the columns
from ``r * V / TP``; the vocabulary padded to a multiple of TP with columns at ``-inf``), runs the
vocabulary-parallel pass and compares its outputs and its columns of the gradient against the
full vocabulary in float64. Results go to ``<folder>/rank<r>.json``; the test asserts on them.

Triton's interpreter is chosen when triton is first imported, so ``run`` sets
``TRITON_INTERPRET=1`` before anything imports it: the Triton kernels run here on CPU tensors.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

RANKS = 4
N, M = 7, 5  # rows, support slots (the pass's cases)
CHUNK = 2  # rows per chunk of the chunked pass: several chunks per call


def _full_logits(seed: int, n: int, real: int, total: int, dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    full = torch.randn(n, total, generator=g, dtype=torch.float64) * 3
    full[:, real:] = float("-inf")  # the padded vocabulary (pdmask's convention for padding)
    return full.to(dtype)


def _ids(seed: int, n: int, m: int, real: int, width: int):
    """Sampled and support ids on every shard: the sampled id in the support (as build_support
    puts it), a duplicate slot, a row whose support is all on rank 0's shard (the others own none
    of it) and a row of the last real ids."""
    g = torch.Generator().manual_seed(seed + 1)
    sampled = torch.randint(0, real, (n,), generator=g)
    support = torch.randint(0, real, (n, m), generator=g)
    support[:, -1] = sampled
    support[0, 1] = support[0, 0]
    support[1] = torch.randint(0, width, (m,), generator=g)
    sampled[1] = support[1, -1]
    support[-1] = torch.arange(real - m, real)
    sampled[-1] = real - 1
    return sampled, support


def pass_case(engine, group, tp, seed, width, padded, dtype, *, second_order=False,
              entropy=False, support_grad=False):  # fmt: skip
    """One case of the pass through ``engine`` (None: the chunked pass), as ``fused_cases.case``
    reports it: the largest errors of this rank's outputs and gradient columns against float64."""
    from fused_cases import reference

    from pdmask.trust_region.vocab_parallel import VocabShard, _VocabParallelPass

    total = width * tp
    real = total - padded
    shard = VocabShard.of(width, group)
    full = _full_logits(seed, N, real, total, dtype)
    sampled, support = _ids(seed, N, M, real, width)
    x = full[:, shard.start : shard.start + width].clone().requires_grad_(True)
    flags = (second_order, entropy, support_grad, engine)
    out = _VocabParallelPass.apply(x, sampled, support, shard, CHUNK, *flags)
    names = ("logp_sampled", "logp_support", "tail_mass", "tail_sum_sq", "tail_sum_cube", "entropy")
    got = {k: v for k, v in zip(names, out, strict=True) if v is not None}
    g = torch.Generator().manual_seed(
        seed + 2
    )  # the same upstream on every rank: a replicated loss
    upstream = {"logp_sampled": torch.randn(N, generator=g, dtype=torch.float64)}
    if support_grad:
        upstream["logp_support"] = torch.randn(N, M, generator=g, dtype=torch.float64)
        upstream["tail_mass"] = torch.randn(N, generator=g, dtype=torch.float64)
    if entropy:
        upstream["entropy"] = torch.randn(N, generator=g, dtype=torch.float64)
    loss = sum((got[k] * u.to(got[k].dtype)).sum() for k, u in upstream.items())
    loss.backward()

    z64 = full[:, :real].double().requires_grad_(True)
    ref = reference(z64, sampled, support)
    sum((ref[k] * u).sum() for k, u in upstream.items()).backward()
    exact = torch.zeros(N, total, dtype=torch.float64)
    exact[:, :real] = z64.grad
    exact = exact[:, shard.start : shard.start + width]
    errors = {}
    for name, value in got.items():
        want = ref[name].detach()
        err = (value.detach().double() - want).abs()
        scale = want.abs().clamp_min(1e-30) if name.startswith("tail") else 1.0
        errors[name] = float((err / scale).max())
    mine = slice(0, max(0, min(width, real - shard.start)))  # this shard's real columns
    grad, exact_real = x.grad[:, mine].double(), exact[:, mine]
    padding = x.grad[:, mine.stop :].double().abs()
    errors["padding_grad"] = float(padding.max()) if padding.numel() else 0.0
    info = torch.finfo(dtype)
    spacing = info.eps * torch.exp2(torch.floor(torch.log2(exact_real.abs().clamp_min(info.tiny))))
    diff = (grad - exact_real).abs()
    errors["grad_spacings"] = float((diff / spacing).max()) if diff.numel() else 0.0
    # relative to the row's largest entry over the whole vocabulary (every rank's columns)
    row_scale = z64.grad.abs().amax(-1, keepdim=True).clamp_min(1e-300)
    errors["grad_row_relative"] = float((diff / row_scale).max()) if diff.numel() else 0.0
    return {
        "engine": getattr(engine, "NAME", "chunked"), "tp": tp, "n": N, "vocab": real, "m": M,
        "dtype": str(dtype), "second_order": second_order, "entropy": entropy,
        "support_grad": support_grad, "padded": padded, "outputs": sorted(got),
        "errors": errors, "eps": info.eps, "z_max": float(z64.detach().abs().max()),
        "lse_max": float(torch.logsumexp(z64.detach(), -1).abs().max()),
        "loss": float(loss.detach()),
    }  # fmt: skip


def _support_kl_method():
    """A method whose loss needs ``support_log_probs`` (no shipped recipe does yet): the exact
    top-K KL over S plus the tail bucket as a differentiable penalty, as in
    ``tests/verl/test_loss_path.py``."""
    from pdmask.trust_region import Method, ratio_loss

    def loss(batch):
        sup = batch.support
        mu_s = sup.mu_log_prob.exp()
        kl = torch.where(sup.valid, mu_s * (sup.mu_log_prob - sup.log_prob), 0.0).sum(-1)
        tail = sup.mu_tail_mass * (sup.mu_tail_mass.log() - sup.tail_mass.log())
        return ratio_loss(batch, None) + 0.5 * (kl + tail)

    return Method("support-kl", loss=loss, needs=frozenset({"support_log_probs"}))


def recipe_case(name, group, tp, seed, width, padded):
    """A recipe's loss, mask, statistics and gradient on the shards against the full
    vocabulary's, all in float64 (the full pass is itself held to brute-force float64 references
    in ``test_stats.py``, ``test_gradient_inputs.py`` and ``tests/recipes``)."""
    from pdmask.trust_region import aggregate_loss, apply_method, compute_token_stats
    from pdmask.trust_region.vocab_parallel import VocabShard
    from tests.methods import method

    b, t, k = 3, 6, 4
    total = width * tp
    real = total - padded
    shard = VocabShard.of(width, group)
    full = _full_logits(seed, b * t, real, total, torch.float64).reshape(b, t, total)
    g = torch.Generator().manual_seed(seed + 3)
    # mu: the policy moved a little (so some tokens leave the trust region), its top-K and y ~ mu
    mu = torch.log_softmax(full + 0.8 * torch.randn(full.shape, generator=g, dtype=full.dtype), -1)
    top_lp, top_ids = mu.topk(k, -1)
    sampled = torch.multinomial(mu.exp().reshape(-1, total), 1, generator=g).reshape(b, t)
    mu_k = mu.gather(-1, sampled[..., None]).squeeze(-1)
    adv = torch.randn(b, 1, generator=g, dtype=full.dtype).expand(b, t).contiguous()
    valid = torch.ones(b, t, dtype=torch.bool)
    valid[0, :2] = False  # a prompt's rows
    m = _support_kl_method() if name == "support-kl" else method(name, delta=0.05)

    def run(logits, shard_or_none):
        stats = compute_token_stats(
            logits, sampled, top_ids, top_lp, mu_k, inputs=m.needs, shard=shard_or_none
        )
        out = apply_method(m, stats, adv, valid, backend="math")
        loss = aggregate_loss(out.token_loss, valid)
        loss.backward()
        return stats, out.mask, loss

    x = full[..., shard.start : shard.start + width].clone().requires_grad_(True)
    stats, mask, loss = run(x, shard)
    z = full.clone().requires_grad_(True)
    ref_stats, ref_mask, ref_loss = run(z, None)
    errors = {"loss": abs(float(loss) - float(ref_loss))}
    for key, want in ref_stats.tensors().items():
        value = stats.tensors()[key]
        errors[f"stat_{key}"] = float(
            (value.detach().double() - want.detach().double()).abs().max()
        )
    grad_ref = z.grad[..., shard.start : shard.start + width]
    scale = float(z.grad.abs().max())
    errors["grad"] = float((x.grad - grad_ref).abs().max()) / scale
    return {
        "recipe": name, "tp": tp, "errors": errors, "mask_equal": bool(torch.equal(mask, ref_mask)),
        "masked": int((ref_mask & valid).sum()), "tokens": int(valid.sum()),
        "grad_scale": scale, "vocab_size": stats.vocab_size,
    }  # fmt: skip


def trap_case(group, tp, seed, width):
    """A loss replicated on every rank: its gradient through the pass, and through an all-reduce
    whose backward sums the ranks' gradients (``torch.distributed.nn``), each projected on the
    float64 reference's: 1 is exact, TP the trap."""
    import torch.distributed.nn.functional as dist_nn

    from pdmask.trust_region.vocab_parallel import VocabShard, vocab_parallel_logits_pass

    total = width * tp
    shard = VocabShard.of(width, group)
    full = _full_logits(seed, N, total, total, torch.float64)
    sampled, support = _ids(seed, N, M, total, width)
    weights = torch.randn(N, generator=torch.Generator().manual_seed(seed + 4), dtype=torch.float64)
    z = full.clone().requires_grad_(True)
    (torch.log_softmax(z, -1).gather(1, sampled[:, None]).squeeze(1) * weights).sum().backward()
    want = z.grad[:, shard.start : shard.start + width]

    x = full[:, shard.start : shard.start + width].clone().requires_grad_(True)
    out = vocab_parallel_logits_pass(x, sampled, support, shard)
    (out.logp_sampled * weights).sum().backward()

    naive = full[:, shard.start : shard.start + width].clone().requires_grad_(True)
    peak = naive.detach().amax(-1)
    dist.all_reduce(peak, dist.ReduceOp.MAX, group=group)
    lse = peak + dist_nn.all_reduce(torch.exp(naive - peak[:, None]).sum(-1), group=group).log()
    local = sampled - shard.start
    owned = (local >= 0) & (local < width)
    z_y = torch.where(owned, naive.gather(1, local.clamp(0, width - 1)[:, None]).squeeze(1), 0.0)
    ((dist_nn.all_reduce(z_y, group=group) - lse) * weights).sum().backward()

    def projected(grad):  # over the whole group: <g, ref> / <ref, ref>
        parts = torch.stack([(grad * want).sum(), (want * want).sum()])
        dist.all_reduce(parts, group=group)
        return float(parts[0] / parts[1])

    return {"tp": tp, "pass": projected(x.grad), "all_reduce_nn": projected(naive.grad)}


def _cases(group, tp: int, compiled: bool) -> dict:
    """Every case on ``group``; ``compiled``: the compiled CPU kernels' case too (the kernels
    are the same at any width: ``fused_kernels`` picks them from ``MIN_VOCAB`` columns)."""
    from pdmask.trust_region import compiled_pass, triton_pass

    f64, f32, bf16 = torch.float64, torch.float32, torch.bfloat16
    out = {"pass": [], "recipes": [], "trap": trap_case(group, tp, 11, 40)}
    # the chunked pass: float64 (exact), float32 and bf16 (its float32 arithmetic), every output
    for i, dtype in enumerate((f64, f32, bf16)):
        out["pass"].append(pass_case(None, group, tp, 20 + i, 50, 3, dtype, second_order=True))
        flags = dict(entropy=True, support_grad=True, second_order=True)
        out["pass"].append(pass_case(None, group, tp, 30 + i, 50, 3, dtype, **flags))
    # the Triton kernels (in the interpreter) on shards with padding, and the compiled CPU
    # kernels on shards of compiled_pass.MIN_VOCAB columns
    out["pass"].append(pass_case(triton_pass, group, tp, 40, 2100, 9, bf16, second_order=True))
    flags = dict(entropy=True, support_grad=True, second_order=True)
    out["pass"].append(pass_case(triton_pass, group, tp, 41, 1500, 9, f32, **flags))
    if compiled:  # compiling costs each process seconds to tens of seconds: one group compiles
        out["pass"].append(pass_case(compiled_pass, group, tp, 42, 700, 0, f32, **flags))
    for name in ("pdm-agg", "pdm-uni", "dppo-topk-kl", "ent-bonus", "support-kl"):
        out["recipes"].append(recipe_case(name, group, tp, 50, 24, 5))
    return out


def run(rank: int, folder: str) -> None:
    """One rank: every case at TP 2 and TP 4, results to ``<folder>/rank<rank>.json``."""
    import warnings

    # torch.distributed.nn's all-reduce (the trap's control) is deprecated, not gone
    warnings.filterwarnings("ignore", category=FutureWarning)
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (module docstring)
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # gloo's transport on loopback only
    torch.set_num_threads(1)
    here = Path(__file__).resolve().parent
    import sys

    sys.path.insert(0, str(here))  # fused_cases, as the Triton test's script imports it
    store = dist.FileStore(str(Path(folder) / "store"), RANKS)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=RANKS)
    try:
        pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank creates every group
        results = {"tp2": _cases(pairs[rank // 2], 2, rank < 2), "tp4": _cases(None, 4, False)}
    finally:
        dist.destroy_process_group()
    (Path(folder) / f"rank{rank}.json").write_text(json.dumps(results))
