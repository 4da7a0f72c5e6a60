"""Loss-path benchmark: the full pdm-agg path against a verl-style baseline on the same logits.

    python benchmarks/bench_loss.py [--tokens 4096] [--vocab 151936] [--repeats 3] [--inputs peaked]

Paths (forward + backward from bf16 logits ``[N, V]`` to the gradient of the logits):
  a) verl baseline: verl 0.9.1's own ``logprobs_from_logits`` (on CPU its log-softmax path) and
     ``compute_policy_loss_vanilla`` (clipped PPO), as a verl actor computes them;
  b) pdm-agg: ``pdmask.trust_region.policy_loss`` (top-20 stats, mask, loss, diagnostics);
  c) fused log-prob + clip: pdmask's log-prob pass without top-K (what b) costs without the
     trust-region statistics), to separate the statistics' cost from the log-prob kernel's;
  d) ent-bonus: pdm-agg plus an exact entropy bonus on the tokens it masks (the recipe needs
     ``entropy``: the same logits pass computes H(pi) and its gradient), for the cost of a
     differentiable entropy; the share of masked tokens is printed, because in the chunked pass
     (small vocabularies, or no C++ compiler) only those rows pay the entropy's backward (these
     random logits put every token out of region and mask about half, far more than training
     does);
  d') ent-every-token: the same bonus on every token (verl's ``entropy_coeff`` form), the cost's
     upper bound;
  e) support-kl: pdm-agg's mask with an exact top-K KL built from the differentiable support
     log-probs and tail mass (``needs: support_log_probs``), for the cost of that input;
  f) pdm-gram: pdm-agg's statistics plus the output-kernel terms (``needs: output_kernel``,
     ``pdmask.trust_region.kernel``) from the lm head's input ``[N, d]`` and weight ``[V, d]``
     (bf16, d = --hidden, Qwen3-4B's 2560), then the pdm-gram mask: what the kernel-aware
     direction test costs (its ``W^T pi`` is one ``[N, V] x [V, d]`` product, the size of the lm
     head's own forward). Its hidden states and weight are inputs, like the logits: not counted;
  g) pdm-agg-chunked, ent-bonus-chunked: b) and d) on the logits pass's chunks of torch ops (a
     chunk size of one row), what runs without a C++ compiler (from 32,768 columns on, CPU paths
     otherwise run the kernels inductor compiles, ``trust_region.compiled_pass``; their
     compilation happens in the warm-up, outside the measurement).

Forward only, as the VeRL backend's logits hook runs it (no gradient: the policy gradient flows
through verl's own log-probs), for what logging ``actor/entropy`` costs:
  h) hook-stats: the per-token statistics of pdm-agg (``compute_token_stats``, no entropy);
  h') hook-stats-entropy: the same plus the policy's entropy, the value the hook now always adds;
  i) hook-entropy: the entropy alone, what the hook computes for verl's own losses (vanilla);
  i') verl-entropy: verl 0.9.1's ``entropy_from_logits`` on the same logits, without gradient
     (what its ``calculate_entropy`` computes in its old-log-prob pass; in an update it keeps
     the graph of a ``[N, V]`` float32 softmax for the backward).

Each path runs in its own subprocess so that its peak resident memory (``ru_maxrss``) is its own.
"Extra memory" is the peak above the logits and their gradient (which every path must hold), as a
share of the logits' size. Paths alternate across repeats and the median time is reported, so
ratios are measured side by side under the same machine load.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def make_path(path: str):
    """Import everything a path needs up front, so timing and memory see only the computation."""
    forward_only = _forward_only_path(path)
    if forward_only is not None:
        return forward_only
    if path == "verl":
        from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla
        from verl.utils.torch_functional import logprobs_from_logits
        from verl.workers.config import ActorConfig

        cfg = ActorConfig(
            strategy="fsdp",
            rollout_n=1,
            ppo_micro_batch_size_per_gpu=1,
            clip_ratio_low=0.2,
            clip_ratio_high=0.28,
        )

        def run(logits, sampled, topk_ids, topk_logp, mu_logp, adv, mask):
            logp = logprobs_from_logits(logits, sampled)
            loss, _ = compute_policy_loss_vanilla(
                mu_logp[None],
                logp[None],
                adv[None],
                mask[None],
                loss_agg_mode="token-mean",
                config=cfg,
            )
            return loss

        return run
    from pdmask.registry import load_registry
    from pdmask.trust_region import policy_loss

    recipes = load_registry().recipes

    def method(name: str, **params):
        return recipes[name].method(recipes[name].resolve_params(params)[0])

    def policy_loss_path(chosen, chunk_size=None):
        def run(logits, sampled, topk_ids, topk_logp, mu_logp, adv, mask):
            out = policy_loss(
                chosen, logits, sampled, topk_ids, topk_logp, mu_logp, adv, mask, delta=0.15,
                chunk_size=chunk_size,
            )  # fmt: skip
            run.masked_frac = out.metrics.get("masked_frac")
            return out.loss

        return run

    if path in ("pdm-agg", "ent-bonus"):
        return policy_loss_path(method(path, delta=0.15))
    if path in ("pdm-agg-chunked", "ent-bonus-chunked"):  # the chunked pass, one row per chunk
        return policy_loss_path(method(path.removesuffix("-chunked"), delta=0.15), chunk_size=1)
    if path == "ent-every-token":
        from dataclasses import replace

        from pdmask.trust_region import ratio_loss

        def every_token(batch):  # the mask zeroes the ratio term; the bonus acts everywhere
            return ratio_loss(batch, None).where(~batch.mask, 0.0) - 0.01 * batch.entropy

        agg = method("pdm-agg", delta=0.15)
        needs = agg.needs | frozenset({"entropy"})
        return policy_loss_path(replace(agg, loss=every_token, loss_sees_mask=True, needs=needs))
    if path == "support-kl":
        from dataclasses import replace

        def support_kl(batch):  # a KL penalty over S + tail on every token, differentiable
            sup = batch.support
            kl = (sup.mu_log_prob.exp() * (sup.mu_log_prob - sup.log_prob)).where(sup.valid, 0.0)
            tail = sup.mu_tail_mass * (sup.mu_tail_mass.log() - sup.tail_mass.log())
            return -batch.ratio * batch.advantages + 0.1 * (kl.sum(-1) + tail)

        agg = method("pdm-agg", delta=0.15)
        return policy_loss_path(
            replace(agg, loss=support_kl, needs=frozenset({"support_log_probs"}))
        )
    if path == "pdm-gram":
        from dataclasses import replace

        from pdmask.trust_region import (
            aggregate_loss,
            apply_method,
            compute_token_stats,
            kernel_terms,
        )

        gram = method("pdm-gram", delta=0.15)

        def run(logits, sampled, topk_ids, topk_logp, mu_logp, adv, mask, hidden, weight):
            # As the embedded trainer composes it (backends/sim/grpo.py token_stats).
            stats = compute_token_stats(
                logits, sampled, topk_ids, topk_logp, mu_logp, inputs=gram.needs
            )
            kernel = kernel_terms(logits, hidden, weight, sampled, topk_ids, topk_logp, mu_logp)
            out = apply_method(gram, replace(stats, kernel=kernel), adv, mask, backend="math")
            run.masked_frac = float(out.mask.float().mean())
            return aggregate_loss(out.token_loss, mask)

        return run
    if path == "fused-logprob":
        grpo = method("grpo-clip-higher")

        def run(logits, sampled, topk_ids, topk_logp, mu_logp, adv, mask):
            return policy_loss(grpo, logits, sampled, None, None, mu_logp, adv, mask).loss

        return run
    raise ValueError(path)


FORWARD_ONLY = ("hook-stats", "hook-stats-entropy", "hook-entropy", "verl-entropy")


def _forward_only_path(path: str):
    """The forward-only paths (h, i above), or None for another path. Each returns None: there is
    no loss to differentiate."""
    if path not in FORWARD_ONLY:
        return None
    import torch

    if path == "verl-entropy":
        from verl.utils.torch_functional import entropy_from_logits

        @torch.no_grad()
        def run(logits, sampled, topk_ids, topk_logp, mu_logp, adv, mask):
            entropy_from_logits(logits)

        return run
    from pdmask.trust_region import compute_token_stats
    from pdmask.trust_region.logits_pass import chunked_logits_pass
    from pdmask.trust_region.stats import ENTROPY

    inputs = (ENTROPY,) if path == "hook-stats-entropy" else ()

    @torch.no_grad()
    def run(logits, sampled, topk_ids, topk_logp, mu_logp, adv, mask):
        if path == "hook-entropy":  # as processor.entropy_outputs
            chunked_logits_pass(logits, sampled, sampled[:, None], entropy=True)
        else:  # as processor.statistics_outputs
            compute_token_stats(logits, sampled, topk_ids, topk_logp, mu_logp, inputs=inputs)

    return run


def make_inputs(tokens: int, vocab: int, k: int, seed: int, inputs: str = "random"):
    """bf16 logits and a behaviour top-K view. ``random``: logits N(0, 4) and an unrelated random
    mu (every token far out of region, the masks act on about half). ``peaked``: model-like; each
    row puts most of pi's mass on K head ids, mu is pi's head log-probs with a per-row drift
    (lognormal scale, median 0.1 nats), the sampled token is drawn from mu: most tokens stay in
    region, as in training."""
    import torch

    g = torch.Generator().manual_seed(seed)
    # Filled chunk by chunk: a float32 [N, V] temporary would set the process's peak memory.
    logits = torch.empty(tokens, vocab, dtype=torch.bfloat16)
    for start in range(0, tokens, 64):
        logits[start : start + 64] = torch.randn(min(64, tokens - start), vocab, generator=g) * 2
    adv = torch.randn(tokens, generator=g)
    mask = torch.ones(tokens, dtype=torch.bool)
    if inputs == "random":
        topk_logp = torch.log_softmax(torch.randn(tokens, 64, generator=g), -1)[:, :k]
        topk_ids = torch.randint(0, vocab, (tokens, k), generator=g)
        sampled = torch.randint(0, vocab, (tokens,), generator=g)
        mu_logp = torch.log_softmax(torch.randn(tokens, 64, generator=g), -1)[:, 0]
        return logits.requires_grad_(True), sampled, topk_ids, topk_logp, mu_logp, adv, mask
    head = torch.stack([torch.randperm(vocab, generator=g)[:k] for _ in range(tokens)])
    boost = 14 + 2 * torch.randn(tokens, k, generator=g)
    logits.scatter_(1, head, (logits.gather(1, head).float() + boost).to(logits.dtype))
    lse = torch.cat([torch.logsumexp(logits[s : s + 64].float(), -1) for s in range(0, tokens, 64)])
    pi_head = logits.gather(1, head).float() - lse[:, None]
    drift = 0.1 * torch.exp(torch.randn(tokens, 1, generator=g))
    mu_head = pi_head + drift * torch.randn(tokens, k, generator=g)
    mu_head -= torch.logsumexp(mu_head, -1, keepdim=True).clamp(min=-1e-3) + 1e-3  # mass < 1
    topk_logp, order = mu_head.sort(-1, descending=True)
    topk_ids = head.gather(1, order)
    pick = torch.multinomial(topk_logp.exp(), 1, generator=g)
    sampled = topk_ids.gather(1, pick).squeeze(1)
    mu_logp = topk_logp.gather(1, pick).squeeze(1)
    return logits.requires_grad_(True), sampled, topk_ids, topk_logp, mu_logp, adv, mask


def make_lm_head_inputs(tokens: int, vocab: int, hidden: int, seed: int):
    """bf16 hidden states ``[N, d]`` and an lm-head weight ``[V, d]`` (pdm-gram's extra inputs)."""
    import torch

    g = torch.Generator().manual_seed(seed + 1)
    weight = torch.empty(vocab, hidden, dtype=torch.bfloat16)
    for start in range(0, vocab, 4096):
        rows = min(4096, vocab - start)
        weight[start : start + rows] = 0.02 * torch.randn(rows, hidden, generator=g)
    return torch.randn(tokens, hidden, generator=g).to(torch.bfloat16), weight


def run_one(
    path: str, tokens: int, vocab: int, k: int, seed: int, inputs: str, hidden: int
) -> dict:
    run = make_path(path)

    def tensors_of(n: int) -> tuple:
        base = make_inputs(n, vocab, k, seed, inputs)
        return base + make_lm_head_inputs(n, vocab, hidden, seed) if path == "pdm-gram" else base

    def forward_backward(inputs):
        loss = run(*inputs)
        if loss is not None:  # a forward-only path returns nothing to differentiate
            loss.backward()

    warm = tensors_of(8)
    forward_backward(warm)  # load kernels, thread pools and lazy imports outside the measurement
    del warm
    tensors = tensors_of(tokens)
    logits = tensors[0]
    setup_rss = _rss_bytes()
    start = time.perf_counter()
    forward_backward(tensors)
    elapsed = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    logits_bytes = logits.numel() * logits.element_size()
    gradient = 0 if path in FORWARD_ONLY else logits_bytes  # same size as the logits
    extra = max(0, peak - setup_rss - gradient)
    return {
        "path": path,
        "seconds": elapsed,
        "extra_bytes": extra,
        "logits_bytes": logits_bytes,
        "masked_frac": getattr(run, "masked_frac", None),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096, help="N response tokens")
    parser.add_argument("--vocab", type=int, default=151_936, help="logits width (Qwen3: 151,936)")
    parser.add_argument("--topk", type=int, default=20)
    parser.add_argument("--hidden", type=int, default=2560, help="d of pdm-gram's lm head")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--inputs",
        choices=("random", "peaked"),
        default="random",
        help="random logits and mu (every token out of region) or model-like ones (make_inputs)",
    )
    parser.add_argument(
        "--paths",
        default="verl,pdm-agg,fused-logprob,ent-bonus,ent-every-token,support-kl,pdm-gram,"
        "pdm-agg-chunked,ent-bonus-chunked",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads per path (1 keeps ratios stable on a shared machine)",
    )
    parser.add_argument("--_child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._child:
        import torch

        from pdmask.process_group import signal_when_parent_dies

        signal_when_parent_dies()  # a stopped benchmark leaves no path running
        torch.set_num_threads(args.threads)
        result = run_one(
            args._child, args.tokens, args.vocab, args.topk, 0, args.inputs, args.hidden
        )
        print(json.dumps(result))
        return

    paths = args.paths.split(",")
    results: dict[str, list[dict]] = {p: [] for p in paths}
    for rep in range(args.repeats):
        order = paths if rep % 2 == 0 else list(reversed(paths))
        for path in order:
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--tokens",
                    str(args.tokens),
                    "--vocab",
                    str(args.vocab),
                    "--topk",
                    str(args.topk),
                    "--hidden",
                    str(args.hidden),
                    "--threads",
                    str(args.threads),
                    "--inputs",
                    args.inputs,
                    "--_child",
                    path,
                ],
                check=True,
                capture_output=True,
                text=True,
            )
            results[path].append(json.loads(out.stdout.strip().splitlines()[-1]))
            last = results[path][-1]
            print(
                f"  repeat {rep + 1}/{args.repeats} {path:>14}: {last['seconds']:.2f} s, "
                f"{last['extra_bytes'] / 1e6:.1f} MB extra",
                file=sys.stderr,
            )

    logits_gb = args.tokens * args.vocab * 2 / 1e9
    print(
        f"\nloss path, forward+backward (forward only: {', '.join(FORWARD_ONLY)}), N={args.tokens} tokens x V={args.vocab} bf16 logits "
        f"({logits_gb:.2f} GB), K={args.topk}, {args.inputs} inputs, median of {args.repeats}"
    )
    # Memory as the median and the worst repeat: now and then one repeat's peak holds one more
    # logits-sized buffer (seen on several paths, never reproduced in one process), so the worst
    # is stated beside the median.
    print(
        f"{'path':>18} | {'time (s)':>8} | {'extra mem (MB)':>14} | {'worst (MB)':>10} | "
        f"{'worst / logits':>14}"
    )
    med = {}
    for path in paths:
        t = statistics.median(r["seconds"] for r in results[path])
        extra = statistics.median(r["extra_bytes"] for r in results[path])
        worst = max(r["extra_bytes"] for r in results[path])
        logits_bytes = results[path][0]["logits_bytes"]
        med[path] = t
        print(
            f"{path:>18} | {t:8.2f} | {extra / 1e6:14.1f} | {worst / 1e6:10.1f} | "
            f"{worst / logits_bytes:13.1%}"
        )
    if "verl" in med and "pdm-agg" in med:
        print(
            f"\nratio pdm-agg / verl baseline       : {med['pdm-agg'] / med['verl']:.3f}  (target <= 1.10)"
        )
    if "fused-logprob" in med and "pdm-agg" in med:
        print(f"ratio pdm-agg / fused log-prob+clip : {med['pdm-agg'] / med['fused-logprob']:.3f}")
    if "pdm-agg-chunked" in med and "pdm-agg" in med:
        print(
            f"ratio pdm-agg / its chunked pass     : {med['pdm-agg'] / med['pdm-agg-chunked']:.3f}"
        )
    if "pdm-agg-chunked" in med and "ent-bonus-chunked" in med:
        ratio = med["ent-bonus-chunked"] / med["pdm-agg-chunked"]
        print(
            f"ratio ent-bonus / pdm-agg, chunked  : {ratio:.3f}  (the pass without a C++ compiler)"
        )
    if "hook-stats" in med and "hook-stats-entropy" in med:
        ratio = med["hook-stats-entropy"] / med["hook-stats"]
        print(f"ratio hook-stats with / without H  : {ratio:.3f}  (forward only, the VeRL hook)")
    if "hook-entropy" in med and "verl-entropy" in med:
        ratio = med["hook-entropy"] / med["verl-entropy"]
        print(f"ratio hook-entropy / verl's entropy: {ratio:.3f}  (forward only)")
    for extra_path in ("ent-bonus", "ent-every-token", "support-kl", "pdm-gram"):
        if extra_path in med and "pdm-agg" in med:
            masked = results[extra_path][0]["masked_frac"]
            share = "" if masked is None else f", {masked:.1%} of tokens masked"
            # The 10 % target is the entropy's (an input a recipe asks for); the others are
            # reported as they cost.
            target = "target <= 1.10" if extra_path == "ent-bonus" else "no target"
            print(
                f"ratio {extra_path} / pdm-agg{' ' * (17 - len(extra_path))}: "
                f"{med[extra_path] / med['pdm-agg']:.3f}  ({target}{share})"
            )


if __name__ == "__main__":
    main()
