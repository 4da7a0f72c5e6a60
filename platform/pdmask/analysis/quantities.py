"""Per-token quantities of the analysed minibatch and each direction test's decision on them.

For every response token: ``D_t`` (top-K KL, the proximity statistic), ``r_t``, the advantage, the
three top-K estimators of ``Ddot`` from the math API and the exact full-vocabulary ``Ddot`` (known
here because the sim keeps the behaviour distribution whole), and ``2nd``, the second-order
prediction of ``pdm-2nd`` (``t Ddot_agg + t^2/2 var_v_agg``, ``t = eta A``, ``eta`` its default:
``SECOND_ORDER_ETA``). A token is *out of region* when
``D_t > delta`` and ``A_t != 0``. Each direction test predicts whether the token's own update
pushes ``D_t`` up; a test's mask zeroes exactly the out-of-region tokens it predicts to grow, as the
methods do (``dppo-topk-kl`` = ``ratio``, ``pdm-agg`` = ``agg``, ...; ``exact`` is the oracle no
trainer has, ``none`` keeps everything and serves as the reference step).

Kernel-aware tests (``pdmask.trust_region.kernel``), on the out-of-region tokens:

- ``gram``: the output-embedding kernel term ``gram_agg`` alone (``K_h = c I`` with c large);
- ``kernel``: ``|h|^2 Ddot_agg + c gram_agg``, c fitted per minibatch by least squares on a
  sample of ``KERNEL_FIT_TOKENS`` tokens' exact own-gradient predictions (what the layers below
  the lm head add: ``own - |h|^2 Ddot_bucket``, Ddot_bucket being the exact derivative of the
  measured D_t along v), clamped at 0 (``K_h`` is positive semi-definite);
- ``own`` / ``own-adam``: the exact own-gradient prediction through the whole network, plain and
  AdamW-preconditioned (``own_gradient``): the ceiling of every direction test.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pdmask.analysis.own_gradient import OWN_TESTS, own_gradient_predictions
from pdmask.trust_region import KernelTerms, TokenStats, direction_test, proximity_test
from pdmask.trust_region.stats import SECOND_ORDER

FREE_LOGIT_TESTS = ("ratio", "agg", "uni", "bucket", "2nd", "exact")
"""The ratio test, the three top-K estimators of Ddot, the second-order prediction and the exact
derivative."""
SECOND_ORDER_ETA = 0.1  # = recipes/pdm_2nd.py's default eta (tests/analysis checks)
KERNEL_TESTS = ("gram", "kernel", *OWN_TESTS)
"""The tests that see the network (module docstring)."""
TESTS = FREE_LOGIT_TESTS + KERNEL_TESTS
"""Every direction test compared."""
PREDICTIVE = TESTS[1:]
KERNEL_FIT_TOKENS = 32  # out-of-region tokens whose exact prediction fits the kernel's scale c
KEEP_ALL = "none"
API_DIRECTION = {"ratio": "ratio", "agg": "ddot_agg", "uni": "ddot_uni", "bucket": "ddot_bucket"}


@dataclass
class TokenQuantities:
    """``[n, R]`` tensors over the analysed minibatch (padding excluded by ``valid``)."""

    valid: torch.Tensor
    advantages: torch.Tensor
    kl_topk: torch.Tensor  # D_t
    kl_full: torch.Tensor  # exact KL(mu || pi) over the vocabulary (reference only)
    ratio: torch.Tensor
    ddot: dict[str, torch.Tensor]  # agg, uni, bucket (top-K estimators), exact
    grows: dict[str, torch.Tensor]  # per test: predicted that the token's update raises D_t
    out_of_region: torch.Tensor
    kernel_scale: float | None = None  # the fitted c of the ``kernel`` test (None: not measured)

    def mask(self, test: str) -> torch.Tensor:
        """The test's mask (True = gradient zeroed); ``none`` masks nothing."""
        if test == KEEP_ALL:
            return torch.zeros_like(self.out_of_region)
        return self.out_of_region & self.grows[test]

    def kept(self, test: str) -> torch.Tensor:
        """Out-of-region tokens the test lets update."""
        return self.out_of_region & ~self.mask(test)

    def disagree(self, test: str, baseline: str = "ratio") -> torch.Tensor:
        """Out-of-region tokens on which ``test`` and ``baseline`` decide differently."""
        return self.out_of_region & (self.grows[test] != self.grows[baseline])


