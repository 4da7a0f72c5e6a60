"""compute_token_stats against the brute-force float64 reference, on hundreds of cases."""

from __future__ import annotations

import math

import pytest
import torch

from pdmask.trust_region import compute_token_stats
from pdmask.trust_region.stats import SECOND_ORDER

from .cases import make_case
from .reference import bucketed_kl, full_kl, support_of, token_reference

FIELDS = [
    "logp",
    "ratio",
    "kl_topk",
    "tv_topk",
    "kl_binary",
    "tv_binary",
    "local_term",
    "ddot_agg",
    "ddot_uni",
    "ddot_bucket",
    "global_agg",
    "mu_tail",
    "pi_tail",
    "mu_topk_mass",
    "pi_topk_mass",
    "support_size",
    "sum_pi_sq",
    "var_v",
    "tail_sum_cube",
    "var_v_agg",
    "var_v_uni",
    "var_v_bucket",
    "tv_deriv_pos",
    "tv_deriv_neg",
]


def assert_matches_reference(case, stats, rtol=1e-9, atol=1e-13):
    for row in range(case.logits.shape[0]):
        ref = token_reference(
            case.logits[row],
            int(case.sampled[row]),
            float(case.mu_logp[row]),
            case.topk_ids[row].tolist(),
            case.topk_logp[row].tolist(),
        )
        for name in FIELDS:
            got = float(getattr(stats, name)[row])
            want = ref[name]
            assert math.isclose(got, want, rel_tol=rtol, abs_tol=atol), (
                f"row {row} {name}: got {got!r}, reference {want!r}"
            )


@pytest.mark.parametrize("seed", range(120))
def test_float64_matches_reference(seed):
    vocab = [64, 7, 6, 300][seed % 4]  # 7 and 6 make an empty/near-empty tail with K = 5
    case = make_case(seed, vocab=vocab, k=5)
    stats = compute_token_stats(
        case.logits,
        case.sampled,
        case.topk_ids,
        case.topk_logp,
        case.mu_logp,
        inputs=(SECOND_ORDER,),
        chunk_size=3,
    )
    assert stats.kl_topk.dtype == torch.float64
    assert_matches_reference(case, stats)
    assert torch.equal(stats.token_id, case.sampled) and stats.token_id.dtype == torch.long


def test_the_second_order_statistics_are_computed_only_when_asked_for():
    case = make_case(0, vocab=64, k=5)
    args = (case.logits, case.sampled, case.topk_ids, case.topk_logp, case.mu_logp)
    plain = compute_token_stats(*args)
    names = ("tail_sum_cube", "var_v", "var_v_agg", "var_v_uni", "var_v_bucket")
    assert all(getattr(plain, name) is None for name in names)
    assert not set(names) & set(plain.tensors())
    second = compute_token_stats(*args, inputs=(SECOND_ORDER,))
    assert set(names) <= set(second.tensors())
    for name in set(FIELDS) - set(names):  # asking for more changes nothing else
        assert torch.equal(getattr(plain, name), getattr(second, name)), name


def _second_derivative(f) -> float:
    eta = torch.zeros((), dtype=torch.float64, requires_grad=True)
    (d1,) = torch.autograd.grad(f(eta), eta, create_graph=True)
    (d2,) = torch.autograd.grad(d1, eta)
    return float(d2)


