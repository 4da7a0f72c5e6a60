"""The math reward (pdmask.backends.verl.rewards) and its fit with verl 0.9.1's custom-reward contract."""

from __future__ import annotations

import random
import subprocess
import sys
from fractions import Fraction

import pytest

from pdmask.backends.verl.rewards import (
    INVALID,
    compute_score,
    extract_answer,
    is_equiv,
    last_boxed,
    normalize_answer,
    parse_number,
)

REWARD_PATH = "pkg://pdmask.backends.verl.rewards"

# (response, ground truth, expected acc, expected pred)
CASES = [
    # the DAPO format
    ("Let me think.\nAnswer: 42", "42", True, "42"),
    ("Answer: 42\n", "42", True, "42"),
    ("answer:42", "42", True, "42"),
    ("ANSWER :  42  ", "42", True, "42"),
    ("Answer: 41", "42", False, "41"),
    # the last Answer: line wins, even over a later box
    ("Answer: 7\nWait, I made an error.\nAnswer: 8", "8", True, "8"),
    ("Answer: 7\nWait.\nAnswer: 8", "7", False, "8"),
    ("Answer: 3\nso \\boxed{4}", "3", True, "3"),
    # "on its own line after Answer:" read literally
    ("Answer:\n\n42", "42", True, "42"),
    ("**Answer:**\n17", "17", True, "17"),
    ("**Answer:** 17", "17", True, "17"),
    ("**Answer: 17**", "17", True, "17"),
    ("Final Answer: The final answer is 9.", "9", True, "9"),
    # leading zeros, signs, commas, $, trailing period
    ("Answer: 042", "42", True, "42"),
    ("Answer: 33", "033", True, "33"),
    ("Answer: +5", "5", True, "5"),
    ("Answer: -5", "5", False, "-5"),
    ("Answer: \u22125", "-5", True, "-5"),
    ("Answer: 1,000", "1000", True, "1000"),
    ("Answer: 1{,}000", "1000", True, "1000"),
    ("Answer: $1,000$.", "1000", True, "1000"),
    ("Answer: \\$25", "25", True, "25"),
    ("Answer: 12.", "12", True, "12"),
    ("Answer: 12.0", "12", True, "12"),
    ("Answer: 1,2", "12", False, "1,2"),
    # \text{}, units, degrees, percent, x = ...
    ("Answer: 5 \\text{ cm}", "5", True, "5"),
    ("Answer: \\text{5}", "5", True, "5"),
    ("Answer: \\textbf{5}", "5", True, "5"),
    ("Answer: 42 degrees", "42", True, "42"),
    ("Answer: 45^\\circ", "45", True, "45"),
    ("Answer: 45^{\\circ}", "45", True, "45"),
    ("Answer: 50\\%", "50", True, "50"),
    ("Answer: x = 12", "12", True, "12"),
    ("Answer: $a+b+c = 110$", "110", True, "110"),
    ("Answer: \\(17\\)", "17", True, "17"),
    # fractions and decimals compared exactly
    ("Answer: \\frac{1}{2}", "0.5", True, "1/2"),
    ("Answer: \\dfrac{3}{6}", "1/2", True, "1/2"),
    ("Answer: \\tfrac{1}{2}", "\\frac{1}{2}", True, "1/2"),
    ("Answer: \\frac12", "0.5", True, "1/2"),
    ("Answer: -\\frac{3}{4}", "-0.75", True, "-3/4"),
    ("Answer: \\frac{-3}{4}", "-3/4", True, "-3/4"),
    ("Answer: 0.333", "1/3", False, "333/1000"),
    ("Answer: \\frac{6}{3}", "2", True, "2"),
    ("Answer: 1/0", "1", False, "1/0"),
    # \boxed{} fallback, balanced braces
    ("so the answer is \\boxed{42}.", "42", True, "42"),
    ("\\boxed{1} then \\boxed{2}", "2", True, "2"),
    ("$\\boxed{\\frac{1}{2}}$", "1/2", True, "1/2"),
    ("\\boxed{\\dfrac{10}{4}}", "2.5", True, "5/2"),
    ("\\boxed{5} and a truncated \\boxed{6", "5", True, "5"),
    ("\\boxed 7", "7", True, "7"),
    ("\\fbox{8}", "8", True, "8"),
    ("Answer: \\boxed{\\frac{1}{4}}", "0.25", True, "1/4"),
    # not numbers: strings compared without spaces; a number never equals a non-number
    ("Answer: 2\\pi", "2", False, "2\\pi"),
    ("Answer: 2 pi", "2", False, "2 pi"),
    ("Answer: \\sqrt{2}", "\\sqrt{2}", True, "\\sqrt{2}"),
    ("Answer: (1, 2)", "(1,2)", True, "(1, 2)"),
    ("Answer: $Answer", "3", False, "Answer"),
    # nothing to extract
    ("I don't know.", "42", False, INVALID),
    ("", "42", False, INVALID),
    ("Answer:", "42", False, INVALID),
    ("\\boxed{", "42", False, INVALID),
]


