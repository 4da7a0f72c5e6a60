"""Masks of every method (its recipe), the loss's logit gradient, and verl's aggregation modes."""

from __future__ import annotations

import math

import pytest
import torch

from pdmask.trust_region import (
    AGG_MODES,
    Method,
    aggregate_loss,
    apply_method,
    composed_mask,
    compute_token_stats,
    diagnostics,
    per_token_loss,
    policy_loss,
)
from tests.methods import mask_of, method, project_recipes

from .cases import make_case
from .reference import token_reference

PAPER_METHODS = {
    "grpo-clip-higher",
    "dppo-binary-kl",
    "dppo-binary-tv",
    "dppo-topk-kl",
    "dppo-topk-tv",
    "pdm-agg",
    "pdm-uni",
    "pdm-tv",
    "pdm-bucket",
}


def brute_force_mask(method: str, ref: dict, adv: float, delta: float) -> bool:
    """The mask rule of paper.md, written out per method from reference values."""
    r = ref["ratio"]
    ratio_dir = adv * (r - 1) > 0
    rules = {
        "grpo-clip-higher": ((r < 0.8) or (r > 1.28)) and ratio_dir,
        "dppo-binary-kl": ref["kl_binary"] > delta and ratio_dir,
        "dppo-binary-tv": ref["tv_binary"] > delta and ratio_dir,
        "dppo-topk-kl": ref["kl_topk"] > delta and ratio_dir,
        "dppo-topk-tv": ref["tv_topk"] > delta and ratio_dir,
        "pdm-agg": ref["kl_topk"] > delta and adv * ref["ddot_agg"] > 0,
        "pdm-uni": ref["kl_topk"] > delta and adv * ref["ddot_uni"] > 0,
        "pdm-bucket": ref["kl_topk"] > delta and adv * ref["ddot_bucket"] > 0,
        "pdm-tv": ref["tv_topk"] > delta
        and ((adv > 0 and ref["tv_deriv_pos"] > 0) or (adv < 0 and ref["tv_deriv_neg"] > 0)),
    }
    return rules[method]


def near_threshold(ref: dict, delta: float) -> bool:
    """Decisions within rounding of a threshold are not compared (either answer is right)."""
    keys = ("kl_binary", "tv_binary", "kl_topk", "tv_topk")
    return (
        any(abs(ref[k] - delta) < 1e-12 for k in keys)
        or any(
            abs(ref[k]) < 1e-13
            for k in ("ddot_agg", "ddot_uni", "ddot_bucket", "tv_deriv_pos", "tv_deriv_neg")
        )
        or min(abs(ref["ratio"] - 1), abs(ref["ratio"] - 0.8), abs(ref["ratio"] - 1.28)) < 1e-12
    )


def test_every_paper_method_is_a_recipe():
    assert set(project_recipes()) >= PAPER_METHODS


@pytest.mark.parametrize("seed", range(60))
def test_masks_match_brute_force_rules(seed):
    case = make_case(seed, vocab=48, k=5)
    delta = [0.15, 0.05, 0.01, 0.3][seed % 4]
    stats = compute_token_stats(
        case.logits, case.sampled, case.topk_ids, case.topk_logp, case.mu_logp
    )
    masks = {name: mask_of(name, stats, case.advantages, delta=delta) for name in PAPER_METHODS}
    for row in range(case.logits.shape[0]):
        ref = token_reference(
            case.logits[row],
            int(case.sampled[row]),
            float(case.mu_logp[row]),
            case.topk_ids[row].tolist(),
            case.topk_logp[row].tolist(),
        )
        if near_threshold(ref, delta):
            continue
        adv = float(case.advantages[row])
        for name, mask in masks.items():
            assert bool(mask[row]) == brute_force_mask(name, ref, adv, delta), (name, row)
        if adv == 0:
            assert not any(bool(m[row]) for m in masks.values())


def test_predictive_masks_differ_from_baseline_only_in_direction():
    """pdm-agg/uni share dppo-topk-kl's proximity test: where it is False nobody is masked."""
    case = make_case(7, n=64, vocab=100, k=8)
    stats = compute_token_stats(
        case.logits, case.sampled, case.topk_ids, case.topk_logp, case.mu_logp
    )
    inside = stats.kl_topk <= 0.15
    for name in ("dppo-topk-kl", "pdm-agg", "pdm-uni", "pdm-bucket"):
        assert not mask_of(name, stats, case.advantages, delta=0.15)[inside].any()


def test_delta_is_required_for_divergence_tests():
    case = make_case(1)
    stats = compute_token_stats(
        case.logits, case.sampled, case.topk_ids, case.topk_logp, case.mu_logp
    )
    with pytest.raises(ValueError, match="delta"):
        composed_mask("kl_topk", "ddot_agg", stats, case.advantages)
    with pytest.raises(KeyError, match="known"):
        composed_mask("kl_nope", "ddot_agg", stats, case.advantages, delta=0.1)


