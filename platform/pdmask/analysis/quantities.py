"""Per-token quantities of the analysed minibatch and each direction test's decision on them.

For every response token: ``D_t`` (top-K KL, the proximity statistic), ``r_t``, the advantage, the
three top-K estimators of ``Ddot`` from the math API and the exact full-vocabulary ``Ddot`` (known
here because the sim keeps the behaviour distribution whole). A token is *out of region* when
``D_t > delta`` and ``A_t != 0``. Each direction test predicts whether the token's own update
pushes ``D_t`` up; a test's mask zeroes exactly the out-of-region tokens it predicts to grow, as the
methods do (``dppo-topk-kl`` = ``ratio``, ``pdm-agg`` = ``agg``, ...; ``exact`` is the oracle no
trainer has, ``none`` keeps everything and serves as the reference step).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pdmask.trust_region import TokenStats, direction_test, proximity_test

TESTS = ("ratio", "agg", "uni", "bucket", "exact")
"""Direction tests compared: the ratio test, the three top-K estimators, the exact derivative."""
PREDICTIVE = TESTS[1:]
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
            "exact": exact_ddot,
        },
        grows={k: v & valid for k, v in grows.items()},
        out_of_region=valid & outside & (adv != 0),
    )


@torch.no_grad()
def measure_tokens(setup, index: torch.Tensor, delta: float) -> TokenQuantities:
    """The quantities of sequences ``index`` at the trainer's current parameters."""
    logits = setup.logits(index)
    exact = setup.exact(logits, index)
    return token_quantities(
        setup.stats(logits, index),
        exact.kl,
        exact.ddot,
        setup.advantages[index],
        setup.valid[index],
        delta,
    )