@pytest.mark.parametrize(("response", "gt", "acc", "pred"), CASES)
def test_tricky_cases(response, gt, acc, pred):
    result = compute_score("aime24", response, gt)
    assert result == {"score": 1.0 if acc else 0.0, "acc": acc, "pred": pred}


@pytest.mark.parametrize(
    ("a", "b", "equal"),
    [
        ("42", "042", True),
        ("1,000", "1000", True),
        ("\\frac{1}{2}", "0.5", True),
        ("\\dfrac{2}{4}", "\\frac{1}{2}", True),
        ("1/2", "2/4", True),
        ("0.50", ".5", True),
        ("\\boxed{7}", "7", True),
        ("$7$.", "7", True),
        ("7", "7.1", False),
        ("7", "x", False),
        ("x+1", "x + 1", True),
        ("", "", False),
    ],
)
def test_is_equiv(a, b, equal):
    assert is_equiv(a, b) is equal
    assert is_equiv(b, a) is equal


def test_parse_and_normalize():
    assert parse_number("\\frac{3}{9}") == Fraction(1, 3)
    assert parse_number("12 units") == 12
    assert parse_number("1" * 5000) is None  # longer than any answer: never int() it
    assert parse_number("abc") is None
    assert normalize_answer("\\left( 1 \\right)") == "( 1 )"
    assert normalize_answer("{{5}}") == "5"
    assert last_boxed("a \\boxed{x^{2}} b") == "x^{2}"
    assert last_boxed("no box") is None


def test_extraction_source():
    assert extract_answer("Answer: 5") == ("5", "answer")
    assert extract_answer("thus \\boxed{5}") == ("5", "boxed")
    assert extract_answer("nothing") == (None, "none")


def test_contract_keys_and_types():
    """verl stacks every key into one numpy array per key: the keys must never vary."""
    for response, gt, *_ in CASES:
        result = compute_score("math_dapo", response, gt, extra_info={"index": 3})
        assert set(result) == {"score", "acc", "pred"}
        assert isinstance(result["score"], float)
        assert isinstance(result["acc"], bool)
        assert isinstance(result["pred"], str) and result["pred"]


def test_keyword_call_like_verl_and_extra_kwargs():
    result = compute_score(
        data_source="aime25",
        solution_str="Answer: 7",
        ground_truth="7",
        extra_info={"num_turns": 2, "rollout_reward_scores": {}},
        reward_router_address=None,
        reward_model_tokenizer=None,
    )
    assert result["score"] == 1.0


def test_reward_kwargs_change_scores():
    wrong = compute_score("x", "Answer: 1", "2", correct_score=1.0, incorrect_score=-1.0)
    right = compute_score("x", "Answer: 2", "2", correct_score=2.0, incorrect_score=-1.0)
    assert (wrong["score"], right["score"]) == (-1.0, 2.0)


def test_ground_truth_variants():
    assert compute_score("x", "Answer: 5", 5)["acc"]
    assert compute_score("x", "Answer: 5", 5.0)["acc"]
    assert compute_score("x", "Answer: 5", ["4", "5"])["acc"]
    assert compute_score("x", "Answer: 5", {"ground_truth": "5"})["acc"]
    assert not compute_score("x", "Answer: 5", None)["acc"]
    assert not compute_score("x", "Answer: 5", [])["acc"]


def test_robust_on_random_and_degenerate_text():
    rng = random.Random(0)
    alphabet = list("0123456789{}$\\/.,-+ :\nAnswerboxed=frac") + ["Answer:", "\\boxed{", "\\frac"]
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 300))) for _ in range(2000)]
    texts += [
        "\\boxed{" * 20000,
        "Answer: " + "1" * 100_000,
        "Answer: " + "{" * 50_000 + "}" * 50_000,
        "answer " * 20_000,
        "\\boxed{" + "x" * 100_000,
    ]
    for text in texts:
        result = compute_score("aime24", text, "42")
        assert set(result) == {"score", "acc", "pred"}
        assert len(result["pred"]) <= 200


