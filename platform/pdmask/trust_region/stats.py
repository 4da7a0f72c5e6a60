"""Per-token statistics of the trust region: divergences, ratio, directional derivatives.

See the package docstring for the formulas. Everything here is computed in float32 (float64 for
float64 logits) from the chunked logits pass plus ``O(N * (K+1))`` work on the support. On a GPU
the same formulas run inside the pass's Triton kernel (``triton_stats``: one kernel each way),
held to the same float64 reference by the tests.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, fields, replace

import torch

from pdmask.trust_region import logits_pass
from pdmask.trust_region.kernel import KernelTerms
from pdmask.trust_region.logits_pass import chunked_logits_pass, compute_dtype
from pdmask.trust_region.support import SupportMode, build_support
from pdmask.trust_region.vocab_parallel import VocabShard, vocab_parallel_logits_pass

ENTROPY = "entropy"
"""``Recipe.needs`` name: per-token entropy of pi, differentiable (``RecipeBatch.entropy``)."""
SUPPORT_LOG_PROBS = "support_log_probs"
"""``Recipe.needs`` name: log pi over ``S = TopK(mu) ∪ {y}`` and the tail's mass, differentiable
(``RecipeBatch.support``)."""
SECOND_ORDER = "second_order"
"""``Recipe.needs`` name: the second-order statistics of the step along ``v = e_k - pi``
(``stats.tail_sum_cube`` and ``stats.var_v``, ``var_v_agg``, ``var_v_uni``, ``var_v_bucket``,
detached): the tail's sum of ``pi**3`` comes out of the same pass over the logits."""
OUTPUT_KERNEL = "output_kernel"
"""``Recipe.needs`` name: ``|h|^2`` and the output-embedding kernel term per token
(``stats.kernel``, detached; ``pdmask.trust_region.kernel``). A backend computes it from the lm
head's input and weight, which it must hand over (``kernel_terms``); not a pass output."""
GRADIENT_INPUTS = (ENTROPY, SUPPORT_LOG_PROBS)
"""The differentiable inputs the chunked logits pass computes on request (registry: KNOWN_INPUTS)."""
PASS_INPUTS = {ENTROPY: "entropy", SUPPORT_LOG_PROBS: "support", SECOND_ORDER: "var_v"}
"""Every input the logits pass computes on request, and the ``TokenStats`` field that holds it
(None when not asked for)."""


@dataclass
class SupportLogProbs:
    """pi and mu over the support ``S`` (``[..., M]``, ``M = K + 1`` slots) and its tail.

    ``log_prob`` and ``tail_mass`` carry a gradient to the logits (``d log pi_s/dz = e_s - pi``,
    ``dT/dz_j = pi_j (1[j not in S] - T)``): a recipe can build an exact divergence over
    ``S`` plus one tail bucket and differentiate it. Invalid slots (a missing top-K entry, the
    sampled token when it is among the top-K) hold the sampled id and ``-inf`` log-probs.
    """

    ids: torch.Tensor  # [..., M] long vocabulary ids
    valid: torch.Tensor  # [..., M] bool, True on the slots of S
    log_prob: torch.Tensor  # [..., M] log pi at ids, -inf on invalid slots (differentiable)
    mu_log_prob: torch.Tensor  # [..., M] log mu at ids, -inf on invalid slots
    tail_mass: torch.Tensor  # [...] pi's mass outside S, exact (differentiable)
    mu_tail_mass: torch.Tensor  # [...] mu's mass outside S

    def detached(self) -> SupportLogProbs:
        return replace(self, log_prob=self.log_prob.detach(), tail_mass=self.tail_mass.detach())

    def to(self, dtype: torch.dtype) -> SupportLogProbs:
        """Every float field in ``dtype`` (differentiable: the gradient flows through the cast)."""
        return replace(
            self,
            log_prob=self.log_prob.to(dtype),
            mu_log_prob=self.mu_log_prob.to(dtype),
            tail_mass=self.tail_mass.to(dtype),
            mu_tail_mass=self.mu_tail_mass.to(dtype),
        )


