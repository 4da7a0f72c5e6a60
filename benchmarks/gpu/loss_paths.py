"""Part (a): the loss path, forward + backward from bf16 logits ``[N, V]`` to their gradient.

Paths, all on the same inputs, interleaved:

- ``torch-ce``: torch's fused cross-entropy (``F.cross_entropy``, reduction none): ``-log pi(y)``
  alone, the cheapest thing any policy loss must compute;
- ``verl-fused``: what verl 0.9.1's actor runs on GPU nodes with flash-attn: its own
  ``logprobs_from_logits`` taking the flash-attn Triton cross-entropy branch (served here by
  ``fused_logprob``, the same kernel written for the check) and its clipped PPO loss
  (``compute_policy_loss_vanilla``);
- ``verl-fallback``: what verl runs without flash-attn (``logprobs_from_logits_v2``: a Python
  loop of log-softmaxes over the rows) and the same PPO loss;
- ``pdm-agg``, ``pdm-uni``, ``dppo-topk-kl``: ``pdmask.trust_region.policy_loss`` with each
  recipe's method (top-20 statistics, mask, loss, diagnostics), as it runs by default: on a GPU
  the fused Triton pass (``trust_region.triton_pass``), on CPU the kernels inductor compiles
  from 32,768 columns on (``trust_region.compiled_pass``), the chunked pass below that;
- ``pdm-agg-chunked``: pdm-agg through the chunked torch pass at the device's default chunk (what
  a GPU ran before the fused pass, and runs when a chunk size is given).

Then pdm-agg's chunked pass over a sweep of chunk sizes (rows per chunk), which is what the
device's default chunk size (``trust_region.logits_pass.CHUNK_ELEMENTS``) follows from.

The floor: every path must read the logits in the forward, read them again and write their
gradient in the backward: ``3 x N x V x 2`` bytes, at the copy bandwidth measured in this run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .measure import Timed, copy_bandwidth_gbps, gb, interleaved, say
from .recipes import DELTA, recipe_with_params

PDM_METHODS = ("pdm-agg", "pdm-uni", "dppo-topk-kl", "ent-bonus")  # ent-bonus: needs entropy


@dataclass(frozen=True)
class Size:
    tokens: int
    vocab: int
    topk: int
    chunk_rows: tuple[int, ...]  # the chunk sweep


FULL = Size(tokens=16_384, vocab=151_936, topk=20, chunk_rows=(3, 64, 128, 256, 512, 1024, 2048))
TINY = Size(tokens=48, vocab=1024, topk=4, chunk_rows=(1, 8, 64))


def make_inputs(size: Size, device: torch.device, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator(device=device).manual_seed(seed)
    n, v, k = size.tokens, size.vocab, size.topk
    logits = torch.empty(n, v, dtype=torch.bfloat16, device=device)
    for start in range(0, n, 1024):  # no float32 [N, V] temporary
        rows = min(1024, n - start)
        logits[start : start + rows] = torch.randn(rows, v, generator=g, device=device) * 2
    mu = torch.log_softmax(torch.randn(n, 64, generator=g, device=device), -1)
    return {
        "logits": logits.requires_grad_(True),
        "sampled": torch.randint(0, v, (n,), generator=g, device=device),
        "topk_ids": torch.randint(0, v, (n, k), generator=g, device=device),
        "topk_logp": mu[:, :k].contiguous(),
        "mu_logp": mu[:, k].contiguous(),
        "adv": torch.randn(n, generator=g, device=device),
        "mask": torch.ones(n, dtype=torch.bool, device=device),
    }


def _methods():
    methods = {}
    for name in PDM_METHODS:
        recipe, params = recipe_with_params(name)
        methods[name] = recipe.method(params)
    return methods


def _verl_loss(logp_fn):
    from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla
    from verl.workers.config import ActorConfig

    cfg = ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
    )

    def loss(x):
        logp = logp_fn(x["logits"], x["sampled"])
        value, _ = compute_policy_loss_vanilla(
            x["mu_logp"][None], logp[None], x["adv"][None], x["mask"][None],
            loss_agg_mode="token-mean", config=cfg,
        )  # fmt: skip
        return value

    return loss


def _verl_flash_logprobs(logits, labels):
    """verl's own ``logprobs_from_logits``, taking its flash-attn branch (``fused_logprob``)."""
    from verl.utils.torch_functional import logprobs_from_logits

    from .fused_logprob import as_verls_flash_attn

    with as_verls_flash_attn():
        return logprobs_from_logits(logits, labels)


