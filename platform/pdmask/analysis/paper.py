"""The paper's token-level mechanism table (paper.md), for side-by-side comparison.

Per seed about 1435 out-of-region tokens, about 82 of them decided differently by the ratio and the
divergence test; after one real update the unsafe-keep rate is 36.9 % (ratio) vs 34.2 % (divergence),
38 of 61 seeds favour the divergence test, and the share of kept updates that shrink the divergence
rises from 62.9 % to 65.1 %. The paper does not say which top-K estimator its "divergence test"
row used; agg and uni differ negligibly at its vocabulary size, so both are compared with it.
"""

from __future__ import annotations

from pdmask.analysis.outcomes import sign_test_p

SEEDS = 61
OUT_OF_REGION_PER_SEED = 1435
DISAGREE_PER_SEED = 82
UNSAFE_KEEP = {"ratio": 0.369, "divergence": 0.342}
SHRINK_SHARE = {"ratio": 0.629, "divergence": 0.651}
SEEDS_FAVOURING_DIVERGENCE = 38
# Ties are not reported; assuming none, the two-sided sign test of 38 vs 23 seeds.
SIGN_TEST_P = sign_test_p(SEEDS_FAVOURING_DIVERGENCE, SEEDS - SEEDS_FAVOURING_DIVERGENCE)
