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
    var_v_X     = the second derivative of the divergence Ddot_X differentiates: the tail as one
                  token (agg), as n - m equal tokens (uni), D_t exactly (bucket: Var_pi(v) less
                  mu_tail times the tail's internal variance of pi; needs sum_{j∉S} pi_j^3)
    dTV(±v)     = 1/2 (sum_S sgn(pi_i - mu_i) dpi_i + sgn(pi_tail - mu_tail) dpi_tail) * (±1),
                  dpi_i = pi_i (v_i - vbar), vbar = pi_k - sum pi^2, dpi_tail = -sum_{j∉S} pi_j^2 - pi_tail vbar,
                  a bucket at a kink (pi_i = mu_i) contributing |dpi_i|

Direction tests are strict, so A = 0 is never masked. A method masks a token (True = gradient
zeroed) when a proximity test AND a direction test hold; ``PROXIMITY_TESTS`` and ``DIRECTION_TESTS``
hold the building blocks by name (``kl_topk``, ``ratio``, ``ddot_agg``, ...), ``composed_mask``
combines two::

    ratio      r < 1-eps_low or r > 1+eps_high        ratio       A (r - 1) > 0
    kl_binary  KL_bin > delta                          ddot_agg    A Ddot_agg > 0
    tv_binary  TV_bin > delta                          ddot_uni    A Ddot_uni > 0
    kl_topk    D > delta                               ddot_bucket A Ddot_bucket > 0
    tv_topk    TV_topK > delta                         tv_deriv    dTV(sign(A) v) > 0

Which methods exist is not the math API's business: each is a file in the project's ``recipes/``
(``pdmask.registry``), which composes two tests or brings its own mask and/or per-token loss over
one documented object, :class:`RecipeBatch` (``contract``). ``apply_method`` runs a
:class:`Method` (hooks with parameters bound) on a micro-batch; every backend calls it.

Loss: by default ``-M r A`` per token (``M = 1 - mask``; gradient through ``r`` only; optional cap
``min(r, C)``), aggregated with verl's modes (``token-mean``, ``seq-mean-token-sum``,
``seq-mean-token-mean``, ``seq-mean-token-sum-norm``, ``token-sum``).

Numerics: computed in float32 from bf16/fp16/fp32 logits and in float64 from float64 logits. The
logits are read in row chunks; no ``[N, V]`` float32 copy is ever made (extra memory
``O(chunk * V + N * K)``). ``n`` is ``logits.shape[-1]`` (the padded lm-head width).

Typical use (``method`` from a recipe: ``load_registry().recipes[name].method(params)``)::

    stats = compute_token_stats(logits, ids, mu_topk_ids, mu_topk_logprobs, mu_logp)
    out = apply_method(method, stats, advantages, response_mask, backend="sim")
    loss = aggregate_loss(out.token_loss, response_mask)

With mu known over the whole vocabulary, ``exact_divergence(logits, mu_logprobs, ids)`` gives the
exact KL and ``Ddot`` that the top-K estimators approximate (diagnostics, analysis).

Beyond ``Ddot`` (``kernel``): a real update moves parameters, not logits. With the lm head's input
``h`` and weight ``W`` (rows the output embeddings), ``kernel_terms`` gives ``|h|^2`` (the lm head's
share of the token's own-gradient change of D is ``|h|^2 Ddot``) and the output-embedding kernel
term ``gram_agg = <W^T u_agg, w_k - W^T pi>`` (the layers below, with ``K_h = c I``);
``exact_gram`` is its full-vocabulary form.
"""

from pdmask.trust_region.contract import RECIPE_METRIC_PREFIX, RecipeBatch
from pdmask.trust_region.diagnostics import DISAGREEMENTS, diagnostics
from pdmask.trust_region.exact import ExactDivergence, exact_divergence, exact_gram
from pdmask.trust_region.hooks import (
    LossHook,
    MaskHook,
    Method,
    MethodOutput,
    apply_method,
    hook_output_problem,
)
from pdmask.trust_region.kernel import KernelTerms, kernel_terms
from pdmask.trust_region.loss import AGG_MODES, aggregate_loss, per_token_loss, ratio_loss
from pdmask.trust_region.methods import (
    DIRECTION_TESTS,
    PROXIMITY_TESTS,
    composed_mask,
    direction_test,
    proximity_test,
)
from pdmask.trust_region.policy_loss import PolicyLossResult, policy_loss
from pdmask.trust_region.stats import TokenStats, compute_token_stats
from pdmask.trust_region.support import SENTINEL_THRESHOLD

__all__ = [
    "AGG_MODES",
    "DIRECTION_TESTS",
    "DISAGREEMENTS",
    "PROXIMITY_TESTS",
    "SENTINEL_THRESHOLD",
    "ExactDivergence",
    "KernelTerms",
    "LossHook",
    "MaskHook",
    "Method",
    "MethodOutput",
    "PolicyLossResult",
    "RECIPE_METRIC_PREFIX",
    "RecipeBatch",
    "TokenStats",
    "aggregate_loss",
    "apply_method",
    "composed_mask",
    "compute_token_stats",
    "diagnostics",
    "direction_test",
    "exact_divergence",
    "exact_gram",
    "hook_output_problem",
    "kernel_terms",
    "per_token_loss",
    "policy_loss",
    "proximity_test",
    "ratio_loss",
]