def test_import_is_light():
    """``pkg://`` imports the module in every reward worker: it must not pull in torch or verl."""
    code = (
        "import sys, pdmask.backends.verl.rewards as r; "
        "assert r.compute_score('a', 'Answer: 1', '1')['acc']; "
        "heavy = [m for m in ('torch', 'verl', 'numpy', 'pandas') if m in sys.modules]; "
        "print(heavy); sys.exit(1 if heavy else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ------------------------------------------------------------------------ verl 0.9.1 (real package)


@pytest.fixture(scope="module")
def verl():
    return pytest.importorskip("verl")


def _reward_config(**reward_kwargs):
    from omegaconf import OmegaConf

    return OmegaConf.create(
        {
            "reward": {
                "custom_reward_function": {
                    "path": REWARD_PATH,
                    "name": "compute_score",
                    "reward_kwargs": reward_kwargs,
                },
                "reward_manager": {"source": "register", "name": "naive"},
            }
        }
    )


@pytest.mark.verl
def test_pkg_path_loads_with_verls_loader(verl):
    from verl.utils.import_utils import load_extern_object

    fn = load_extern_object(module_path=REWARD_PATH, object_name="compute_score")
    assert fn is compute_score


@pytest.mark.verl
def test_get_custom_reward_fn_merges_reward_kwargs(verl):
    from verl.trainer.ppo.reward import get_custom_reward_fn

    fn = get_custom_reward_fn(_reward_config(incorrect_score=-1.0))
    wrong = fn(data_source="aime24", solution_str="Answer: 3", ground_truth="4", extra_info={})
    right = fn(data_source="aime24", solution_str="\\boxed{4}", ground_truth="4", extra_info={})
    assert (wrong["score"], right["score"]) == (-1.0, 1.0)


def _word_tokenizer(words):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["[UNK]", "<pad>", *words])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="<pad>")


@pytest.mark.verl
def test_naive_reward_manager_end_to_end(verl):
    """verl's own reward manager decodes a response and calls our function through the pkg:// path."""
    import numpy as np
    import torch
    from verl.trainer.ppo.reward import load_reward_manager

    from verl import DataProto

    tokenizer = _word_tokenizer(
        ["So", "the", "result", "is", "Answer", ":", "42", "41", "\\boxed{42}"]
    )
    manager = load_reward_manager(_reward_config(), tokenizer)

    def item(text, gt, prompt_len=3, resp_len=12):
        ids = tokenizer(text)["input_ids"]
        responses = torch.tensor([ids + [1] * (resp_len - len(ids))])
        mask = torch.tensor([[1] * (prompt_len + len(ids)) + [0] * (resp_len - len(ids))])
        return DataProto.from_dict(
            tensors={
                "prompts": torch.zeros(1, prompt_len, dtype=torch.long),
                "responses": responses,
                "attention_mask": mask,
            },
            non_tensors={
                "data_source": np.array(["aime24"], dtype=object),
                "reward_model": np.array([{"style": "rule", "ground_truth": gt}], dtype=object),
                "extra_info": np.array([{"index": 0}], dtype=object),
            },
        )

    results = {}
    for text, gt in [
        ("So the result is Answer : 42", "42"),
        ("So the result is \\boxed{42}", "042"),
        ("So Answer : 41", "42"),
        ("So the result", "42"),
    ]:
        results[text] = manager.loop.run_until_complete(manager.run_single(item(text, gt)))
    scores = [r["reward_score"] for r in results.values()]
    assert scores == [1.0, 1.0, 0.0, 0.0]
    first = next(iter(results.values()))
    assert first["reward_extra_info"] == {"score": 1.0, "acc": True, "pred": "42"}


@pytest.mark.verl
def test_validation_metrics_naming(verl):
    """Our keys give verl's ``acc`` metrics per data source (``val-core/aime24/acc/mean@16``)."""
    from verl.trainer.ppo.metric_utils import process_validation_metrics

    data_sources, uids, infos = [], [], {"score": [], "acc": [], "pred": []}
    for source, uid, k in [("aime24", "p1", 12), ("aime25", "p2", 4)]:
        for i in range(16):
            result = compute_score(source, f"Answer: {42 if i < k else 7}", "42")
            data_sources.append(source)
            uids.append(uid)
            for key, value in result.items():
                infos[key].append(value)
    metrics = process_validation_metrics(data_sources, uids, infos)
    assert metrics["aime24"]["acc"]["mean@16"] == pytest.approx(12 / 16)
    assert metrics["aime25"]["acc"]["mean@16"] == pytest.approx(4 / 16)
    assert "maj@16/mean" in metrics["aime24"]["acc"]  # ``pred`` enables majority voting
    assert "pred" not in metrics["aime24"]  # strings are not averaged