@pytest.mark.parametrize("seed", range(24))
def test_each_second_order_form_is_the_second_derivative_of_its_divergence(seed):
    """``t ddot_X + t^2/2 var_v_X`` is the Taylor expansion of one divergence along the step:
    ``var_v_bucket`` of D_t = KL_topK along the true ``v`` (autograd through the full softmax),
    ``var_v_agg`` of the KL of the distribution with the tail as one token, ``var_v_uni`` with the
    tail as ``n - m`` equal tokens, each moved along its own ``e_k - p`` (mu a distribution)."""
    vocab = 40
    case = make_case(seed, vocab=vocab, k=5, corrupt=False)
    s = compute_token_stats(
        case.logits,
        case.sampled,
        case.topk_ids,
        case.topk_logp,
        case.mu_logp,
        inputs=(SECOND_ORDER,),
    )
    for row in range(case.logits.shape[0]):
        k = int(case.sampled[row])
        sup = support_of(
            k,
            float(case.mu_logp[row]),
            case.topk_ids[row].tolist(),
            case.topk_logp[row].tolist(),
            vocab,
        )
        ids = sorted(sup)
        mu_s = {i: math.exp(lp) for i, lp in sup.items()}
        mu_tail = max(0.0, 1.0 - math.fsum(mu_s.values()))
        z = case.logits[row]
        pi = torch.softmax(z, -1)
        v = -pi.clone()
        v[k] += 1
        bucket = _second_derivative(
            lambda eta, z=z, v=v, mu_s=mu_s, mu_tail=mu_tail: bucketed_kl(
                z + eta * v, mu_s, mu_tail
            )
        )
        tail = torch.ones(vocab, dtype=torch.bool)
        tail[ids] = False
        pi_tail = pi[tail].sum()
        mu_lumped = torch.tensor([mu_s[i] for i in ids] + [mu_tail], dtype=torch.float64)
        for form, copies in (("agg", 1), ("uni", vocab - len(ids))):
            # the collapsed distribution's logits: S as they are, the tail as `copies` equal tokens
            zc = torch.cat([pi[ids].log(), (pi_tail / copies).log().expand(copies)])
            muc = torch.cat([mu_lumped[:-1], (mu_lumped[-1] / copies).expand(copies)])
            vc = -torch.softmax(zc, -1)
            vc[ids.index(k)] += 1
            want = _second_derivative(
                lambda eta, zc=zc, muc=muc, vc=vc: full_kl(zc + eta * vc, muc)
            )
            got = float(getattr(s, f"var_v_{form}")[row])
            assert math.isclose(got, want, rel_tol=1e-8, abs_tol=1e-12), (form, row, got, want)
        got = float(s.var_v_bucket[row])
        assert math.isclose(got, bucket, rel_tol=1e-7, abs_tol=1e-11), (row, got, bucket)


@pytest.mark.parametrize("seed", range(40))
def test_k_zero_support_is_sampled_token_plus_bucket(seed):
    case = make_case(seed, k=0, corrupt=False)
    stats = compute_token_stats(case.logits, case.sampled, None, None, case.mu_logp)
    pi_k, mu_k = stats.logp.detach().exp(), case.mu_logp.exp()
    torch.testing.assert_close(
        stats.ddot_agg, 2 * (1 - pi_k) * (pi_k - mu_k), rtol=1e-9, atol=1e-13
    )
    # Where the exact value is below the rounding of its O(1) terms (mu == pi, pi_k ~ 0 or 1),
    # Ddot is rounding noise with no sign to compare.
    decided = (2 * (1 - pi_k) * (pi_k - mu_k)).abs() > 1e-12
    assert torch.equal(torch.sign(stats.ddot_agg)[decided], torch.sign(stats.ratio - 1)[decided])
    torch.testing.assert_close(stats.kl_topk, stats.kl_binary, rtol=1e-9, atol=1e-13)
    assert bool((stats.support_size == 1).all())


@pytest.mark.parametrize("seed", range(40))
def test_agg_minus_uni_identity(seed):
    case = make_case(seed, vocab=97, k=6)
    s = compute_token_stats(case.logits, case.sampled, case.topk_ids, case.topk_logp, case.mu_logp)
    n, m = s.vocab_size, s.support_size.double()
    expected = s.pi_tail * (s.mu_tail - s.pi_tail) * (n - m - 1) / (n - m)
    torch.testing.assert_close(s.ddot_agg - s.ddot_uni, expected, rtol=1e-9, atol=1e-15)