@pytest.mark.parametrize("method", sorted(PAPER_METHODS))
@pytest.mark.parametrize("cap", [None, 1.5])
def test_loss_logit_gradient(method, cap):
    """d(-M r A)/dz = -M r A (e_k - pi) (times min(r, C)/r with a cap)."""
    case = make_case(11, n=16, vocab=40, k=5)
    z = case.logits.clone().requires_grad_(True)
    stats = compute_token_stats(z, case.sampled, case.topk_ids, case.topk_logp, case.mu_logp)
    mask = mask_of(method, stats, case.advantages, delta=0.05)
    loss = per_token_loss(stats.logp, stats.mu_logp, case.advantages, mask, ratio_cap=cap)
    loss.sum().backward()
    pi = torch.softmax(case.logits, -1)
    onehot = torch.nn.functional.one_hot(case.sampled, 40).double()
    r = stats.ratio
    weight = r if cap is None else r.clamp(max=cap)
    expected = (-(~mask).double() * weight * case.advantages)[:, None] * (onehot - pi)
    torch.testing.assert_close(z.grad, expected, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(loss.detach(), -(~mask).double() * weight * case.advantages)
    # The default loss hook, through the one call every backend makes, is the same loss.
    z.grad = None
    stats = compute_token_stats(z, case.sampled, case.topk_ids, case.topk_logp, case.mu_logp)
    masked = Method("masked", mask=lambda batch: mask.clone(), ratio_cap=cap)
    valid = torch.ones_like(mask)
    out = apply_method(masked, stats, case.advantages, valid, backend="math")
    out.token_loss.sum().backward()
    torch.testing.assert_close(z.grad, expected, rtol=1e-9, atol=1e-12)
    assert out.token_loss.dtype == torch.float64  # float64 stays float64


def test_bf16_gradient_flows_in_logits_dtype():
    case = make_case(2, n=10, vocab=64, k=5)
    z = case.logits.to(torch.bfloat16).requires_grad_(True)
    res = policy_loss(
        method("pdm-agg", delta=0.05),
        z,
        case.sampled,
        case.topk_ids,
        case.topk_logp,
        case.mu_logp,
        case.advantages,
        torch.ones(10, dtype=torch.bool),
        delta=0.05,
    )
    res.loss.backward()
    assert z.grad.dtype == torch.bfloat16 and torch.isfinite(z.grad.float()).all()
    assert z.grad.abs().sum() > 0


def _verl_agg_reference(loss_mat, mask, mode, **info):
    """verl 0.9.1's agg_loss, re-derived by hand from its definition."""
    m = mask.double()
    if mode == "token-mean":
        return (loss_mat * m).sum() / info.get("batch_num_tokens", m.sum()) * info.get("dp_size", 1)
    if mode == "token-sum":
        return (loss_mat * m).sum() * info.get("dp_size", 1)
    seq_has = (m.sum(-1) > 0).double()
    gbs = info.get("global_batch_size", seq_has.sum())
    if mode == "seq-mean-token-mean":
        per_seq = (loss_mat * m).sum(-1) / (m.sum(-1) + 1e-8)
        return (per_seq * seq_has).sum() / gbs * info.get("dp_size", 1)
    per_seq = (loss_mat * m).sum(-1)
    out = (per_seq * seq_has).sum() / gbs * info.get("dp_size", 1)
    if mode == "seq-mean-token-sum-norm":
        out = out / info.get("loss_scale_factor", loss_mat.shape[-1])
    return out


@pytest.mark.parametrize("mode", AGG_MODES)
def test_aggregation_modes(mode):
    g = torch.Generator().manual_seed(0)
    loss_mat = torch.randn(5, 9, generator=g, dtype=torch.float64)
    mask = torch.rand(5, 9, generator=g) > 0.3
    mask[2] = False  # a fully masked sequence
    got = aggregate_loss(loss_mat, mask, mode)
    assert math.isclose(float(got), float(_verl_agg_reference(loss_mat, mask, mode)), rel_tol=1e-12)
    info = {"dp_size": 2, "batch_num_tokens": 40, "global_batch_size": 7, "loss_scale_factor": 3.0}
    got = aggregate_loss(loss_mat, mask, mode, **info)
    assert math.isclose(
        float(got), float(_verl_agg_reference(loss_mat, mask, mode, **info)), rel_tol=1e-12
    )


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_micro_batches_with_global_info_equal_whole_batch(mode):
    case = make_case(4, n=24, vocab=50, k=5)
    shape = (6, 4)
    valid = torch.ones(shape, dtype=torch.bool)
    valid[1, 3] = valid[4, 2:] = False

    def run(rows, **info):
        z = case.logits.view(6, 4, 50)[rows].clone().requires_grad_(True)
        res = policy_loss(
            method("pdm-uni", delta=0.05),
            z,
            case.sampled.view(shape)[rows],
            case.topk_ids.view(6, 4, 5)[rows],
            case.topk_logp.view(6, 4, 5)[rows],
            case.mu_logp.view(shape)[rows],
            case.advantages.view(shape)[rows],
            valid[rows],
            delta=0.05,
            loss_agg_mode=mode,
            **info,
        )
        res.loss.backward()
        return res.loss.detach(), z.grad

    whole_loss, whole_grad = run(slice(0, 6))
    info = {"batch_num_tokens": int(valid.sum()), "global_batch_size": 6}
    parts = [run(slice(a, a + 2), **info) for a in (0, 2, 4)]
    torch.testing.assert_close(sum(p[0] for p in parts), whole_loss, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(torch.cat([p[1] for p in parts]), whole_grad, rtol=1e-12, atol=1e-14)


def test_diagnostics_count_disagreements():
    case = make_case(8, n=200, vocab=60, k=5)
    stats = compute_token_stats(
        case.logits, case.sampled, case.topk_ids, case.topk_logp, case.mu_logp
    )
    mask = mask_of("pdm-agg", stats, case.advantages, delta=0.05)
    d = diagnostics(stats, case.advantages, mask, delta=0.05)
    baseline = mask_of("dppo-topk-kl", stats, case.advantages, delta=0.05)
    assert math.isclose(d["disagree_agg"], float((mask != baseline).double().mean()), rel_tol=1e-12)
    assert math.isclose(d["masked_frac"], float(mask.double().mean()), rel_tol=1e-12)
    assert 0 < d["out_of_region_frac"] <= 1


def test_diagnostics_are_float64_means_read_back_once(monkeypatch):
    """Every diagnostic is its brute-force float64 mean over its tokens (0 over none: no negative
    advantage here), and the whole dict costs one read back to the host (on a GPU, each read
    waits for the device)."""
    case = make_case(9, n=120, vocab=60, k=5)
    stats = compute_token_stats(
        case.logits, case.sampled, case.topk_ids, case.topk_logp, case.mu_logp
    )
    adv = case.advantages.abs()
    valid = torch.arange(120) % 7 != 0
    mask = mask_of("pdm-agg", stats, adv, delta=0.05)
    reads = []
    for name in ("item", "tolist", "cpu", "numpy", "__float__", "__bool__", "__int__"):
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _name=name, _original=original, **kwargs):
            reads.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    d = diagnostics(stats, adv, mask, valid, delta=0.05)
    monkeypatch.undo()
    assert reads == ["tolist"]

    def mean(values, where):
        return sum(float(v) for v, w in zip(values.double(), where, strict=True) if w) / max(
            int(where.sum()), 1
        )

    kl = stats.kl_topk.double()
    assert d["masked_frac_neg_adv"] == 0.0
    assert math.isclose(d["masked_frac"], mean(mask, valid), rel_tol=1e-12)
    assert math.isclose(d["masked_frac_pos_adv"], mean(mask, valid & (adv > 0)), rel_tol=1e-12)
    assert math.isclose(d["kl_topk_mean"], mean(kl, valid), rel_tol=1e-12)
    out = (kl > 0.05) & (adv != 0)
    assert math.isclose(d["out_of_region_frac"], mean(out, valid), rel_tol=1e-12)
    assert len(d) == 17 and all(isinstance(v, float) for v in d.values())


def test_no_float32_copy_of_the_logits():
    """Peak single allocation stays below one [N, V] float32 copy (bf16 logits, N*V*4 bytes)."""
    from torch.profiler import ProfilerActivity, profile

    n, vocab, k = 256, 4096, 20
    g = torch.Generator().manual_seed(0)
    z = (torch.randn(n, vocab, generator=g) * 2).to(torch.bfloat16).requires_grad_(True)
    topk_logp, topk_ids = torch.log_softmax(torch.randn(n, vocab, generator=g), -1).topk(k, -1)
    sampled = topk_ids[:, 0].clone()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        res = policy_loss(
            method("pdm-agg", delta=0.1),
            z,
            sampled,
            topk_ids,
            topk_logp,
            topk_logp[:, 0],
            torch.randn(n, generator=g),
            torch.ones(n, dtype=torch.bool),
            delta=0.1,
            chunk_size=16,
        )
        res.loss.backward()
    biggest = max(e.cpu_memory_usage for e in prof.events())
    fp32_copy = n * vocab * 4
    assert biggest < fp32_copy, f"an allocation of {biggest} bytes >= a float32 copy ({fp32_copy})"
    assert biggest <= n * vocab * 2 + 16 * vocab * 4  # the bf16 gradient itself, or one chunk
