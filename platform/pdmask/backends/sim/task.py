"""The verifiable synthetic task: multi-digit addition with many surface forms per digit.

Prompt ``<bos> a1 a2 + b1 b2 =`` (``n_digits`` = 2 by default; canonical digit tokens); the
response is the ``n+1`` digits of ``a + b`` (least significant first, so carries flow in writing
order), then ``<eos>``: a multi-token answer. The reward is rule-based: 1 when the response decodes
to exactly that, else 0.

Why many surface forms: a real tokenizer has many tokens for one meaning (``5``, `` 5``, ``five``),
so an LLM's next-token distribution spreads over far more than 20 tokens. Here every digit has
``synonyms_per_digit`` interchangeable tokens (token ``t`` means digit ``(t - first) % 10``) and the
demonstrations pick them Zipf-distributed. The logits are >= 1,000 wide and the behaviour policy's
top-20 view is a real truncation (top-20 mass well below 1), while the reward depends only on the
digits.

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

    @property
    def vocab_size(self) -> int:
        return FIRST_DIGIT_TOKEN + 10 * self.synonyms_per_digit

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
        ranks = torch.arange(1, self.synonyms_per_digit + 1, dtype=torch.float64)
        weights = ranks.pow(-self.synonym_zipf)
        return (weights / weights.sum()).float()

    def demonstrations(
        self, a: torch.Tensor, b: torch.Tensor, generator: torch.Generator, noise: float = 0.0
    ) -> torch.Tensor:
        """Warm-start responses, ``[n, response_len]``: Zipf-sampled surface forms, and each digit
        replaced by a uniformly random one with probability ``noise`` (imperfect data, so a model
        that imitates it is right in its mode but often wrong when sampled)."""
        digits = self.answer(a, b)
        noisy = torch.rand(digits.shape, generator=generator) < noise
        random_digits = torch.randint(0, 10, digits.shape, generator=generator)
        digits = torch.where(noisy, random_digits, digits)
        ranks = torch.multinomial(
            self.synonym_probs(), digits.numel(), replacement=True, generator=generator
        ).view_as(digits)
        tokens = FIRST_DIGIT_TOKEN + ranks * 10 + digits
        return torch.cat([tokens, torch.full((a.shape[0], 1), EOS)], dim=1)

    def token_class(self, tokens: torch.Tensor) -> torch.Tensor:
        """Meaning of tokens, synonyms pooled: the digit 0..9, or 10 for any other token."""
        return torch.where(tokens >= FIRST_DIGIT_TOKEN, (tokens - FIRST_DIGIT_TOKEN) % 10, 10)

    def likeliest_class(self, probs: torch.Tensor) -> torch.Tensor:
        """The most likely class (as :meth:`token_class`) of distributions ``probs [..., V]``."""
        digits = probs[..., FIRST_DIGIT_TOKEN:].unflatten(-1, (self.synonyms_per_digit, 10))
        other = probs[..., :FIRST_DIGIT_TOKEN].sum(-1, keepdim=True)
        return torch.cat([digits.sum(-2), other], dim=-1).argmax(-1)

    # ---- reward -------------------------------------------------------------------------------
    def score(self, a: torch.Tensor, b: torch.Tensor, responses: torch.Tensor) -> torch.Tensor:
        """1.0 where the response is exactly the answer's digits then ``<eos>``, else 0.0."""
        width = self.answer_digits
        if responses.shape[1] < width + 1:
            return torch.zeros(responses.shape[0])
        head = responses[:, :width]
        is_digit = head >= FIRST_DIGIT_TOKEN
        digits = (head - FIRST_DIGIT_TOKEN) % 10
        correct = is_digit.all(1) & (digits == self.answer(a, b)).all(1)
        correct &= responses[:, width] == EOS
        return correct.float()


DEFAULT_TASK = AdditionTask()
"""The task every stand-in is trained and evaluated on."""
