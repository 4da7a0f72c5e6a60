"""Synthetic micro-batches shaped exactly like the ones verl 0.9.1's FSDP actor sees.

Samples are packed (no padding) as nested jagged tensors; the behaviour policy mu is a perturbed
copy of pi whose top-K is carried in pdmask's full-sequence layout (``layout.py``), response tokens
are sampled from mu, and a few top-K slots are knocked out to exercise the sentinels.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import torch
from verl.utils import tensordict_utils as tu
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

from pdmask.backends.verl.layout import MISSING_ID, SENTINEL, TOPK_IDS, TOPK_LOGPROBS


def nested(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.nested.as_nested_tensor(tensors, layout=torch.jagged)


@dataclass
class Sample:
    logits: torch.Tensor  # (S, V) rows predicting token i+1 (grad leaf lives in Batch)
    prompt: torch.Tensor
    response: torch.Tensor
    mu_topk_ids: torch.Tensor  # (S, K+1) int32, the data contract
    mu_topk_lps: torch.Tensor  # (S, K+1) float32
    advantage: float


@dataclass
class Batch:
    samples: list[Sample]
    vocab: int
    k: int
    leaf: torch.Tensor  # (total_tokens, V) the one gradient leaf, all samples' logits packed

    def sample_logits(self, indices: list[int]) -> torch.Tensor:
        """Packed logits of some samples, as differentiable views of the leaf."""
        starts = torch.tensor([0] + [len(s.logits) for s in self.samples]).cumsum(0)
        return torch.cat([self.leaf[starts[i] : starts[i + 1]] for i in indices])


def make_batch(
    prompt_lens=(3, 2, 4, 3),
    response_lens=(6, 5, 2, 7),
    vocab=64,
    k=5,
    mismatch=1.0,
    seed=0,
    dtype=torch.float32,
) -> Batch:
    gen = torch.Generator().manual_seed(seed)
    samples = []
    advantages = [1.0, -1.0, 0.0, 0.7, -0.3, 1.3][: len(prompt_lens)]
    for b, (p, r) in enumerate(zip(prompt_lens, response_lens, strict=True)):
        s = p + r
        logits = torch.randn(s, vocab, generator=gen)
        mu_logp = torch.log_softmax(logits + mismatch * torch.randn(s, vocab, generator=gen), -1)
        prompt = torch.randint(0, vocab, (p,), generator=gen)
        # response token j is predicted by row p-1+j and drawn from mu there
        rows = torch.arange(p - 1, p - 1 + r)
        response = torch.multinomial(mu_logp[rows].exp(), 1, generator=gen).squeeze(1)
        top_lp, top_id = mu_logp.topk(k, dim=-1)
        ids = torch.full((s, k + 1), MISSING_ID, dtype=torch.int32)
        lps = torch.full((s, k + 1), SENTINEL, dtype=torch.float32)
        ids[rows, :k] = top_id[rows].int()
        lps[rows, :k] = top_lp[rows]
        ids[rows, k] = response.int()
        lps[rows, k] = mu_logp[rows, response]
        # knock out a top-K slot here and there (vLLM -inf under truncation / fewer entries)
        knock = torch.rand(r, k, generator=gen) < 0.1
        ids[rows, :k] = torch.where(knock, MISSING_ID, ids[rows, :k])
        lps[rows, :k] = torch.where(knock, SENTINEL, lps[rows, :k])
        samples.append(Sample(logits.to(dtype), prompt, response, ids, lps, advantages[b]))
    leaf = torch.cat([s.logits for s in samples]).clone().requires_grad_(True)
    return Batch(samples, vocab, k, leaf)


def micro_batch(batch: Batch, indices: list[int], **non_tensor) -> object:
    """The TensorDict verl hands the actor's engine and loss for these samples."""
    ss = [batch.samples[i] for i in indices]
    seqs = [torch.cat([s.prompt, s.response]) for s in ss]
    old_lp = [
        s.mu_topk_lps[len(s.prompt) - 1 : len(s.prompt) - 1 + len(s.response), batch.k] for s in ss
    ]
    non_tensor = {
        "temperature": 1.0,
        "use_remove_padding": True,
        "distillation_use_topk": True,
        "dp_size": 1,
        "batch_num_tokens": None,
        "global_batch_size": None,
        **non_tensor,
    }
    return tu.get_tensordict(
        tensor_dict={
            "input_ids": nested(seqs),
            "position_ids": nested([torch.arange(len(t)) for t in seqs]),
            "prompts": nested([s.prompt for s in ss]),
            "responses": nested([s.response for s in ss]),
            "response_mask": nested([torch.ones(len(s.response), dtype=torch.int64) for s in ss]),
            "loss_mask": nested([torch.ones(len(s.response), dtype=torch.int64) for s in ss]),
            "old_log_probs": nested(old_lp),
            "advantages": nested([torch.full((len(s.response),), s.advantage) for s in ss]),
            TOPK_IDS: nested([s.mu_topk_ids for s in ss]),
            TOPK_LOGPROBS: nested([s.mu_topk_lps for s in ss]),
        },
        non_tensor_dict=non_tensor,
    )


