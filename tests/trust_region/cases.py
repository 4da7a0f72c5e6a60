"""Random and edge-case inputs for the trust-region math, as a rollout engine would deliver them."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Case:
    logits: torch.Tensor  # [N, V] float64
    sampled: torch.Tensor  # [N]
    topk_ids: torch.Tensor  # [N, K]
    topk_logp: torch.Tensor  # [N, K]
    mu_logp: torch.Tensor  # [N] behaviour log-prob of the sampled token
    mu_full: torch.Tensor  # [N, V] the full behaviour distribution (known in tests only)
    advantages: torch.Tensor  # [N]


def make_case(seed: int, *, n: int = 8, vocab: int = 64, k: int = 5, corrupt: bool = True) -> Case:
    g = torch.Generator().manual_seed(seed)
    style = seed % 6
    scale = [0.5, 2.0, 6.0, 12.0, 1.0, 3.0][style]
    z = torch.randn(n, vocab, generator=g, dtype=torch.float64) * scale
    if style == 4:
        mu_logits = z.clone()  # mu == pi
    elif style == 5:
        mu_logits = z + torch.randn(n, vocab, generator=g, dtype=torch.float64) * 0.05
    else:
        mu_logits = z + torch.randn(n, vocab, generator=g, dtype=torch.float64) * scale * 0.5
    if style == 3:
        # Very peaked: probabilities down to ~1e-12 and below in both policies.
        z[:, 0] += 28.0
        mu_logits[:, 0] += 27.0
    mu = torch.softmax(mu_logits, -1)
    logmu = torch.log_softmax(mu_logits, -1)
    kk = min(k, vocab)
    topk_logp, topk_ids = logmu.topk(kk, dim=-1)
    sampled = torch.multinomial(mu, 1, generator=g).squeeze(1)
    # Force half of the tokens outside the top-K (where possible) and some inside.
    for row in range(n):
        if vocab > kk and row % 2 == 0:
            outside = [i for i in range(vocab) if i not in topk_ids[row].tolist()]
            sampled[row] = outside[int(torch.randint(len(outside), (1,), generator=g))]
        elif row % 4 == 1 and kk > 0:
            sampled[row] = topk_ids[row, int(torch.randint(kk, (1,), generator=g))]
    mu_logp = logmu.gather(1, sampled[:, None]).squeeze(1)
    topk_ids = topk_ids.clone()
    topk_logp = topk_logp.clone()
    if corrupt and kk >= 3:
        for row in range(n):
            what = (row + seed) % 5
            if what == 0:
                topk_logp[row, -1] = -torch.inf  # top-p truncation
            elif what == 1:
                topk_ids[row, -1] = -1  # missing slot
                topk_logp[row, -1] = float("nan")
            elif what == 2:
                topk_logp[row, -2:] = -1e4  # the VeRL sentinel
            elif what == 3:
                topk_ids[row, -1] = topk_ids[row, 0]  # a duplicated id
    adv = torch.randn(n, generator=g, dtype=torch.float64)
    adv[::5] = 0.0
    return Case(z, sampled, topk_ids, topk_logp, mu_logp, mu, adv)