def loss_functions(fused_available: bool, device: torch.device, vocab: int) -> dict:
    """Each path as ``loss(inputs, chunk_size=None) -> scalar``."""
    from verl.utils.torch_functional import logprobs_from_logits_v2

    from pdmask.trust_region import policy_loss
    from pdmask.trust_region.logits_pass import rows_per_chunk

    paths = {
        "torch-ce": lambda x: -F.cross_entropy(x["logits"], x["sampled"], reduction="none").mean()
    }
    if fused_available:
        paths["verl-fused"] = _verl_loss(_verl_flash_logprobs)
    paths["verl-fallback"] = _verl_loss(logprobs_from_logits_v2)
    for name, method in _methods().items():

        def pdm(x, method=method, chunk_size=None):
            return policy_loss(
                method, x["logits"], x["sampled"], x["topk_ids"], x["topk_logp"], x["mu_logp"],
                x["adv"], x["mask"], delta=DELTA, chunk_size=chunk_size,
            ).loss  # fmt: skip

        paths[name] = pdm
    default_rows = rows_per_chunk(vocab, None, device)
    paths["pdm-agg-chunked"] = lambda x: paths["pdm-agg"](x, chunk_size=default_rows)
    return paths


def fused_kernel_status(device: torch.device) -> str | None:
    """None when the fused kernel runs here (tried on a few rows), else why not: the check then
    runs everything else without it. On CPU it runs in Triton's interpreter, which
    ``TRITON_INTERPRET=1`` selects before triton is first imported (the check sets it first)."""
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        return "on CPU the Triton kernel needs TRITON_INTERPRET=1 before triton is imported"
    try:
        from .fused_logprob import fused_logprob

        logits = torch.zeros(2, 8, device=device, dtype=torch.bfloat16, requires_grad=True)
        fused_logprob(logits, torch.zeros(2, dtype=torch.long, device=device)).sum().backward()
    except Exception as err:  # noqa: BLE001 (any failure: the kernel is left out, said why)
        return f"{type(err).__name__}: {err}"
    return None


def _against_float64(x, fused_available: bool) -> dict:
    """verl's log-prob paths on the first rows, against a float64 reference of the same bf16
    logits: the largest |log pi(y)| error of each, and the fused kernel's gradient error in units
    of the bf16 spacing at each entry (it computes in float32 and rounds once: <= ~0.5)."""
    from verl.utils.torch_functional import logprobs_from_logits_v2

    rows = slice(0, min(256, x["logits"].shape[0]))
    z, y = x["logits"].detach()[rows], x["sampled"][rows]
    z64 = z.double().requires_grad_(True)
    ref = torch.log_softmax(z64, -1).gather(1, y[:, None]).squeeze(1)
    upstream = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1)).to(z.device)
    (ref * upstream.double()).sum().backward()
    out = {"verl-fallback": logprobs_from_logits_v2(z, y)}
    record: dict = {}
    if fused_available:
        z_leaf = z.clone().requires_grad_(True)
        out["verl-fused"] = _verl_flash_logprobs(z_leaf, y)
        (out["verl-fused"] * upstream).sum().backward()
        spacing = torch.finfo(torch.bfloat16).eps * torch.exp2(
            torch.floor(torch.log2(z64.grad.abs().clamp_min(2.0**-126)))
        )
        record["fused_grad_max_bf16_spacings"] = float(
            ((z_leaf.grad.double() - z64.grad).abs() / spacing).max()
        )
    record["logprob_max_abs_err"] = {
        k: float((v.detach().double() - ref.detach()).abs().max()) for k, v in out.items()
    }
    record["pdm_pass_vs_float64"] = _pdm_pass_against_float64(z, y, x["topk_ids"][rows], upstream)
    return record


