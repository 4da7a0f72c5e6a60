"""Part ``shard``: pdmask's logits pass on vocabulary-parallel shards, TP 2 on one device.

Each rank (``tp_ranks``: two processes, one device, gloo) builds the same bf16 logits ``[N, V]``
(``loss_paths.make_inputs``, seeded: 4,096 x 151,936, K = 20, the sampled id in the support),
takes Megatron's split of the vocabulary (rank ``r`` holds the ``V / 2`` columns from ``r V / 2``)
and runs ``trust_region.vocab_parallel`` on its shard with the engine the pass picks there: the
fused Triton kernels on a GPU, each on its shard; on CPU at the tiny size, the chunks. Ids on
the other rank's shard are every row's lot: the support is K random ids and the sampled one.

**Accuracy**, every output and its gradient (the sampled and support log-probs, the tail's three
sums, the entropy; an upstream gradient on each differentiable one, the same on both ranks: a
replicated loss, as Megatron's is):

- against the full-vocabulary pass on the same device (the same engine on whole rows): every
  output, and each rank's columns of the gradient;
- against the pass in float64 on the first ``reference_rows`` rows of the same bf16 logits: the
  shard pass's errors and the full pass's, each within ``bounds`` (what float32 arithmetic and
  one bf16 rounding of the gradient allow, as ``tests/trust_region`` holds the passes to).

**Time**, forward + backward with the gradient on ``log pi(y)`` alone and the top-K statistics
(pdm-agg's pass), median of the repeats: the full pass on rank 0 alone (rank 1 waits), the TP-2
pass with both ranks at once, and the pass's two all-reduces alone. Both ranks share one GPU
and gloo stages the all-reduces through host memory, so the TP-2 time is what this machine
shows, an upper bound of neither two GPUs' kernels nor NCCL's collectives.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from .measure import Timed, gb, say, timed_call

OUTPUTS = ("logp_sampled", "logp_support", "tail_mass", "tail_sum_sq", "tail_sum_cube", "entropy")
DIFFERENTIABLE = ("logp_sampled", "logp_support", "tail_mass", "entropy")
EVERY_OUTPUT = {"second_order": True, "entropy": True, "support_grad": True}
TIMED = {"second_order": True}  # pdm-agg's statistics; the gradient on log pi(y) alone


@dataclass(frozen=True)
class Size:
    tokens: int
    vocab: int
    topk: int
    reference_rows: int  # rows checked against float64


FULL = Size(tokens=4096, vocab=151_936, topk=20, reference_rows=256)
TINY = Size(tokens=24, vocab=1024, topk=4, reference_rows=24)


def bounds(z_max: float, lse_max: float) -> dict[str, float]:
    """The largest error float32 arithmetic allows against float64 on the same bf16 logits:
    ``log pi = z - lse`` and the entropy ``lse - E[z]`` a few float32 roundings of ``|lse|``; each
    ``pi = exp(z - lse)`` a few of ``|z| + |lse|``, relative (``pi``), so the tail's sums of
    ``pi**k``, summed directly, ``k`` times that plus their summation's roundings; the gradient,
    float32 terms rounded once to bf16, relative to its row's largest entry. (At V = 151,936 on a
    CPU's compiled kernels the sum of ``pi**2`` is off by 1.2e-5 relative, for the full pass as for the shards: a
    constant bound of 64 float32 roundings, right at a vocabulary of a thousand, is not.)"""
    eps32, eps16 = torch.finfo(torch.float32).eps, torch.finfo(torch.bfloat16).eps
    log_prob = 16 * eps32 * (1 + lse_max)
    pi = 4 * eps32 * (1 + z_max + lse_max)
    summed = 64 * eps32
    return {
        "logp_sampled": log_prob,
        "logp_support": log_prob,
        "entropy": log_prob,
        "tail_mass": pi + summed,
        "tail_sum_sq": 2 * pi + summed,
        "tail_sum_cube": 3 * pi + summed,
        "grad_row_relative": eps16 + 2 * pi,
    }


def _inputs(size: Size, device: torch.device):
    from .loss_paths import Size as LossSize
    from .loss_paths import make_inputs

    x = make_inputs(LossSize(size.tokens, size.vocab, size.topk, chunk_rows=()), device)
    support = torch.cat([x["topk_ids"], x["sampled"][:, None]], 1)
    return x["logits"].detach(), x["sampled"], support


def _upstream(n: int, m: int, device: torch.device) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)  # the same on every rank: the loss is replicated
    shapes = {"logp_sampled": (n,), "logp_support": (n, m), "tail_mass": (n,), "entropy": (n,)}
    return {name: torch.randn(shape, generator=g).to(device) for name, shape in shapes.items()}


def _backward(out, upstream: dict, names, rows=slice(None)) -> torch.Tensor:
    loss = sum(
        (getattr(out, name) * upstream[name][rows].to(getattr(out, name).dtype)).sum()
        for name in names
    )
    loss.backward()
    return loss.detach()


def _output_errors(got, want, rows=slice(None)) -> dict[str, float]:
    """Each output's largest error: absolute for log-probs and the entropy, relative for the
    tail's sums."""
    errors = {}
    for name in OUTPUTS:
        a = getattr(got, name)[rows].detach().double()
        b = getattr(want, name).detach().double()
        diff = (a - b).abs()
        if name.startswith("tail"):
            diff = diff / b.abs().clamp_min(1e-30)
        errors[name] = float(diff.max())
    return errors


