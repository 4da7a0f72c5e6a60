"""The math reward: VeRL's custom reward function for DAPO-Math / AIME.

Referenced by the job builder as::

    reward.custom_reward_function.path=pkg://pdmask.backends.verl.rewards
    reward.custom_reward_function.name=compute_score

verl 0.9.1 loads it with ``verl.utils.import_utils.load_extern_object`` (``pkg://`` = plain
``importlib.import_module``, so nothing is copied to the nodes) and its reward managers call it as
``compute_score(data_source=..., solution_str=..., ground_truth=..., extra_info=..., **kw)``, merging
``reward.custom_reward_function.reward_kwargs`` into ``kw``. A dict result must carry ``score`` (the
reward) and every key of it becomes a per-sample "reward extra info": numeric keys are averaged into
``val-core/<data_source>/acc/mean@N`` and friends, ``pred`` (a string) is used for majority voting.
The keys must be the same for every sample (verl stacks them into one numpy array per key), so this
module always returns exactly ``score``, ``acc`` and ``pred``.

Extraction (the DAPO convention, in this order):

1. the text after the **last** ``Answer:`` (case-insensitive) up to the end of that line; when that is
   empty (``Answer:`` then a newline), the next non-empty line; a ``\\boxed{...}`` inside it wins;
2. otherwise the content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) with balanced braces;
3. otherwise nothing: ``pred`` is ``"[INVALID]"`` and the score is the incorrect score.

Normalisation and equivalence: ``$``, ``\\(..\\)``, markdown ``**``, ``\\text{}``/``\\mathrm{}``/...
wrappers, ``\\left``/``\\right``, LaTeX spacing, ``^\\circ``, ``%`` and a trailing period are removed,
``x = 5`` keeps the right-hand side, ``\\dfrac``/``\\tfrac`` become ``\\frac``. Numbers are compared
exactly as fractions: integers (leading zeros, ``+``, thousands commas ``1,000`` / ``1{,}000``),
decimals (``0.5``), ``a/b`` and ``\\frac{a}{b}`` (also ``\\frac12``) are equal when their values are
equal; a number followed by a known unit word (``42 degrees``, ``5 \\text{ cm}``) is that number.
When the ground truth is not a number, the normalised strings are compared with spaces removed.

Pure Python, import-safe (no verl, no torch) and linear in the length of the response.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

__all__ = ["compute_score", "extract_answer", "is_equiv", "normalize_answer", "parse_number"]

INVALID = "[INVALID]"
MAX_NUMBER_CHARS = 200  # longer strings are never parsed as numbers (int() caps at 4300 digits)
MAX_PRED_CHARS = 200  # ``pred`` is logged per sample; keep it short
MAX_ANSWER_CHARS = 1000  # an extracted answer longer than this is cut (degenerate outputs)
MAX_BOX_TRIES = 8

_ANSWER_RE = re.compile(r"answer\s*:", re.IGNORECASE)
_BOX_COMMANDS = ("\\boxed", "\\fbox")
_WRAPPER_RE = re.compile(
    r"\\(?:text|textbf|textit|textrm|texttt|mathrm|mathbf|mathit|mathsf|mbox|operatorname)\s*\{([^{}]*)\}"
)
_SPACING = ("\\!", "\\,", "\\;", "\\:", "\\quad", "\\qquad", "\\ ", "~")
_UNITS = (
    "degrees?|deg|cm|mm|km|m|meters?|inches|inch|in|feet|foot|ft|units?|sq\\s*units?|square\\s*units?|"
    "dollars?|cents?|hours?|minutes?|seconds?|days?|years?|ways|points?|students|people|"
    "mph|miles?|pounds?|lbs?|kg|grams?|g"
)
_NUMBER_UNIT_RE = re.compile(r"^(.*?\d\}?)\s*(?:" + _UNITS + r")\.?$", re.IGNORECASE)
_INT_RE = re.compile(r"^[+-]?\d+$")
_THOUSANDS_RE = re.compile(r"^[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_DEC_RE = re.compile(r"^[+-]?(?:\d+\.\d*|\.\d+)$")
_SLASH_RE = re.compile(r"^([+-]?[\d.]+)/([+-]?[\d.]+)$")
_FRAC_RE = re.compile(r"^([+-]?)\\frac\{([^{}]+)\}\{([^{}]+)\}$")
_FRAC_SHORT_RE = re.compile(r"^([+-]?)\\frac(\d)(\d)$")
_SIGN_SPACE_RE = re.compile(r"^([+-])\s+")
_ANSWER_IS_RE = re.compile(r"^(?:the\s+)?(?:final\s+)?answer\s+is\s*:?\s*(.+)$", re.IGNORECASE)


# --------------------------------------------------------------------------------------- extraction


def _balanced_group(text: str, start: int) -> tuple[str, int] | None:
    """Content of the ``{...}`` group whose ``{`` is at ``start``, and the index after its ``}``."""
    depth = 0
    for i in range(start, len(text)):
        ch = text[i]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i], i + 1
    return None


def _boxed_at(text: str, idx: int) -> str | None:
    """The argument of the box command starting at ``idx`` (``\\boxed{..}`` or ``\\boxed 5``)."""
    j = idx
    for cmd in _BOX_COMMANDS:
        if text.startswith(cmd, idx):
            j = idx + len(cmd)
            break
    while j < len(text) and text[j] == " ":
        j += 1
    if j < len(text) and text[j] == "{":
        group = _balanced_group(text, j)
        return group[0] if group else None
    if j > idx and j < len(text) and text[j - 1] == " ":  # "\boxed 5"
        m = re.match(r"[^\s$]+", text[j:])
        return m.group(0) if m else None
    return None


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` with balanced braces, else ``None``.

    An unterminated last box (a truncated response) falls back to the one before it; at most
    ``MAX_BOX_TRIES`` boxes are tried, so a degenerate ``\\boxed{\\boxed{...`` loop stays cheap.
    """
    idx = len(text)
    for _ in range(MAX_BOX_TRIES):
        idx = max(text.rfind(cmd, 0, idx) for cmd in _BOX_COMMANDS)
        if idx < 0:
            return None
        content = _boxed_at(text, idx)
        if content is not None:
            return content
    return None