def _pdm_pass_against_float64(z, y, topk_ids, upstream) -> dict:
    """pdmask's logits pass as it runs here (the fused kernels on a GPU) against the same pass in
    float64, on the same bf16 logits, twice: with a gradient on log pi(y) alone (``sampled``) and
    on every differentiable output, the entropy, the support's log-probs and the tail's mass
    included (``all``). Log-prob and entropy errors are absolute, the tail's sums relative; the
    gradient in bf16 spacings (rounded once: <= 0.5 to nearest) and relative to its row's largest
    entry (where terms cancel, an entry's last bits follow the row's larger ones)."""
    from pdmask.trust_region.logits_pass import chunked_logits_pass

    support = torch.cat([topk_ids, y[:, None]], 1)
    g = torch.Generator().manual_seed(2)
    extra = {  # upstream gradients of the other differentiable outputs
        "logp_support": torch.randn(support.shape, generator=g).to(z.device),
        "tail_mass": torch.randn(y.shape, generator=g).to(z.device),
        "entropy": torch.randn(y.shape, generator=g).to(z.device),
    }

    def run_pass(logits, every_output):
        out = chunked_logits_pass(
            logits, y, support, second_order=True, entropy=every_output, support_grad=every_output
        )
        loss = (
            out.logp_sampled
            * upstream.to(logits.dtype if logits.dtype == torch.float64 else torch.float32)
        ).sum()
        if every_output:
            for name, u in extra.items():
                loss = loss + (getattr(out, name) * u.to(out.logp_sampled.dtype)).sum()
        loss.backward()
        return out

    def rel(a, b):
        return float(
            ((a.detach().double() - b.detach()).abs() / b.detach().abs().clamp_min(1e-30)).max()
        )

    def absolute(a, b):
        return float((a.detach().double() - b.detach()).abs().max())

    tiny = torch.finfo(torch.bfloat16).tiny
    record = {}
    for label, every_output in (("sampled", False), ("all", True)):
        leaf = z.clone().requires_grad_(True)
        got = run_pass(leaf, every_output)
        z64 = z.double().requires_grad_(True)
        want = run_pass(z64, every_output)
        exact = z64.grad
        spacing = torch.finfo(torch.bfloat16).eps * torch.exp2(
            torch.floor(torch.log2(exact.abs().clamp_min(tiny)))
        )
        diff = (leaf.grad.double() - exact).abs()
        record[label] = {
            "logp_sampled_abs": absolute(got.logp_sampled, want.logp_sampled),
            "logp_support_abs": absolute(got.logp_support, want.logp_support),
            "tail_mass_rel": rel(got.tail_mass, want.tail_mass),
            "tail_sum_sq_rel": rel(got.tail_sum_sq, want.tail_sum_sq),
            "tail_sum_cube_rel": rel(got.tail_sum_cube, want.tail_sum_cube),
            "grad_bf16_spacings": float((diff / spacing).max()),
            "grad_row_relative": float((diff / exact.abs().amax(-1, keepdim=True)).max()),
        }
        if every_output:
            record[label]["entropy_abs"] = absolute(got.entropy, want.entropy)
    return record


