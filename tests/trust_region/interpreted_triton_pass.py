"""Run pdmask's fused Triton logits pass on CPU in Triton's interpreter and print, as one JSON
line, its largest errors against a float64 reference (``test_triton_pass.py`` asserts on them):
the pass's outputs and gradients, and the second-order statistics ``compute_token_stats`` builds
from them.

A script, not a test: ``TRITON_INTERPRET=1`` must be set before triton is first imported, so it
runs in a fresh process. Each case goes through ``_ChunkedLogitsPass`` with the Triton kernels, the
path a GPU takes, forward and backward; the reference is float64 autograd through plain torch ops
(a log-softmax, a mask of the support, sums) on the same rounded logits.
"""

from __future__ import annotations

import json
import os
import sys

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

import torch  # noqa: E402
from fused_cases import case, second_order_case  # noqa: E402
from fused_stats_cases import (  # noqa: E402
    EVERY_INPUT,
    beyond_the_logits,
    launches,
    stats_case,
)

from pdmask.trust_region import logits_pass, triton_pass  # noqa: E402


def main() -> int:
    bf16, f16, f32 = torch.bfloat16, torch.float16, torch.float32
    cases = [
        case(
            triton_pass, 0, 37, 5000, 21, bf16, second_order=True
        ),  # 3 blocks, the last one partial
        case(triton_pass, 1, 9, 2048, 6, f32),  # exactly one block
        case(
            triton_pass, 2, 5, 300, 3, f16, second_order=True, strided=True
        ),  # one partial block, strided
        case(triton_pass, 3, 0, 300, 3, bf16),  # no rows
        case(triton_pass, 4, 23, 5000, 21, bf16, entropy=True),  # a differentiable entropy
        case(
            triton_pass, 5, 23, 5000, 21, bf16, support_grad=True
        ),  # differentiable support and tail
        case(triton_pass, 6, 11, 3000, 8, f32, entropy=True, support_grad=True, second_order=True),
        case(triton_pass, 7, 13, 3000, 8, bf16, entropy=True, support_grad=True, padded=96),
    ]

    # compute_token_stats's second-order statistics as a GPU computes them: this script stands in
    # for a GPU, so the pass takes the Triton kernels for the CPU tensors here
    # (float64 logits keep their own path: the references)
    def gpu_rule(logits, chunk_size):
        fused = logits.dtype in logits_pass.FUSED_DTYPES and chunk_size is None
        return triton_pass if fused else None

    logits_pass.fused_kernels = gpu_rule
    second = second_order_case(8, 6, 3000, 20, bf16)
    # the statistics kernel (triton_stats): every statistic and the gradient, and what the pass
    # launches and reads back per direction
    stats = [
        stats_case(0, 6, 2500, 20, bf16),  # two blocks, corrupt top-K slots
        stats_case(3, 5, 300, 8, f32),  # very peaked pi, one partial block
        stats_case(5, 4, 300, 5, f16, topk=False),  # K = 0: the sampled id and one bucket
    ]
    counted = [launches(1, 4, 300, 5, bf16, ()), launches(2, 4, 300, 5, bf16, EVERY_INPUT)]
    results = {"cases": cases, "second_order": second, "stats": stats, "launches": counted}
    print(json.dumps(results | {"beyond_the_logits": beyond_the_logits()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