def _strip_markup(s: str) -> str:
    return s.strip().strip("*_`").strip()


def extract_answer(solution_str: str) -> tuple[str | None, str]:
    """The raw answer string of a response and how it was found (``answer``/``boxed``/``none``)."""
    if not solution_str:
        return None, "none"
    last = None
    for match in _ANSWER_RE.finditer(solution_str):
        last = match
    if last is not None:
        start = last.end()
        end = solution_str.find("\n", start)
        line = solution_str[start : len(solution_str) if end < 0 else end]
        if not _strip_markup(line) and end >= 0:
            for nxt in solution_str[end + 1 :].split("\n", 50)[:50]:
                if _strip_markup(nxt):
                    line = nxt
                    start = solution_str.find(nxt, end + 1)
                    break
        box_idx = max(line.find(cmd) for cmd in _BOX_COMMANDS)
        if box_idx >= 0:
            content = _boxed_at(solution_str, start + box_idx)
            if content is not None:
                return content, "answer"
        if _strip_markup(line):
            return line.strip(), "answer"
    boxed = last_boxed(solution_str)
    if boxed is not None:
        return boxed, "boxed"
    return None, "none"


# ------------------------------------------------------------------------------------ normalisation


def normalize_answer(answer: Any) -> str:
    """A canonical string form of an answer, before any numeric parsing."""
    s = str(answer).strip()
    if any(cmd in s for cmd in _BOX_COMMANDS):
        boxed = last_boxed(s)
        if boxed is not None:
            s = boxed
    s = s.replace("\u2212", "-").replace("\u2013", "-")  # unicode minus / en dash
    s = s.replace("\\$", "").replace("$", "")
    s = s.replace("\\(", "").replace("\\)", "").replace("\\[", "").replace("\\]", "")
    s = s.replace("**", "").replace("`", "")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("{,}", ",")
    for sp in _SPACING:
        s = s.replace(sp, " ")
    for _ in range(4):  # nested wrappers: \text{\textbf{5}}
        new = _WRAPPER_RE.sub(r"\1", s)
        if new == s:
            break
        s = new
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    for deg in ("^{\\circ}", "^\\circ", "\u00b0", "\\%", "%"):
        s = s.replace(deg, "")
    s = " ".join(s.split())
    m = _ANSWER_IS_RE.match(s)
    if m:
        s = m.group(1)
    if "=" in s:
        rhs = s.rsplit("=", 1)[1].strip()
        if rhs:
            s = rhs
    s = s.strip().rstrip(".").strip()
    while (
        len(s) >= 2 and s[0] == "{" and s[-1] == "}" and _balanced_group(s, 0) == (s[1:-1], len(s))
    ):
        s = s[1:-1].strip()
    return s