def run(device: torch.device, size: Size, repeats: int, why_no_fused: str | None) -> dict:
    """``why_no_fused``: ``fused_kernel_status(device)``, asked once by the check."""
    from pdmask.trust_region.logits_pass import fused_kernels, rows_per_chunk

    fused = why_no_fused is None
    x = make_inputs(size, device)
    logits_bytes = x["logits"].numel() * x["logits"].element_size()
    losses = loss_functions(fused, device, size.vocab)
    kernels = fused_kernels(x["logits"], None)  # Triton's ("fused"), inductor's, or the chunks
    pdm_pass = "chunked" if kernels is None else kernels.NAME

    def backward_of(loss, **kw):
        return lambda: loss(x, **kw).backward()

    def drop_gradient():  # before each call: the last call's gradient is not this call's memory
        x["logits"].grad = None

    timed = interleaved(
        {k: backward_of(f) for k, f in losses.items()}, device, repeats, drop_gradient
    )
    default_rows = rows_per_chunk(size.vocab, None, device)
    chunk_rows = sorted(set(size.chunk_rows) | {default_rows})
    chunks = interleaved(
        {rows: backward_of(losses["pdm-agg"], chunk_size=rows) for rows in chunk_rows},
        device,
        max(1, repeats - 2),
        drop_gradient,
    )
    x["logits"].grad = None
    bandwidth = copy_bandwidth_gbps(device)
    floor_s = None if bandwidth is None else 3 * logits_bytes / (bandwidth * 1e9)

    def row(t: Timed) -> dict:
        # Above the inputs, every path must hold the logits' gradient (one more [N, V] bf16
        # buffer): what a path needs beyond that is its own cost.
        return {
            "ms": round(t.median_s * 1e3, 3),
            "extra_peak_gb": gb(None if t.peak_bytes is None else t.peak_bytes - logits_bytes),
            "x_floor": None if floor_s is None else round(t.median_s / floor_s, 2),
        }

    paths = {name: row(t) for name, t in timed.items()}
    sweep = {str(rows): row(t) for rows, t in chunks.items()}
    fastest = min(chunks, key=lambda r: chunks[r].median_s)
    ms = {name: t.median_s for name, t in timed.items()}
    ratios = {f"{a}/{b}": round(ms[a] / ms[b], 3) for a, b in _RATIOS if a in ms and b in ms}
    _print(size, repeats, paths, sweep, ratios, bandwidth, default_rows, why_no_fused)
    say(f"    pdm-agg, pdm-uni, dppo-topk-kl ran the {pdm_pass} pass")
    if "pdm-agg/verl-fused" in ratios:  # issue 44's goal for the fused statistics
        say(
            f"    pdm-agg {paths['pdm-agg']['ms']} ms / verl's fused log-prob "
            f"{paths['verl-fused']['ms']} ms = {ratios['pdm-agg/verl-fused']} (goal <= 1.0)"
        )
    return {
        "tokens": size.tokens,
        "vocab": size.vocab,
        "topk": size.topk,
        "logits_gb": gb(logits_bytes),
        "repeats": repeats,
        "copy_gbps": None if bandwidth is None else round(bandwidth, 1),
        "floor_ms": None if floor_s is None else round(floor_s * 1e3, 3),
        "paths": paths,
        "ratios": ratios,
        "chunk_sweep": sweep,
        "chunk_default_rows": default_rows,
        "chunk_fastest_rows": fastest,
        "fused_kernel": "ran" if fused else f"skipped: {why_no_fused}",
        "pdm_pass": pdm_pass,
        **_against_float64(x, fused),
    }


_RATIOS = (
    ("pdm-agg", "verl-fused"),
    ("pdm-agg", "pdm-agg-chunked"),
    ("pdm-agg", "verl-fallback"),
    ("pdm-agg", "torch-ce"),
    ("verl-fused", "torch-ce"),
    ("pdm-uni", "pdm-agg"),
    ("ent-bonus", "pdm-agg"),
    ("dppo-topk-kl", "pdm-agg"),
)


def _print(size, repeats, paths, sweep, ratios, bandwidth, default_rows, why_no_fused) -> None:
    bw = "not measured (cpu)" if bandwidth is None else f"{bandwidth:.0f} GB/s"
    say(
        f"\n(a) loss path fwd+bwd, N={size.tokens} x V={size.vocab} bf16, K={size.topk}, "
        f"median of {repeats}; copy bandwidth {bw}"
    )
    if why_no_fused:
        say(f"    verl-fused skipped: {why_no_fused}")
    say(f"{'path':>14} | {'ms':>9} | {'extra GB':>8} | {'x floor':>7}")
    for name, r in {**paths, **{f"agg rows={k}": v for k, v in sweep.items()}}.items():
        extra = "-" if r["extra_peak_gb"] is None else f"{r['extra_peak_gb']:.3f}"
        floor = "-" if r["x_floor"] is None else f"{r['x_floor']:.1f}"
        say(f"{name:>14} | {r['ms']:9.2f} | {extra:>8} | {floor:>7}")
    say(f"    default chunk: {default_rows} rows; ratios: {ratios}")
