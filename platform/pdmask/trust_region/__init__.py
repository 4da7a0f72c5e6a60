r"""The trust-region math of every method: pure torch, no I/O. The only math other parts use.

Notation (paper.md): response token ``y_t = k`` at state ``s_t``; ``pi`` = current policy (full
logits ``z``, width ``n``), ``mu`` = behaviour policy, known only on its top-K ids; advantage ``A``.

Support and tail::

    S        = TopK(mu, K) ∪ {k}                  (m = |S|; invalid/duplicate slots dropped)
    mu_tail  = max(0, -expm1(logsumexp(log mu_S)))  pi_tail = sum_{j ∉ S} pi_j   (exact)

Proximity statistics::

    r        = pi_k / mu_k
    D        = KL_topK = sum_S mu_i log(mu_i/pi_i) + mu_tail log(mu_tail/pi_tail)
    TV_topK  = 1/2 (sum_S |mu_i - pi_i| + |mu_tail - pi_tail|)
    KL_bin   = mu_k log(mu_k/pi_k) + (1-mu_k) log((1-mu_k)/(1-pi_k)),   TV_bin = |pi_k - mu_k|

Direction (derivative of KL(mu || softmax(z + eta v)) at 0, ``v = e_k - pi``)::

    Ddot        = (pi_k - mu_k) + sum_i pi_i (mu_i - pi_i)          local term + global term
    Ddot_agg    = (pi_k - mu_k) + sum_S pi_i (mu_i - pi_i) + pi_tail (mu_tail - pi_tail)
    Ddot_uni    = ... + pi_tail (mu_tail - pi_tail) / (n - m)
    Ddot_bucket = ... + rho_tail (mu_tail - pi_tail),  rho_tail = sum_{j∉S} pi_j^2 / pi_tail
    Var_pi(v)   = sum_i pi_i v_i^2 - (pi_k - sum_i pi_i^2)^2  (second derivative, >= 0)
    dTV(±v)     = 1/2 (sum_S sgn(pi_i - mu_i) dpi_i + sgn(pi_tail - mu_tail) dpi_tail) * (±1),
                  dpi_i = pi_i (v_i - vbar), vbar = pi_k - sum pi^2, dpi_tail = -sum_{j∉S} pi_j^2 - pi_tail vbar,
                  a bucket at a kink (pi_i = mu_i) contributing |dpi_i|

Masks (True = gradient zeroed; strict tests, so A = 0 is never masked)::

    grpo-clip-higher  (r < 1-eps_low or r > 1+eps_high)  and  A (r - 1) > 0
    dppo-binary-kl    KL_bin > delta                       and  A (r - 1) > 0
    dppo-binary-tv    TV_bin > delta                       and  A (r - 1) > 0
    dppo-topk-kl      D > delta                            and  A (r - 1) > 0
    dppo-topk-tv      TV_topK > delta                      and  A (r - 1) > 0
    pdm-agg / -uni / -bucket   D > delta                   and  A Ddot_{agg,uni,bucket} > 0
    pdm-tv            TV_topK > delta                      and  dTV(sign(A) v) > 0

Loss: ``-M r A`` per token (``M = 1 - mask``; gradient through ``r`` only; optional cap ``min(r, C)``),
aggregated with verl's modes (``token-mean``, ``seq-mean-token-sum``, ``seq-mean-token-mean``,
``seq-mean-token-sum-norm``, ``token-sum``).

Numerics: computed in float32 from bf16/fp16/fp32 logits and in float64 from float64 logits. The
logits are read in row chunks; no ``[N, V]`` float32 copy is ever made (extra memory
``O(chunk * V + N * K)``). ``n`` is ``logits.shape[-1]`` (the padded lm-head width).

Typical use::

    stats = compute_token_stats(logits, ids, mu_topk_ids, mu_topk_logprobs, mu_logp)
    mask = method_mask("pdm-agg", stats, advantages, delta=0.15)
    loss = aggregate_loss(per_token_loss(stats.logp, stats.mu_logp, advantages, mask), response_mask)

With mu known over the whole vocabulary, ``exact_divergence(logits, mu_logprobs, ids)`` gives the
exact KL and ``Ddot`` that the top-K estimators approximate (diagnostics, analysis).
"""

from pdmask.trust_region.diagnostics import DISAGREEMENTS, diagnostics
from pdmask.trust_region.exact import ExactDivergence, exact_divergence
from pdmask.trust_region.loss import AGG_MODES, aggregate_loss, per_token_loss
from pdmask.trust_region.methods import (
    DIRECTION_TESTS,
    METHODS,
    PROXIMITY_TESTS,
    MethodSpec,
    composed_mask,
    direction_test,
    get_method,
    method_mask,
    proximity_test,
)
from pdmask.trust_region.policy_loss import PolicyLossResult, policy_loss
from pdmask.trust_region.stats import TokenStats, compute_token_stats
from pdmask.trust_region.support import SENTINEL_THRESHOLD

__all__ = [
    "AGG_MODES",
    "DIRECTION_TESTS",
    "DISAGREEMENTS",
    "METHODS",
    "PROXIMITY_TESTS",
    "SENTINEL_THRESHOLD",
    "ExactDivergence",
    "MethodSpec",
    "PolicyLossResult",
    "TokenStats",
    "aggregate_loss",
    "composed_mask",
    "compute_token_stats",
    "diagnostics",
    "exact_divergence",
    "direction_test",
    "get_method",
    "method_mask",
    "per_token_loss",
    "policy_loss",
    "proximity_test",
]
