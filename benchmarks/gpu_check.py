"""The prepared GPU check: pdmask's loss path and logits hook on one GPU, side by side (<= 8 min).

    python benchmarks/gpu_check.py                      # one H200 (its own torch, no downloads)
    python benchmarks/gpu_check.py --device cpu --tokens 256 --vocab 4096 --layers 1   # code check

Part 1, the loss path at N = 16k tokens x V = 151,936 bf16 logits, forward + backward to the
logits' gradient, median of ``--repeats`` runs, paths interleaved so they see the same GPU state:

  a) ``torch-ce``: torch's fused cross-entropy (``F.cross_entropy``, reduction none) = -log pi(y);
  b) ``verl``: verl 0.9.1's ``logprobs_from_logits`` + its clipped PPO loss (what verl's actor runs);
  c) ``pdm-agg``: ``pdmask.trust_region.policy_loss`` (top-20 statistics, mask, loss, diagnostics).

Each reports time, peak memory allocated above the logits and their gradient (which every path
holds), and the achieved memory bandwidth: the least traffic any path must make -- read the bf16
logits in the forward, read them and write their gradient in the backward, 3 x N x V x 2 bytes --
divided by its time, as a fraction of the device's bandwidth measured in the same run (a large
device-to-device copy) and of ``--peak-gbps`` (H200 SXM: 4800 GB/s).

Part 2, the logits hook in verl's FSDP engine on a small Qwen3 (random weights from a config,
hidden 1024, ``--layers`` layers, the real 151,936-wide head, bf16, ~16k packed tokens): verl's
``FSDPEngineWithLMHead.prepare_model_inputs/prepare_model_outputs`` around the model's forward,
once with verl's own log-prob path only and once with pdmask's hook (``processor.statistics_outputs``)
switched on, then backward through the log-probs. Reports time and peak memory of each and their
ratio: the hook's overhead at a realistic micro-batch (the README's [GPU-check] item 4). The model
runs unsharded (one GPU: FSDP would hold the whole model anyway); the engine methods are verl's.

Nothing is downloaded: models come from configs, inputs from seeded random numbers.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

H200_PEAK_GBPS = 4800.0


def _sync(torch, device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _reset_peak(torch, device) -> int:
    if device.type != "cuda":
        return 0
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)


def _peak(torch, device) -> int:
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0


def measured_bandwidth_gbps(torch, device, gigabytes: float = 2.0) -> float:
    """Device-to-device copy bandwidth (read + write), the practical ceiling of this GPU."""
    n = int(gigabytes * 1e9 / 2)
    a = torch.empty(n, dtype=torch.bfloat16, device=device)
    b = torch.empty_like(a)
    b.copy_(a)
    _sync(torch, device)
    start = time.perf_counter()
    for _ in range(5):
        b.copy_(a)
    _sync(torch, device)
    seconds = (time.perf_counter() - start) / 5
    del a, b
    return 2 * n * 2 / seconds / 1e9


def loss_paths(torch):
    import torch.nn.functional as F
    from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla
    from verl.utils.torch_functional import logprobs_from_logits
    from verl.workers.config import ActorConfig

    from pdmask.trust_region import policy_loss

    cfg = ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
    )

    def torch_ce(x):
        return -F.cross_entropy(x["logits"], x["sampled"], reduction="none").mean()

    def verl(x):
        logp = logprobs_from_logits(x["logits"], x["sampled"])
        loss, _ = compute_policy_loss_vanilla(
            x["mu_logp"][None],
            logp[None],
            x["adv"][None],
            x["mask"][None],
            loss_agg_mode="token-mean",
            config=cfg,
        )
        return loss

    def pdm_agg(x):
        return policy_loss(
            "pdm-agg",
            x["logits"],
            x["sampled"],
            x["topk_ids"],
            x["topk_logp"],
            x["mu_logp"],
            x["adv"],
            x["mask"],
            delta=0.15,
        ).loss

    return {"torch-ce": torch_ce, "verl": verl, "pdm-agg": pdm_agg}


def make_inputs(torch, device, tokens: int, vocab: int, k: int, seed: int = 0) -> dict:
    g = torch.Generator(device=device).manual_seed(seed)
    logits = torch.randn(tokens, vocab, generator=g, device=device, dtype=torch.bfloat16) * 2
    topk_logp = torch.log_softmax(torch.randn(tokens, 64, generator=g, device=device), -1)[:, :k]
    return {
        "logits": logits.requires_grad_(True),
        "sampled": torch.randint(0, vocab, (tokens,), generator=g, device=device),
        "topk_ids": torch.randint(0, vocab, (tokens, k), generator=g, device=device),
        "topk_logp": topk_logp.contiguous(),
        "mu_logp": torch.log_softmax(torch.randn(tokens, 64, generator=g, device=device), -1)[
            :, 0
        ].contiguous(),
        "adv": torch.randn(tokens, generator=g, device=device),
        "mask": torch.ones(tokens, dtype=torch.bool, device=device),
    }


def part_loss(torch, device, args) -> None:
    paths = loss_paths(torch)
    x = make_inputs(torch, device, args.tokens, args.vocab, args.topk)
    logits_bytes = x["logits"].numel() * x["logits"].element_size()
    for fn in paths.values():  # kernels, caches and lazy imports outside the measurement
        warm = make_inputs(torch, device, 64, args.vocab, args.topk, seed=1)
        fn(warm).backward()
    times: dict[str, list[float]] = {p: [] for p in paths}
    extra: dict[str, int] = dict.fromkeys(paths, 0)
    for rep in range(args.repeats):
        order = list(paths) if rep % 2 == 0 else list(reversed(paths))
        for name in order:
            x["logits"].grad = None
            base = _reset_peak(torch, device)
            start = time.perf_counter()
            paths[name](x).backward()
            _sync(torch, device)
            times[name].append(time.perf_counter() - start)
            extra[name] = max(extra[name], _peak(torch, device) - base - logits_bytes)
    ceiling = measured_bandwidth_gbps(torch, device) if device.type == "cuda" else float("nan")
    traffic = 3 * logits_bytes
    print(
        f"\nPart 1: loss path, forward+backward, N={args.tokens} x V={args.vocab} bf16 logits "
        f"({logits_bytes / 1e9:.2f} GB), K={args.topk}, median of {args.repeats}; "
        f"copy bandwidth measured {ceiling:.0f} GB/s, nominal peak {args.peak_gbps:.0f} GB/s"
    )
    print(
        f"{'path':>9} | {'time ms':>8} | {'extra MB':>9} | {'extra/logits':>12} | "
        f"{'GB/s':>7} | {'of copy':>7} | {'of peak':>7}"
    )
    median = {}
    for name in paths:
        t = statistics.median(times[name])
        median[name] = t
        gbps = traffic / t / 1e9
        print(
            f"{name:>9} | {t * 1e3:8.2f} | {extra[name] / 1e6:9.1f} | "
            f"{extra[name] / logits_bytes:12.1%} | {gbps:7.0f} | {gbps / ceiling:7.1%} | "
            f"{gbps / args.peak_gbps:7.1%}"
        )
    print(
        f"ratios: pdm-agg / verl = {median['pdm-agg'] / median['verl']:.2f}, "
        f"pdm-agg / torch-ce = {median['pdm-agg'] / median['torch-ce']:.2f}, "
        f"verl / torch-ce = {median['verl'] / median['torch-ce']:.2f}"
    )


def _packed_batch(torch, device, tokens: int, vocab: int, k: int, seq_len: int):
    """A verl-style packed micro-batch of ``tokens`` tokens with mu's top-K fields (TensorDict)."""
    from tensordict import TensorDict

    from pdmask.backends.verl.layout import TOPK_IDS, TOPK_LOGPROBS

    g = torch.Generator().manual_seed(0)
    n_seq = max(1, tokens // seq_len)
    prompt = min(64, seq_len // 4)
    ids, pos, loss_mask, adv, top_ids, top_lps = [], [], [], [], [], []
    for _ in range(n_seq):
        ids.append(torch.randint(0, vocab, (seq_len,), generator=g))
        pos.append(torch.arange(seq_len))
        m = torch.zeros(seq_len)
        m[prompt:] = 1
        loss_mask.append(m)
        adv.append(torch.full((seq_len,), float(torch.randn(1, generator=g))))
        top_ids.append(torch.randint(0, vocab, (seq_len, k + 1), generator=g, dtype=torch.int32))
        top_lps.append(torch.log_softmax(torch.randn(seq_len, k + 1, generator=g), -1))

    def nested(parts):
        return torch.nested.as_nested_tensor(parts, layout=torch.jagged)

    data = TensorDict(
        {
            "input_ids": nested(ids),
            "position_ids": nested(pos),
            "loss_mask": nested(loss_mask),
            "response_mask": nested(loss_mask),
            "advantages": nested(adv),
            TOPK_IDS: nested(top_ids),
            TOPK_LOGPROBS: nested(top_lps),
        },
        batch_size=[n_seq],
    )
    from verl.utils import tensordict_utils as tu

    for key, value in {
        "temperature": 1.0,
        "calculate_entropy": False,
        "distillation_use_topk": True,
        "pad_mode": "no_padding",
    }.items():
        tu.assign_non_tensor_data(data, key, value)
    return data.to(device)


def part_engine(torch, device, args) -> None:
    from types import SimpleNamespace

    from transformers import Qwen3Config, Qwen3ForCausalLM
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    from pdmask.backends.verl.processor import StatsSettings, statistics_outputs

    config = Qwen3Config(
        vocab_size=args.vocab,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=args.layers,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=64,
        max_position_embeddings=4096,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).to(device=device, dtype=torch.bfloat16)
    engine = object.__new__(FSDPEngineWithLMHead)
    engine.pad_to_length = False
    engine.use_ulysses_sp = False
    engine.ulysses_sequence_parallel_size = 1
    engine.use_remove_padding = True
    engine.use_fused_kernels = False
    data = _packed_batch(torch, device, args.tokens, args.vocab, args.topk, args.seq_len)
    settings = StatsSettings(method="pdm-agg", topk=args.topk)

    def hook(student_logits, data):
        return statistics_outputs(student_logits, data, settings)

    from verl.utils import tensordict_utils as tu

    def step(with_hook: bool) -> tuple[float, int]:
        tu.assign_non_tensor_data(data, "distillation_use_topk", with_hook)
        model.zero_grad(set_to_none=True)
        base = _reset_peak(torch, device)
        start = time.perf_counter()
        inputs, output_args = engine.prepare_model_inputs(data)
        out = model(
            input_ids=inputs["input_ids"], position_ids=inputs["position_ids"], use_cache=False
        )
        outputs = engine.prepare_model_outputs(
            SimpleNamespace(logits=out.logits), output_args, data, hook if with_hook else None
        )
        outputs["log_probs"].values().sum().backward()
        _sync(torch, device)
        return time.perf_counter() - start, _peak(torch, device) - base

    step(True)  # warm-up
    step(False)
    results = {True: [], False: []}
    for rep in range(args.repeats):
        for with_hook in (True, False) if rep % 2 == 0 else (False, True):
            results[with_hook].append(step(with_hook))
    print(
        f"\nPart 2: verl FSDPEngineWithLMHead output preparation around a {args.layers}-layer "
        f"Qwen3 (hidden 1024, V={args.vocab}, bf16), {args.tokens} packed tokens, forward + "
        f"backward, median of {args.repeats}"
    )
    row = {}
    for with_hook, label in ((False, "verl log-probs only"), (True, "with pdmask's hook")):
        t = statistics.median(r[0] for r in results[with_hook])
        peak = max(r[1] for r in results[with_hook])
        row[with_hook] = (t, peak)
        print(f"{label:>22}: {t * 1e3:9.1f} ms, peak {peak / 1e9:7.2f} GB")
    print(
        f"hook overhead: time x{row[True][0] / row[False][0]:.3f}, "
        f"peak memory x{row[True][1] / max(row[False][1], 1):.3f}"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda", help="cuda (the check) or cpu (code check)")
    parser.add_argument("--tokens", type=int, default=16384, help="N tokens per micro-batch")
    parser.add_argument("--vocab", type=int, default=151_936, help="logits width (Qwen3)")
    parser.add_argument("--topk", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--layers", type=int, default=4, help="Part 2 model depth")
    parser.add_argument("--seq-len", type=int, default=2048, help="Part 2 sequence length")
    parser.add_argument("--peak-gbps", type=float, default=H200_PEAK_GBPS)
    parser.add_argument("--skip-loss", action="store_true", help="run Part 2 only")
    parser.add_argument("--skip-engine", action="store_true", help="run Part 1 only")
    args = parser.parse_args(argv)

    import torch

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run with --device cpu for a code check", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"gpu_check: torch {torch.__version__} on {name}")
    started = time.perf_counter()
    if not args.skip_loss:
        part_loss(torch, device, args)
    if not args.skip_engine:
        part_engine(torch, device, args)
    print(f"\ntotal {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