@pytest.mark.parametrize("seed", range(30))
def test_bucket_is_autograd_derivative_of_bucketed_kl(seed):
    case = make_case(seed, vocab=40, k=5, corrupt=(seed % 2 == 0))
    s = compute_token_stats(case.logits, case.sampled, case.topk_ids, case.topk_logp, case.mu_logp)
    for row in range(case.logits.shape[0]):
        k = int(case.sampled[row])
        sup = support_of(
            k,
            float(case.mu_logp[row]),
            case.topk_ids[row].tolist(),
            case.topk_logp[row].tolist(),
            40,
        )
        mu_s = {i: math.exp(lp) for i, lp in sup.items()}
        mu_tail = max(0.0, 1.0 - math.fsum(mu_s.values()))
        z = case.logits[row]
        v = -torch.softmax(z, -1)
        v[k] += 1
        eta = torch.zeros((), dtype=torch.float64, requires_grad=True)
        (grad,) = torch.autograd.grad(bucketed_kl(z + eta * v, mu_s, mu_tail), eta)
        assert math.isclose(float(s.ddot_bucket[row]), float(grad), rel_tol=1e-8, abs_tol=1e-12)
        # and by central finite differences
        h = 1e-6
        fd = (bucketed_kl(z + h * v, mu_s, mu_tail) - bucketed_kl(z - h * v, mu_s, mu_tail)) / (
            2 * h
        )
        assert math.isclose(float(s.ddot_bucket[row]), float(fd), rel_tol=1e-5, abs_tol=1e-9)


@pytest.mark.parametrize("seed", range(30))
def test_full_vocab_derivative_and_second_order(seed):
    """With mu proportional to pi on the tail, Ddot_bucket equals the exact full-vocabulary Ddot;
    Var_pi(v) is the second derivative of the full KL along v (independent of mu)."""
    case = make_case(seed, vocab=50, k=6, corrupt=False)
    for row in range(case.logits.shape[0]):
        z = case.logits[row]
        k = int(case.sampled[row])
        pi = torch.softmax(z, -1)
        ids = case.topk_ids[row].tolist()
        sup = sorted(set(ids) | {k})
        mu = pi.clone()
        mu[sup] = case.mu_full[row, sup]
        tail = torch.ones(50, dtype=torch.bool)
        tail[sup] = False
        mu[tail] = pi[tail] / pi[tail].sum() * (1 - mu[sup].sum())  # proportional to pi on the tail
        logmu = mu.log()
        s = compute_token_stats(
            z[None],
            torch.tensor([k]),
            torch.tensor([ids]),
            logmu[ids][None],
            logmu[k][None],
            inputs=(SECOND_ORDER,),
        )
        v = -pi.clone()
        v[k] += 1
        eta = torch.zeros((), dtype=torch.float64, requires_grad=True)
        f = full_kl(z + eta * v, mu)
        (d1,) = torch.autograd.grad(f, eta, create_graph=True)
        (d2,) = torch.autograd.grad(d1, eta)
        assert math.isclose(
            float(s.ddot_bucket[0]), float(d1.detach()), rel_tol=1e-8, abs_tol=1e-12
        )
        assert math.isclose(float(s.var_v[0]), float(d2), rel_tol=1e-8, abs_tol=1e-12)
        assert float(s.var_v[0]) >= 0


# Style 3 (seed % 6 == 3) is extremely peaked: gaps |pi_i - mu_i| below the finite-difference step
# would cross a kink; the formula itself is checked there against the reference above.
@pytest.mark.parametrize("seed", [s for s in range(36) if s % 6 != 3])
def test_tv_derivative_by_one_sided_differences(seed):
    case = make_case(seed, vocab=30, k=4, corrupt=False)
    # Put some support buckets exactly at a kink (pi_i == mu_i).
    pi = torch.softmax(case.logits, -1)
    logpi = pi.log()
    for row in range(0, case.logits.shape[0], 3):
        case.topk_logp[row, 0] = logpi[row, case.topk_ids[row, 0]]
        if case.sampled[row] == case.topk_ids[row, 0]:
            case.mu_logp[row] = case.topk_logp[row, 0]
    s = compute_token_stats(case.logits, case.sampled, case.topk_ids, case.topk_logp, case.mu_logp)
    for row in range(case.logits.shape[0]):
        k = int(case.sampled[row])
        sup = support_of(
            k,
            float(case.mu_logp[row]),
            case.topk_ids[row].tolist(),
            case.topk_logp[row].tolist(),
            30,
        )
        ids = sorted(sup)
        mu_s = torch.tensor([math.exp(sup[i]) for i in ids], dtype=torch.float64)
        mu_tail = max(0.0, 1.0 - float(mu_s.sum()))
        z = case.logits[row]
        v = -torch.softmax(z, -1)
        v[k] += 1

        def tv(eta, z=z, v=v, ids=ids, mu_s=mu_s, mu_tail=mu_tail):
            p = torch.softmax(z + eta * v, -1)
            p_s = p[ids]
            return 0.5 * (float((mu_s - p_s).abs().sum()) + abs(mu_tail - (1 - float(p_s.sum()))))

        h = 1e-7
        for sign, name in ((1, "tv_deriv_pos"), (-1, "tv_deriv_neg")):
            fd = (tv(sign * h) - tv(0.0)) / h
            assert math.isclose(float(getattr(s, name)[row]), fd, rel_tol=1e-4, abs_tol=1e-7), name


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_low_precision_logits_compute_in_float32(dtype):
    case = make_case(3, vocab=128, k=8)
    logits = case.logits.to(dtype)
    s = compute_token_stats(logits, case.sampled, case.topk_ids, case.topk_logp, case.mu_logp)
    assert s.kl_topk.dtype == torch.float32
    ref = compute_token_stats(
        logits.double(), case.sampled, case.topk_ids, case.topk_logp, case.mu_logp
    )
    for name in ("kl_topk", "tv_topk", "ddot_agg", "ddot_uni", "ddot_bucket", "ratio", "pi_tail"):
        torch.testing.assert_close(
            getattr(s, name).double(), getattr(ref, name), rtol=2e-4, atol=2e-6
        )