def _to_fraction(s: str) -> Fraction | None:
    s = _SIGN_SPACE_RE.sub(r"\1", s.strip())
    if not s or len(s) > MAX_NUMBER_CHARS:
        return None
    try:
        if _INT_RE.match(s) or _DEC_RE.match(s):
            return Fraction(s)
        if _THOUSANDS_RE.match(s):
            return Fraction(s.replace(",", ""))
        m = _SLASH_RE.match(s)
        if m:
            num, den = Fraction(m.group(1)), Fraction(m.group(2))
            return num / den if den else None
        m = _FRAC_RE.match(s) or _FRAC_SHORT_RE.match(s)
        if m:
            num, den = _to_fraction(m.group(2)), _to_fraction(m.group(3))
            if num is None or den is None or den == 0:
                return None
            value = num / den
            return -value if m.group(1) == "-" else value
    except (ValueError, ZeroDivisionError, OverflowError):
        return None
    return None


def _canonical(answer: Any) -> tuple[Fraction | None, str]:
    """``(exact value or None, normalised string)`` of an answer."""
    s = normalize_answer(answer)
    value = _to_fraction(s)
    if value is None:
        m = _NUMBER_UNIT_RE.match(s)
        if m:
            value = _to_fraction(m.group(1))
    return value, s


def parse_number(answer: Any) -> Fraction | None:
    """The exact value of a numeric answer (``"1,000"``, ``"\\frac{1}{2}"``, ``"0.5"``), else ``None``."""
    return _canonical(answer)[0]


def _fraction_str(value: Fraction) -> str:
    return (
        str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"
    )


def _same(a: tuple[Fraction | None, str], b: tuple[Fraction | None, str]) -> bool:
    (av, as_), (bv, bs) = a, b
    if av is not None or bv is not None:  # a number only ever equals a number
        return av is not None and bv is not None and av == bv
    return bool(bs) and as_.replace(" ", "") == bs.replace(" ", "")


def is_equiv(pred: Any, ground_truth: Any) -> bool:
    """Whether two answers are the same: numerically when either is a number, else as strings."""
    return _same(_canonical(pred), _canonical(ground_truth))


def _ground_truths(ground_truth: Any) -> list[Any]:
    if ground_truth is None:
        return []
    if isinstance(ground_truth, str | int | float | Fraction):
        return [ground_truth]
    if isinstance(ground_truth, dict):
        return _ground_truths(ground_truth.get("ground_truth"))
    try:  # list, tuple, numpy array
        return [g for g in list(ground_truth) if g is not None]
    except TypeError:
        return [ground_truth]


# ------------------------------------------------------------------------------------------- reward


def compute_score(
    data_source: str | None,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    *,
    correct_score: float = 1.0,
    incorrect_score: float = 0.0,
    **kwargs: Any,
) -> dict[str, Any]:
    """VeRL custom reward: ``{"score": 1.0|0.0, "acc": bool, "pred": str}``.

    ``correct_score``/``incorrect_score`` can be changed through
    ``reward.custom_reward_function.reward_kwargs`` (e.g. ``incorrect_score=-1.0`` for DAPO's
    ±1 reward). ``data_source``, ``extra_info`` and any other keyword verl passes are accepted and
    ignored: the same rule scores every math data source. ``ground_truth`` may be a string, a
    number or a list of accepted answers.
    """
    text = solution_str if isinstance(solution_str, str) else str(solution_str or "")
    raw, _how = extract_answer(text)
    if raw is None:
        return {"score": float(incorrect_score), "acc": False, "pred": INVALID}
    pred_c = _canonical(raw[:MAX_ANSWER_CHARS])
    value, norm = pred_c
    pred = _fraction_str(value) if value is not None else (norm[:MAX_PRED_CHARS] or INVALID)
    correct = any(_same(pred_c, _canonical(gt)) for gt in _ground_truths(ground_truth))
    return {
        "score": float(correct_score if correct else incorrect_score),
        "acc": bool(correct),
        "pred": pred,
    }