def engine_forward(logits_packed: torch.Tensor, data, loss_fn):
    """verl's real FSDP engine input/output preparation around synthetic logits (no model, no GPU).

    ``prepare_model_outputs`` calls ``loss_fn`` as the logits hook exactly as in training.
    """
    engine = object.__new__(FSDPEngineWithLMHead)
    engine.pad_to_length = False
    engine.use_ulysses_sp = False
    engine.ulysses_sequence_parallel_size = 1
    _, output_args = engine.prepare_model_inputs(data)
    output = SimpleNamespace(logits=logits_packed.unsqueeze(0))
    return engine.prepare_model_outputs(output, output_args, data, loss_fn)


def response_frame(batch: Batch, indices: list[int]):
    """The math API's view of the same samples: padded (B, R_max) response tensors."""
    ss = [batch.samples[i] for i in indices]
    r_max = max(len(s.response) for s in ss)
    n = len(ss)
    starts = torch.tensor([0] + [len(s.logits) for s in batch.samples]).cumsum(0)
    logits = torch.zeros(n, r_max, batch.vocab, dtype=batch.leaf.dtype)
    sampled = torch.zeros(n, r_max, dtype=torch.long)
    ids = torch.full((n, r_max, batch.k), MISSING_ID, dtype=torch.int32)
    lps = torch.full((n, r_max, batch.k), SENTINEL, dtype=torch.float32)
    mu_k = torch.zeros(n, r_max)
    adv = torch.zeros(n, r_max)
    valid = torch.zeros(n, r_max, dtype=torch.bool)
    rows_list = []
    for out_b, (i, s) in enumerate(zip(indices, ss, strict=True)):
        p, r = len(s.prompt), len(s.response)
        rows = torch.arange(p - 1, p - 1 + r)
        rows_list.append(starts[i] + rows)
        sampled[out_b, :r] = s.response
        ids[out_b, :r] = s.mu_topk_ids[rows, : batch.k]
        lps[out_b, :r] = s.mu_topk_lps[rows, : batch.k]
        mu_k[out_b, :r] = s.mu_topk_lps[rows, batch.k]
        adv[out_b, :r] = s.advantage
        valid[out_b, :r] = True
    # differentiable: gather the leaf's rows into the padded frame
    index = torch.zeros(n, r_max, dtype=torch.long)
    for out_b, rows in enumerate(rows_list):
        index[out_b, : len(rows)] = rows
    logits = batch.leaf[index.reshape(-1)].reshape(n, r_max, batch.vocab)
    return SimpleNamespace(
        logits=logits, sampled=sampled, ids=ids, lps=lps, mu_k=mu_k, adv=adv, valid=valid
    )