def test_batched_shape_and_padding_positions():
    case = make_case(5, n=12, vocab=80, k=5)
    flat = compute_token_stats(
        case.logits, case.sampled, case.topk_ids, case.topk_logp, case.mu_logp
    )
    batched = compute_token_stats(
        case.logits.view(3, 4, 80),
        case.sampled.view(3, 4),
        case.topk_ids.view(3, 4, 5),
        case.topk_logp.view(3, 4, 5),
        case.mu_logp.view(3, 4),
    )
    assert batched.kl_topk.shape == (3, 4)
    torch.testing.assert_close(batched.ddot_agg.reshape(-1), flat.ddot_agg)


def test_real_qwen_width_few_tokens():
    """V = 151,936 (Qwen3's padded lm-head), float64, against the reference."""
    g = torch.Generator().manual_seed(0)
    n, vocab, k = 3, 151_936, 20
    z = torch.randn(n, vocab, generator=g, dtype=torch.float64) * 3
    mu_logits = z + torch.randn(n, vocab, generator=g, dtype=torch.float64)
    logmu = torch.log_softmax(mu_logits, -1)
    topk_logp, topk_ids = logmu.topk(k, -1)
    sampled = torch.tensor([int(topk_ids[0, 3]), 17, 123_456])
    mu_logp = logmu.gather(1, sampled[:, None]).squeeze(1)
    s = compute_token_stats(z, sampled, topk_ids, topk_logp, mu_logp, inputs=(SECOND_ORDER,))
    for row in range(n):
        ref = token_reference(
            z[row],
            int(sampled[row]),
            float(mu_logp[row]),
            topk_ids[row].tolist(),
            topk_logp[row].tolist(),
        )
        for name in ("kl_topk", "ddot_agg", "ddot_uni", "ddot_bucket", "pi_tail", "var_v"):
            assert math.isclose(
                float(getattr(s, name)[row]), ref[name], rel_tol=1e-9, abs_tol=1e-13
            )
    assert int(s.support_size[0]) == 20 and int(s.support_size[1]) == 21


def test_invalid_slots_never_nan():
    case = make_case(1, vocab=32, k=5)
    case.topk_logp[:, :] = -torch.inf  # every top-K slot invalid: support = {k}
    s = compute_token_stats(case.logits, case.sampled, case.topk_ids, case.topk_logp, case.mu_logp)
    for name, value in s.tensors().items():
        assert not torch.isnan(value).any(), name
    assert bool((s.support_size == 1).all())


def test_out_of_range_ids_are_rejected():
    case = make_case(2, vocab=32, k=5)
    case.topk_ids[0, 0] = 32
    with pytest.raises(ValueError, match="logits width"):
        compute_token_stats(case.logits, case.sampled, case.topk_ids, case.topk_logp, case.mu_logp)


def test_overwrite_support_mode_has_k_slots():
    case = make_case(0, vocab=64, k=5, corrupt=False)
    s = compute_token_stats(
        case.logits, case.sampled, case.topk_ids, case.topk_logp, case.mu_logp, support="overwrite"
    )
    assert bool((s.support_size == 5).all())
