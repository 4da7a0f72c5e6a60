"""The verifiable synthetic task: two-digit addition, in two token regimes.

Prompt ``<bos> a1 a2 + b1 b2 =`` (``n_digits`` = 2 by default; canonical digit tokens); the
response is the ``n+1`` digits of ``a + b`` (least significant first, so carries flow in writing
order), then ``<eos>``: a multi-token answer. The reward is rule-based: 1 when the response decodes
to exactly that, else 0.

The regimes (``TASKS``) differ only in how the answer's tokens are spread over the vocabulary:

- ``synonyms`` (the default): a real tokenizer has many tokens for one meaning (``5``, `` 5``,
  ``five``), so every digit has ``synonyms_per_digit`` = 102 interchangeable tokens (token ``t``
  means digit ``(t - first) % 10``), picked Zipf-distributed by the demonstrations. Logits are
  1,025 wide and the behaviour's top-20 view holds about half the mass (tiny-4b base model, FP8
  rollout: median 44 %, 10th percentile 40 %): the near-duplicate output embeddings spread every
  update over ~100 tokens and make the tail term of ``Ddot`` large.
- ``llm-like``: two surface forms per digit (``5`` and `` 5``, Zipf: 2/3 and 1/3) and a
  vocabulary of 4,096 whose other 4,071 tokens are *fillers*, meaningless tokens that
  demonstrations emit with probability ``filler_rate`` per response position, Zipf-distributed
  over the fillers. The next-token distribution is then an LLM's shape: a few plausible tokens
  (every digit form fits in the top 20, so the top-20 view holds > 99 % of the mass: tiny-4b
  base model, FP8 rollout, median 99.1 %, 10th percentile 98.6 %; 99.95 % after 20 RL steps)
  and a long thin tail over thousands of tokens, none a near-duplicate of another. The second
  surface form is what makes the direction tests disagree at all: with one token per digit the
  sampled token nearly always carries most of the mass, the global term of ``Ddot`` follows the
  local one, and the tests disagreed on ~1 % of out-of-region tokens (~12 per seed; the paper: 82
  of 1,435); with two forms, on 12 % (139 per seed, 61 seeds of ``token-analysis-llm``). A filler
  in the answer makes it wrong.

Held-out split: a problem ``(a, b)`` belongs to the evaluation pool when a fixed hash puts it there
(about 1 in 61, some 160 problems for two digits); training never samples those problems.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PAD, BOS, EOS, PLUS, EQUALS = 0, 1, 2, 3, 4
FIRST_DIGIT_TOKEN = 5
EVAL_SPLIT_MODULUS = 61  # one problem in 61 is held out for evaluation


@dataclass(frozen=True)
class AdditionTask:
    """Addition of two ``n_digits`` numbers; see the module docstring."""

    n_digits: int = 2
    synonyms_per_digit: int = 102
    synonym_zipf: float = 1.0
    filler_tokens: int = 0  # meaningless tokens after the digit tokens (the llm-like tail)
    filler_rate: float = 0.0  # probability that a demonstrated response token is a filler
    filler_zipf: float = 1.0  # Zipf exponent of the fillers' frequencies

    @property
    def digit_tokens(self) -> int:
        return 10 * self.synonyms_per_digit

    @property
    def first_filler(self) -> int:
        return FIRST_DIGIT_TOKEN + self.digit_tokens

    @property
    def vocab_size(self) -> int:
        return self.first_filler + self.filler_tokens

    @property
    def prompt_len(self) -> int:
        return 2 * self.n_digits + 3

    @property
    def answer_digits(self) -> int:
        return self.n_digits + 1

    @property
    def response_len(self) -> int:
        """Answer digits plus ``<eos>``: the longest a correct response can be."""
        return self.answer_digits + 1

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.response_len

    # ---- problems -----------------------------------------------------------------------------
    def _is_eval(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a * 7919 + b * 104729) % EVAL_SPLIT_MODULUS == 0

    def sample_train(
        self, count: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``count`` training problems ``(a, b)``, never from the held-out pool."""
        high = 10**self.n_digits
        out_a, out_b, have = [], [], 0
        while have < count:
            a = torch.randint(0, high, (2 * count,), generator=generator)
            b = torch.randint(0, high, (2 * count,), generator=generator)
            keep = ~self._is_eval(a, b)
            out_a.append(a[keep])
            out_b.append(b[keep])
            have += int(keep.sum())
        return torch.cat(out_a)[:count], torch.cat(out_b)[:count]

    def eval_pool(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every held-out problem, in a fixed shuffled order."""
        high = 10**self.n_digits
        a = torch.arange(high).repeat_interleave(high)
        b = torch.arange(high).repeat(high)
        keep = self._is_eval(a, b)
        order = torch.randperm(int(keep.sum()), generator=torch.Generator().manual_seed(10_007))
        return a[keep][order], b[keep][order]

    def eval_problems(self, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first ``count`` distinct held-out problems (the same for every trial)."""
        a, b = self.eval_pool()
        if count > a.shape[0]:
            raise ValueError(f"only {a.shape[0]} held-out problems exist, {count} requested")
        return a[:count], b[:count]

    # ---- encoding -----------------------------------------------------------------------------
    def _digits(self, x: torch.Tensor, width: int) -> torch.Tensor:
        """Digits of ``x`` most significant first, ``[..., width]``."""
        powers = 10 ** torch.arange(width - 1, -1, -1)
        return (x.unsqueeze(-1) // powers) % 10

    def prompts(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        n = a.shape[0]
        parts = [
            torch.full((n, 1), BOS),
            FIRST_DIGIT_TOKEN + self._digits(a, self.n_digits),
            torch.full((n, 1), PLUS),
            FIRST_DIGIT_TOKEN + self._digits(b, self.n_digits),
            torch.full((n, 1), EQUALS),
        ]
        return torch.cat(parts, dim=1)

    def answer(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """The target digits in writing order (least significant first), ``[n, n_digits + 1]``."""
        return self._digits(a + b, self.answer_digits).flip(-1)

    def synonym_probs(self) -> torch.Tensor:
        return _zipf(self.synonyms_per_digit, self.synonym_zipf)

    def filler_probs(self) -> torch.Tensor:
        return _zipf(self.filler_tokens, self.filler_zipf)

    def demonstrations(
        self, a: torch.Tensor, b: torch.Tensor, generator: torch.Generator, noise: float = 0.0
    ) -> torch.Tensor:
        """Warm-start responses, ``[n, response_len]``: Zipf-sampled surface forms, and each digit
        replaced by a uniformly random one with probability ``noise`` (imperfect data, so a model
        that imitates it is right in its mode but often wrong when sampled). With fillers, every
        response token (``<eos>`` included) is a Zipf-drawn filler with probability
        ``filler_rate``: the rare, meaningless continuations that make an LLM's long tail."""
        digits = self.answer(a, b)
        noisy = torch.rand(digits.shape, generator=generator) < noise
        random_digits = torch.randint(0, 10, digits.shape, generator=generator)
        digits = torch.where(noisy, random_digits, digits)
        ranks = torch.multinomial(
            self.synonym_probs(), digits.numel(), replacement=True, generator=generator
        ).view_as(digits)
        tokens = FIRST_DIGIT_TOKEN + ranks * 10 + digits
        tokens = torch.cat([tokens, torch.full((a.shape[0], 1), EOS)], dim=1)
        if self.filler_tokens and self.filler_rate > 0:
            is_filler = torch.rand(tokens.shape, generator=generator) < self.filler_rate
            fillers = self.first_filler + torch.multinomial(
                self.filler_probs(), tokens.numel(), replacement=True, generator=generator
            ).view_as(tokens)
            tokens = torch.where(is_filler, fillers, tokens)
        return tokens

    def is_digit(self, tokens: torch.Tensor) -> torch.Tensor:
        return (tokens >= FIRST_DIGIT_TOKEN) & (tokens < self.first_filler)

    def token_class(self, tokens: torch.Tensor) -> torch.Tensor:
        """Meaning of tokens, synonyms pooled: the digit 0..9, or 10 for any other token."""
        return torch.where(self.is_digit(tokens), (tokens - FIRST_DIGIT_TOKEN) % 10, 10)

    def likeliest_class(self, probs: torch.Tensor) -> torch.Tensor:
        """The most likely class (as :meth:`token_class`) of distributions ``probs [..., V]``."""
        digit_probs = probs[..., FIRST_DIGIT_TOKEN : self.first_filler]
        digits = digit_probs.unflatten(-1, (self.synonyms_per_digit, 10)).sum(-2)
        other = probs[..., :FIRST_DIGIT_TOKEN].sum(-1, keepdim=True)
        other = other + probs[..., self.first_filler :].sum(-1, keepdim=True)
        return torch.cat([digits, other], dim=-1).argmax(-1)

    # ---- reward -------------------------------------------------------------------------------
    def score(self, a: torch.Tensor, b: torch.Tensor, responses: torch.Tensor) -> torch.Tensor:
        """1.0 where the response is exactly the answer's digits then ``<eos>``, else 0.0."""
        width = self.answer_digits
        if responses.shape[1] < width + 1:
            return torch.zeros(responses.shape[0])
        head = responses[:, :width]
        digits = (head - FIRST_DIGIT_TOKEN) % 10
        correct = self.is_digit(head).all(1) & (digits == self.answer(a, b)).all(1)
        correct &= responses[:, width] == EOS
        return correct.float()


def _zipf(count: int, exponent: float) -> torch.Tensor:
    ranks = torch.arange(1, count + 1, dtype=torch.float64)
    weights = ranks.pow(-exponent)
    return (weights / weights.sum()).float()


TASKS: dict[str, AdditionTask] = {
    "synonyms": AdditionTask(),
    # 4,096 logits: a vocabulary 4x the synonyms regime's, of which 4,071 fillers. A filler rate
    # of 1 % per position with a Zipf(1.1) spread leaves a thin tail over every filler.
    "llm-like": AdditionTask(
        synonyms_per_digit=2, filler_tokens=4071, filler_rate=0.01, filler_zipf=1.1
    ),
}
"""The task regimes (``SimTrialConfig.task``); see the module docstring."""
DEFAULT_TASK = TASKS["synonyms"]
"""The regime a trial uses unless its config names another."""