def _grad_errors(grad: torch.Tensor, exact: torch.Tensor, row_max: torch.Tensor) -> dict:
    """A gradient against a more exact one: in bf16 spacings at each entry, and relative to its
    row's largest entry over the whole vocabulary (``row_max``, ``[N, 1]``)."""
    exact = exact.double()
    tiny = torch.finfo(torch.bfloat16).tiny
    spacing = torch.finfo(torch.bfloat16).eps * torch.exp2(
        torch.floor(torch.log2(exact.abs().clamp_min(tiny)))
    )
    diff = (grad.double() - exact).abs()
    return {
        "grad_bf16_spacings": float((diff / spacing).max()),
        "grad_row_relative": float((diff / row_max.double().clamp_min(1e-300)).max()),
    }


def _within(errors: dict, limits: dict, factor: float = 1.0) -> bool:
    return all(errors[k] <= factor * limit for k, limit in limits.items() if k in errors)


def run_rank(rank: int, device: torch.device, tiny: bool, repeats: int) -> dict:
    """This rank's errors against the full pass and float64, and its times."""
    from pdmask.trust_region.logits_pass import chunked_logits_pass, fused_kernels
    from pdmask.trust_region.vocab_parallel import VocabShard, vocab_parallel_logits_pass

    size = TINY if tiny else FULL
    logits, sampled, support = _inputs(size, device)
    n, m = support.shape
    width = size.vocab // dist.get_world_size()
    shard = VocabShard.of(width)
    cols = slice(shard.start, shard.start + width)
    upstream = _upstream(n, m, device)
    full_leaf = logits.clone().requires_grad_(True)
    shard_leaf = logits[:, cols].contiguous().requires_grad_(True)
    kernels = fused_kernels(shard_leaf, None)

    def shard_pass(flags):
        return vocab_parallel_logits_pass(shard_leaf, sampled, support, shard, **flags)

    def full_pass(flags):
        return chunked_logits_pass(full_leaf, sampled, support, **flags)

    got = shard_pass(EVERY_OUTPUT)
    loss = _backward(got, upstream, DIFFERENTIABLE)
    full = full_pass(EVERY_OUTPUT)
    _backward(full, upstream, DIFFERENTIABLE)
    full_grad = full_leaf.grad
    vs_full = _output_errors(got, full) | _grad_errors(
        shard_leaf.grad, full_grad[:, cols], full_grad.abs().amax(-1, keepdim=True)
    )

    rows = slice(0, size.reference_rows)
    z64 = logits[rows].double().requires_grad_(True)
    exact = chunked_logits_pass(z64, sampled[rows], support[rows], **EVERY_OUTPUT)
    _backward(exact, upstream, DIFFERENTIABLE, rows)
    row_max = z64.grad.abs().amax(-1, keepdim=True)
    vs64 = {
        "shard": _output_errors(got, exact, rows)
        | _grad_errors(shard_leaf.grad[rows], z64.grad[:, cols], row_max),
        "full": _output_errors(full, exact, rows)
        | _grad_errors(full_grad[rows], z64.grad, row_max),
    }
    limits = bounds(float(logits.abs().max()), float(torch.logsumexp(z64.detach(), -1).abs().max()))
    del z64, exact, got, full
    return {
        "engine": "chunked" if kernels is None else kernels.NAME,
        "columns": [shard.start, width],
        "loss": float(loss),
        "vs_full_pass": vs_full,
        "vs_float64": vs64,
        "bounds": limits,
        "matches": _within(vs64["shard"], limits)
        and _within(vs64["full"], limits)
        and _within(vs_full, limits, factor=2.0),  # each pass within its bound of float64
        "times": _times(rank, device, repeats, full_leaf, shard_leaf, full_pass, shard_pass, n, m),
    }