@dataclass
class TokenStats:
    """Per-token trust-region statistics, each shaped like ``sampled_ids``.

    ``logp`` carries a gradient (to the logits), and so do ``entropy`` and ``support`` when they
    were asked for (``compute_token_stats(inputs=...)``); everything else is detached.
    """

    logp: torch.Tensor  # log pi(y_t): differentiable
    mu_logp: torch.Tensor  # log mu(y_t), the behaviour log-prob of the sampled token
    ratio: torch.Tensor  # r_t = pi(y_t) / mu(y_t)
    kl_topk: torch.Tensor  # D_t = KL_topK(mu || pi) over S plus one tail bucket
    tv_topk: torch.Tensor  # TV_topK(mu, pi) over S plus one tail bucket
    kl_binary: torch.Tensor  # KL over {y_t, rest}
    tv_binary: torch.Tensor  # TV over {y_t, rest} = |pi_k - mu_k|
    local_term: torch.Tensor  # pi_k - mu_k (sign = sign(r - 1))
    global_agg: torch.Tensor  # sum_S pi_i(mu_i - pi_i) + pi_tail (mu_tail - pi_tail)
    global_uni: torch.Tensor  # ... + pi_tail (mu_tail - pi_tail) / (n - m)
    global_bucket: (
        torch.Tensor
    )  # ... + rho_tail (mu_tail - pi_tail), rho_tail = sum_tail pi^2 / pi_tail
    ddot_agg: torch.Tensor  # local_term + global_agg
    ddot_uni: torch.Tensor  # local_term + global_uni
    ddot_bucket: torch.Tensor  # local_term + global_bucket
    tv_deriv_pos: torch.Tensor  # one-sided derivative of TV_topK along +v (used when A > 0)
    tv_deriv_neg: torch.Tensor  # one-sided derivative of TV_topK along -v (used when A < 0)
    mu_tail: torch.Tensor  # max(0, -expm1(logsumexp(log mu_S)))
    pi_tail: torch.Tensor  # sum of pi outside S (exact)
    mu_topk_mass: torch.Tensor  # sum_S mu_i
    pi_topk_mass: torch.Tensor  # sum_S pi_i
    support_size: torch.Tensor  # m = |S| (long)
    sum_pi_sq: torch.Tensor  # sum over the whole vocabulary of pi_i^2
    vocab_size: int  # n, the logits width
    token_id: torch.Tensor | None = None  # y_t, the sampled token's id (long)
    # Second order (inputs: "second_order"; see compute_token_stats), detached:
    tail_sum_cube: torch.Tensor | None = None  # sum over the tail (ids off S) of pi_j^3
    var_v: torch.Tensor | None = None  # Var_pi(v): the full KL's second derivative along v
    var_v_agg: torch.Tensor | None = None  # Var of v with the tail as one token (pairs ddot_agg)
    var_v_uni: torch.Tensor | None = None  # ... the tail spread evenly over n - m (ddot_uni)
    var_v_bucket: torch.Tensor | None = None  # D_t's exact second derivative (ddot_bucket)
    entropy: torch.Tensor | None = None  # H(pi_t), differentiable (inputs: "entropy")
    support: SupportLogProbs | None = None  # pi and mu over S (inputs: "support_log_probs")
    kernel: KernelTerms | None = None  # |h|^2 and gram_agg (inputs: "output_kernel", detached)

    def detached(self) -> TokenStats:
        """The same statistics without any gradient (what a recipe's ``batch.stats`` holds)."""
        entropy = None if self.entropy is None else self.entropy.detach()
        support = None if self.support is None else self.support.detached()
        return replace(self, logp=self.logp.detach(), entropy=entropy, support=support)

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every per-token tensor by name (the optional ones only when computed)."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                out[f.name] = value
        return out