@torch.no_grad()
def token_quantities(
    stats: TokenStats,
    exact_kl: torch.Tensor,
    exact_ddot: torch.Tensor,
    advantages: torch.Tensor,
    valid: torch.Tensor,
    delta: float,
) -> TokenQuantities:
    """Assemble the quantities and the tests' predictions from the math API's statistics."""
    valid = valid.bool()
    adv = advantages.to(stats.ratio.dtype)
    grows = {name: direction_test(api, stats, adv) for name, api in API_DIRECTION.items()}
    # pdm-2nd's prediction t Ddot_agg + t^2/2 var_v_agg, per unit of t = eta A: A * it > 0 iff
    # the prediction is (so it reads like the derivatives: A * value > 0 means "grows")
    second = stats.ddot_agg + 0.5 * SECOND_ORDER_ETA * adv * stats.var_v_agg
    grows["2nd"] = adv * second > 0
    grows["exact"] = adv * exact_ddot.to(adv.dtype) > 0
    outside = proximity_test("kl_topk", stats, adv, delta=delta)
    return TokenQuantities(
        valid=valid,
        advantages=adv,
        kl_topk=stats.kl_topk.detach(),
        kl_full=exact_kl,
        ratio=stats.ratio.detach(),
        ddot={
            "agg": stats.ddot_agg.detach(),
            "uni": stats.ddot_uni.detach(),
            "bucket": stats.ddot_bucket.detach(),
            "2nd": second,
            "exact": exact_ddot,
        },
        grows={k: v & valid for k, v in grows.items()},
        out_of_region=valid & outside & (adv != 0),
    )


def measure_tokens(
    setup, index: torch.Tensor, delta: float, *, kernel: bool = True
) -> TokenQuantities:
    """The quantities of sequences ``index`` at the trainer's current parameters; ``kernel``:
    with the kernel-aware tests (per-token backward passes on the out-of-region tokens)."""
    with torch.no_grad():
        logits, hidden = setup.logits_and_hidden(index)
        exact = setup.exact(logits, index)
        q = token_quantities(
            setup.stats(logits, index, inputs=(SECOND_ORDER,)),
            exact.kl,
            exact.ddot,
            setup.advantages[index],
            setup.valid[index],
            delta,
        )
        if not kernel:
            return q
        terms = setup.kernel(logits, hidden, index)
    own = own_gradient_predictions(setup, index, q.out_of_region)
    return with_kernel_tests(q, terms, own)


def fit_kernel_scale(residual: torch.Tensor, gram: torch.Tensor) -> float:
    """Least-squares ``c`` of ``residual ~ c gram`` (float64 sums), clamped at 0."""
    residual, gram = residual.double(), gram.double()
    denominator = float((gram * gram).sum())
    if denominator == 0:
        return 0.0
    return max(0.0, float((residual * gram).sum()) / denominator)


def with_kernel_tests(
    q: TokenQuantities, terms: KernelTerms, own: dict[str, torch.Tensor]
) -> TokenQuantities:
    """``q`` with the kernel-aware tests added (module docstring); ``own`` holds the exact
    predictions on the out-of-region tokens (NaN elsewhere)."""
    positions = q.out_of_region.nonzero()
    fit = positions[torch.randperm(len(positions), generator=torch.Generator().manual_seed(0))]
    rows, cols = fit[:KERNEL_FIT_TOKENS].unbind(1)
    head = terms.head.to(q.advantages.dtype)
    gram = terms.gram.to(q.advantages.dtype)
    residual = own["own"][rows, cols] - (head * q.ddot["bucket"])[rows, cols].double()
    c = fit_kernel_scale(residual, gram[rows, cols])
    estimates = {"gram": gram, "kernel": terms.combined(q.ddot["agg"], c).to(gram.dtype), **own}
    for name, value in estimates.items():
        value = value.to(q.advantages.dtype)
        q.ddot[name] = value
        q.grows[name] = (q.advantages * value > 0) & q.valid & ~value.isnan()
    q.kernel_scale = c
    return q