def _times(rank, device, repeats, full_leaf, shard_leaf, full_pass, shard_pass, n, m) -> dict:
    """Medians of forward + backward (``TIMED``): the full pass on rank 0 alone, the TP-2 pass
    on both ranks at once, and the pass's two all-reduces alone."""
    upstream = {"logp_sampled": torch.ones(n, device=device)}

    def reset():
        full_leaf.grad = shard_leaf.grad = None

    def full():
        _backward(full_pass(TIMED), upstream, ("logp_sampled",))

    def tp2():
        _backward(shard_pass(TIMED), upstream, ("logp_sampled",))

    peak = torch.zeros(n, device=device)
    packed = torch.zeros(n, 5 + m + 1, device=device)  # the pass's packed sums (vocab_parallel)

    def collectives():
        dist.all_reduce(peak, dist.ReduceOp.MAX)
        dist.all_reduce(packed)

    timed = {"full": Timed(), "tp2": Timed(), "allreduce": Timed()}
    for rep in range(repeats + 1):  # the first: Triton's kernels compiled, caches warm
        into = {k: Timed() for k in timed} if rep == 0 else timed
        if rank == 0:
            timed_call(full, device, into["full"], reset)
        dist.barrier()
        timed_call(tp2, device, into["tp2"], reset)
        dist.barrier()
        timed_call(collectives, device, into["allreduce"])
        dist.barrier()
    reset()
    out = {}
    for name, t in timed.items():
        if t.seconds:
            out[f"{name}_ms"] = round(t.median_s * 1e3, 3)
            out[f"{name}_extra_peak_gb"] = gb(t.peak_bytes)
    return out


def combine(ranks: list[dict]) -> dict:
    """The part's record: the worst error over the ranks, rank 0's full pass, the slower rank's
    TP-2 pass; ``replicated``: the loss built from the outputs is the same bits on both ranks."""

    def worst(pick) -> dict:
        keys = pick(ranks[0])
        return {k: max(pick(r)[k] for r in ranks) for k in keys}

    times = {
        "full_ms": ranks[0]["times"]["full_ms"],
        "full_extra_peak_gb": ranks[0]["times"]["full_extra_peak_gb"],
        "tp2_ms": max(r["times"]["tp2_ms"] for r in ranks),
        "tp2_extra_peak_gb": max(r["times"]["tp2_extra_peak_gb"] or 0 for r in ranks) or None,
        "allreduce_ms": max(r["times"]["allreduce_ms"] for r in ranks),
    }
    times["tp2/full"] = round(times["tp2_ms"] / times["full_ms"], 3)
    record = {
        "engine": ranks[0]["engine"],
        "columns": [r["columns"] for r in ranks],
        "replicated": len({r["loss"] for r in ranks}) == 1,
        "matches": all(r["matches"] for r in ranks),
        "vs_full_pass": worst(lambda r: r["vs_full_pass"]),
        "vs_float64": {p: worst(lambda r, p=p: r["vs_float64"][p]) for p in ("shard", "full")},
        "bounds": worst(lambda r: r["bounds"]),
        **times,
    }
    _print(record)
    return record


def _print(r: dict) -> None:
    say(f"\nshard: the vocabulary-parallel pass at TP 2 on one device ({r['engine']} engine)")
    say(f"{'against':>22} | " + " | ".join(f"{k:>13}" for k in r["bounds"]))
    for label, errors in (
        ("full pass, same device", r["vs_full_pass"]),
        ("float64 (shards)", r["vs_float64"]["shard"]),
        ("float64 (full pass)", r["vs_float64"]["full"]),
        ("bound vs float64", r["bounds"]),
    ):
        say(f"{label:>22} | " + " | ".join(f"{errors[k]:13.3e}" for k in r["bounds"]))
    say(
        f"    matches: {r['matches']}, replicated: {r['replicated']}; full pass {r['full_ms']} "
        f"ms (rank 0 alone), TP 2 {r['tp2_ms']} ms (both ranks on this device), its two "
        f"all-reduces {r['allreduce_ms']} ms (gloo); TP 2 / full {r['tp2/full']}"
    )