def _xlogy_ratio(p: torch.Tensor, logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """``p * (log p - log q)`` with ``0 * log 0 = 0`` (no NaN when p == 0)."""
    return torch.where(p > 0, p * (logp - logq), torch.zeros_like(p))


def _safe_log(x: torch.Tensor) -> torch.Tensor:
    """log clamped at the dtype's smallest normal: a vanished tail gives a huge, finite D."""
    return x.clamp_min(torch.finfo(x.dtype).tiny).log()


def _sign_beyond_rounding(
    a: torch.Tensor, b: torch.Tensor, scale: torch.Tensor | float
) -> torch.Tensor:
    """sign(a - b), but 0 where a and b agree to a few ulps of ``scale``: a kink of |a - b| is then
    decided the same way whether mu and pi were computed along the same path or not (mu == pi).
    Tail masses come from ``1 - mass``, so their rounding is in units of the total mass (1)."""
    tol = 8 * torch.finfo(a.dtype).eps * scale
    return torch.where((a - b).abs() <= tol, torch.zeros_like(a), torch.sign(a - b))


def compute_token_stats(
    logits: torch.Tensor,
    sampled_ids: torch.Tensor,
    mu_topk_ids: torch.Tensor | None,
    mu_topk_logprobs: torch.Tensor | None,
    mu_sampled_logprob: torch.Tensor,
    *,
    chunk_size: int | None = None,
    support: SupportMode = "union",
    inputs: Collection[str] = (),
    shard: VocabShard | None = None,
) -> TokenStats:
    """All per-token statistics in one call.

    Shapes: ``logits [..., V]``, ``sampled_ids [...]``, ``mu_topk_ids / mu_topk_logprobs [..., K]``
    (``None`` for K = 0: support ``{y_t}`` plus one bucket), ``mu_sampled_logprob [...]``.
    Returns statistics shaped ``[...]``. Padding positions are computed like any other token;
    mask them out downstream. ``inputs``: which of :data:`PASS_INPUTS` to compute as well
    (a recipe's ``needs``; other names are ignored). ``shard``: ``logits`` are this rank's
    columns of a vocabulary split over a tensor-parallel group (``vocab_parallel``); the ids are
    global, and every statistic is the full vocabulary's, the same on every rank of the group.
    An id at or beyond the logits' width raises ``ValueError`` on the chunked pass; the fused GPU
    kernels never read it and treat it as an invalid slot, so a caller on a GPU checks the ids
    where they enter (:func:`~pdmask.trust_region.support.check_topk_ids`, as the VeRL worker
    does once per step) rather than inside the pass.

    Second order (``inputs`` has :data:`SECOND_ORDER`): along ``v = e_k - pi``,
    ``E_pi[v] = pi_k - sum pi^2`` and ``E_pi[v^2] = pi_k - 2 pi_k^2 + sum pi^3``. The tail's sums
    ``c2 = sum_{j not in S} pi_j^2`` and ``c3 = sum_{j not in S} pi_j^3`` are exact (the pass);
    each form replaces them as its ``ddot_*`` does, so that ``t ddot_X + t^2/2 var_v_X`` is the
    second-order change of one divergence:

    - ``var_v``: ``Var_pi(v)`` with the exact sums, the full KL's second derivative (mu-free);
    - ``var_v_agg``: the tail as one token of mass ``pi_tail`` (``c2 = pi_tail^2``,
      ``c3 = pi_tail^3``): ``Var(v)`` of the collapsed distribution, whose KL derivative is
      ``ddot_agg``;
    - ``var_v_uni``: the tail as ``n - m`` equal tokens (``c2 = pi_tail^2 / (n - m)``,
      ``c3 = pi_tail^3 / (n - m)^2``), pairing ``ddot_uni``;
    - ``var_v_bucket``: the exact second derivative of ``D_t = KL_topK`` along ``v``, pairing
      ``ddot_bucket``: ``Var_pi(v) - mu_tail (c3 / pi_tail - (c2 / pi_tail)^2)``, the tail
      bucket losing its internal variance (``mu_S + mu_tail = 1``, as ``ddot_bucket``
      assumes). Unlike the others it can be negative: ``D_t`` is not convex along ``v``.
    """
    if logits.dim() < 1 or logits.shape[:-1] != sampled_ids.shape:
        raise ValueError(
            f"logits {tuple(logits.shape)} must be sampled_ids {tuple(sampled_ids.shape)} + [V]"
        )
    batch_shape = sampled_ids.shape
    vocab = logits.shape[-1] if shard is None else shard.vocab_size
    cdt = compute_dtype(logits.dtype)
    flat_logits = logits.reshape(-1, logits.shape[-1])
    sampled = sampled_ids.reshape(-1).long()
    topk_ids = None if mu_topk_ids is None else mu_topk_ids.reshape(sampled.shape[0], -1)
    topk_lp = None if mu_topk_logprobs is None else mu_topk_logprobs.reshape(sampled.shape[0], -1)

    # On a GPU the kernels compute the statistics themselves (the kernel reads mu's log-probs in
    # their own dtype); elsewhere the torch ops below, on the pass's outputs.
    kernels = logits_pass.fused_kernels(flat_logits, chunk_size)
    if kernels is not None and kernels.FUSED_STATISTICS and shard is None and support == "union":
        return _fused_stats(
            flat_logits, sampled, topk_ids, topk_lp, mu_sampled_logprob.reshape(-1), vocab,
            batch_shape, inputs,
        )  # fmt: skip
    mu_k_logp = mu_sampled_logprob.reshape(-1).to(cdt)
    zero = torch.zeros((), dtype=cdt, device=flat_logits.device)
    sup = build_support(sampled, mu_k_logp, topk_ids, topk_lp, vocab, mode=support, dtype=cdt)
    second_order = SECOND_ORDER in inputs
    options = dict(
        chunk_size=chunk_size,
        second_order=second_order,
        entropy=ENTROPY in inputs,
        support_grad=SUPPORT_LOG_PROBS in inputs,
    )
    if shard is None:
        lp = chunked_logits_pass(flat_logits, sampled, sup.ids, **options)
    else:
        lp = vocab_parallel_logits_pass(flat_logits, sampled, sup.ids, shard, **options)
    valid = sup.valid

    # Support probabilities (0 on invalid slots); the statistics never carry their gradient.
    logpi_s_grad = torch.where(valid, lp.logp_support, -torch.inf)
    logpi_s = logpi_s_grad.detach()
    logmu_s = sup.mu_logp
    pi_s = logpi_s.exp()
    mu_s = logmu_s.exp()
    mu_mass = mu_s.sum(-1)
    pi_mass = pi_s.sum(-1)
    mu_tail = (-torch.special.expm1(torch.logsumexp(logmu_s, dim=-1))).clamp_min(0.0)
    # An empty tail (m = n) holds nothing; what -expm1 leaves there is rounding, not mass.
    mu_tail = torch.where(sup.size >= vocab, zero, mu_tail)
    pi_tail = lp.tail_mass.detach()

    # Divergences over S plus one tail bucket.
    kl_topk = torch.where(valid, _xlogy_ratio(mu_s, logmu_s, logpi_s), zero).sum(-1)
    kl_topk = kl_topk + _xlogy_ratio(mu_tail, _safe_log(mu_tail), _safe_log(pi_tail))
    tv_topk = 0.5 * ((mu_s - pi_s).abs().sum(-1) + (mu_tail - pi_tail).abs())

    # Binary view {k, rest}.
    logp = lp.logp_sampled  # differentiable
    logp_d = logp.detach()
    pi_k = logp_d.exp()
    mu_k = mu_k_logp.exp()
    # 1 - p as -expm1(log p): no cancellation for confident tokens (p close to 1).
    rest_mu = -torch.special.expm1(mu_k_logp)
    # pi's mass off k as a sum of positive terms (tail + the rest of S): exact even when pi_k ~ 1.
    is_k = sup.ids == sampled[:, None]
    pi_rest = pi_tail + torch.where(valid & ~is_k, pi_s, zero).sum(-1)
    log_rest_pi = _safe_log(pi_rest)
    kl_binary = _xlogy_ratio(mu_k, mu_k_logp, logp_d) + _xlogy_ratio(
        rest_mu, _safe_log(rest_mu), log_rest_pi
    )
    tv_binary = (pi_k - mu_k).abs()
    ratio = (logp_d - mu_k_logp).exp()

    # First-order direction: Ddot = (pi_k - mu_k) + sum_i pi_i (mu_i - pi_i), estimated on S + tail.
    local = pi_k - mu_k
    sigma = torch.where(valid, pi_s * (mu_s - pi_s), zero).sum(-1)
    tail_gap = mu_tail - pi_tail
    unseen = (vocab - sup.size).to(cdt)
    global_agg = sigma + pi_tail * tail_gap
    global_uni = sigma + torch.where(unseen > 0, pi_tail * tail_gap / unseen.clamp_min(1), zero)
    rho_tail = torch.where(
        pi_tail > 0, lp.tail_sum_sq / pi_tail.clamp_min(torch.finfo(cdt).tiny), zero
    )
    global_bucket = sigma + rho_tail * tail_gap

    # TV derivative along +-v: dpi_i = pi_i (v_i - vbar), vbar = pi_k - sum pi^2.
    sum_pi_sq = (pi_s * pi_s).sum(-1) + lp.tail_sum_sq
    vbar = pi_k - sum_pi_sq
    v_s = is_k.to(cdt) - pi_s
    dpi_s = torch.where(valid, pi_s * (v_s - vbar[:, None]), zero)
    dpi_tail = -lp.tail_sum_sq - pi_tail * vbar
    sign_s = _sign_beyond_rounding(pi_s, mu_s, torch.maximum(pi_s, mu_s))
    sign_tail = _sign_beyond_rounding(pi_tail, mu_tail, 1.0)
    smooth = (sign_s * dpi_s).sum(-1) + sign_tail * dpi_tail
    # A bucket exactly at a kink (pi_i == mu_i) contributes |dpi_i| in either direction.
    kink = torch.where(valid & (sign_s == 0), dpi_s.abs(), zero).sum(-1)
    kink = kink + torch.where(sign_tail == 0, dpi_tail.abs(), zero)
    tv_deriv_pos = 0.5 * (smooth + kink)
    tv_deriv_neg = 0.5 * (-smooth + kink)

    second = {}
    if second_order:
        second = _second_order(pi_k, pi_s, valid, pi_tail, mu_tail, rho_tail, unseen, lp)

    def shaped(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.reshape(batch_shape)

    def slots(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(*batch_shape, t.shape[-1])

    support_view = None
    if SUPPORT_LOG_PROBS in inputs:
        support_view = SupportLogProbs(
            ids=slots(sup.ids),
            valid=slots(valid),
            log_prob=slots(logpi_s_grad),
            mu_log_prob=slots(logmu_s),
            tail_mass=shaped(lp.tail_mass),
            mu_tail_mass=shaped(mu_tail),
        )

    return TokenStats(
        logp=shaped(logp),
        mu_logp=shaped(mu_k_logp),
        ratio=shaped(ratio),
        kl_topk=shaped(kl_topk),
        tv_topk=shaped(tv_topk),
        kl_binary=shaped(kl_binary),
        tv_binary=shaped(tv_binary),
        local_term=shaped(local),
        global_agg=shaped(global_agg),
        global_uni=shaped(global_uni),
        global_bucket=shaped(global_bucket),
        ddot_agg=shaped(local + global_agg),
        ddot_uni=shaped(local + global_uni),
        ddot_bucket=shaped(local + global_bucket),
        tv_deriv_pos=shaped(tv_deriv_pos),
        tv_deriv_neg=shaped(tv_deriv_neg),
        mu_tail=shaped(mu_tail),
        pi_tail=shaped(pi_tail),
        mu_topk_mass=shaped(mu_mass),
        pi_topk_mass=shaped(pi_mass),
        support_size=shaped(sup.size),
        sum_pi_sq=shaped(sum_pi_sq),
        vocab_size=vocab,
        token_id=sampled.reshape(batch_shape),
        **{name: shaped(value) for name, value in second.items()},
        entropy=shaped(lp.entropy),
        support=support_view,
    )


def _fused_stats(logits, sampled, topk_ids, topk_lp, mu_k, vocab, batch_shape, inputs):
    """``compute_token_stats`` by the kernels' own statistics (``triton_stats``: one kernel
    forward, one backward, nothing read back to the host). An id at or beyond the
    logits' width is an invalid slot here: ``support.check_topk_ids`` runs where the ids enter
    (the VeRL worker, once per step), not inside the pass."""
    if topk_ids is not None and topk_ids.shape[-1] > 0:
        if topk_lp is None or topk_lp.shape != topk_ids.shape:
            raise ValueError("mu_topk_logprobs must be given with the same shape as mu_topk_ids")
    else:
        topk_ids = topk_lp = None
    from .triton_stats import fused_token_stats  # imports triton: only where the kernels run

    out = fused_token_stats(
        logits, sampled, topk_ids, topk_lp, mu_k,
        second_order=SECOND_ORDER in inputs, entropy=ENTROPY in inputs,
        support_grad=SUPPORT_LOG_PROBS in inputs,
    )  # fmt: skip

    def shaped(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.reshape(*batch_shape, *t.shape[1:])

    support_view = None
    if SUPPORT_LOG_PROBS in inputs:
        support_view = SupportLogProbs(
            ids=shaped(out.pop("support_ids")),
            valid=shaped(out.pop("support_valid")),
            log_prob=shaped(out.pop("support_log_prob")),
            mu_log_prob=shaped(out.pop("support_mu_log_prob")),
            tail_mass=shaped(out.pop("tail_mass")),
            mu_tail_mass=shaped(out["mu_tail"]),
        )
    names = {f.name for f in fields(TokenStats)}
    per_token = {name: shaped(value) for name, value in out.items() if name in names}
    return TokenStats(
        **per_token, vocab_size=vocab, token_id=sampled.reshape(batch_shape), support=support_view
    )


def _second_order(pi_k, pi_s, valid, pi_tail, mu_tail, rho_tail, unseen, lp) -> dict:
    """The second-order statistics (see :func:`compute_token_stats`), flat ``[N]`` each."""
    zero = torch.zeros((), dtype=pi_k.dtype, device=pi_k.device)
    on_s = torch.where(valid, pi_s, zero)
    sq_s, cube_s = (on_s * on_s).sum(-1), (on_s * on_s * on_s).sum(-1)
    c2, c3 = lp.tail_sum_sq, lp.tail_sum_cube

    def variance(tail_sq: torch.Tensor, tail_cube: torch.Tensor) -> torch.Tensor:
        mean = pi_k - sq_s - tail_sq
        # >= 0 exactly (a variance); clamp what cancellation leaves below zero for peaked pi.
        return (pi_k - 2 * pi_k * pi_k + cube_s + tail_cube - mean * mean).clamp_min(0.0)

    spread = unseen.clamp_min(1)
    some = unseen > 0
    var_v = variance(c2, c3)
    # The tail bucket's own variance of pi_j under q_j = pi_j / pi_tail (>= 0: Cauchy-Schwarz).
    inside = torch.where(
        pi_tail > 0,
        c3 / pi_tail.clamp_min(torch.finfo(pi_k.dtype).tiny) - rho_tail * rho_tail,
        zero,
    ).clamp_min(0.0)
    return {
        "tail_sum_cube": c3,
        "var_v": var_v,
        "var_v_agg": variance(pi_tail * pi_tail, pi_tail * pi_tail * pi_tail),
        "var_v_uni": variance(
            torch.where(some, pi_tail * pi_tail / spread, zero),
            torch.where(some, pi_tail * pi_tail * pi_tail / (spread * spread), zero),
        ),
        "var_v_bucket": var_v - mu_tail * inside,
    }
