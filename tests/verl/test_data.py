"""DAPO-Math / AIME preparation (pdmask.backends.verl.data, `pdm data prepare`) on shipped fixtures:
the helpers, reading and filtering, and what `prepare` writes."""

from __future__ import annotations

import json

import pytest

from pdmask.backends.verl import data as D
from pdmask.errors import ConfigError

from .data_fixtures import (
    AIME24,
    AIME24_VERL,
    AIME25,
    AIME25_II,
    BAD_NO_ANSWER,
    BOXED_ONLY,
    COLUMNS,
    DAPO,
    DAPO_EXTRA,
    PAPER_SET,
    read_rows,
)

# ------------------------------------------------------------------------------------------ helpers


def test_template_round_trip():
    content = D.format_prompt("What is $1+1$?")[0]["content"]
    assert content.startswith("Solve the following math problem step by step.")
    assert content.endswith('Remember to put your answer on its own line after "Answer:".')
    assert "\n\nWhat is $1+1$?\n\n" in content
    assert D.strip_template(content) == "What is $1+1$?"
    boxed_style = (
        "Find $x$. Please reason step by step, and put your final answer within \\boxed{}."
    )
    assert D.strip_template(boxed_style) == "Find $x$."
    verl_style = "Find $x$. Let's think step by step and output the final answer within \\boxed{}."
    assert D.strip_template(verl_style) == "Find $x$."


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("34", "34"),
        (34, "34"),
        (34.0, "34"),
        ("034", "34"),
        (" 34 ", "34"),
        ("+34", "34"),
        ("-4", "-4"),
        ("12.0", "12"),
        ("12.", "12"),
        ("1,000", "1000"),
        ("$34$", "34"),
        ("\\boxed{34}", "34"),
        (["34"], "34"),
        ({"ground_truth": "34"}, "34"),
        ("3.5", None),
        ("\\frac{1}{2}", None),
        ("x+1", None),
        ("1e3", None),
        ("NaN", None),
        ("", None),
        (None, None),
        (True, None),
        (float("inf"), None),
        (["1", "2"], None),
    ],
)
def test_canonical_integer(value, expected):
    assert D.canonical_integer(value) == expected


def test_problem_text_variants():
    wrapped = D.format_prompt("Find $n$.")
    assert D.problem_text(wrapped) == "Find $n$."
    assert D.problem_text("Find $n$.") == "Find $n$."
    system_and_user = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Find $n$."},
    ]
    assert D.problem_text(system_and_user) == "Find $n$."
    assert D.problem_text([{"role": "system", "content": "only a system message"}]) == ""
    assert D.problem_text(None) == ""


# ---------------------------------------------------------------------------------- reading + filters


def test_dapo_filters_and_counts():
    records, report = D.load_records("dapo", [DAPO])
    assert report.rows_read == 31
    assert report.dropped == {
        "empty_problem": 3,
        "non_integer_answer": 3,
        "duplicate_problem": 9,
        "overlaps_validation": 0,
    }
    assert report.duplicate_conflicting_answer == 1
    assert report.kept == len(records) == 16
    answers = {r.problem: r.ground_truth for r in records}
    # odd but valid integer spellings are kept in canonical form
    assert answers["Compute $10^3$."] == "1000"
    assert answers["Compute $\\frac{24}{2}$."] == "12"
    assert answers["Compute $1 - 5$."] == "-4"
    # the first occurrence wins over a later conflicting duplicate
    assert answers["What is the sum of the first 4 positive integers?"] == "10"
    # the template is stripped: no problem text carries the instruction
    assert not any("Solve the following" in p or "Remember to put" in p for p in answers)
    # DAPO's uuid index is kept as the source id
    assert all(len(r.source_id) == 36 for r in records)


def test_duplicates_across_files_and_string_prompts():
    records, report = D.load_records("dapo", [DAPO, DAPO_EXTRA])
    assert report.rows_read == 31 + 5
    assert report.dropped["duplicate_problem"] == 9 + 2
    assert report.kept == 16 + 3
    assert {"Compute $2^{10}$.", "Compute $3^4$.", "Compute $\\binom{5}{2}$."} <= {
        r.problem for r in records
    }


@pytest.mark.parametrize(
    ("path", "rows_read", "kept", "dropped"),
    [
        (AIME24, 7, 5, {"non_integer_answer": 1, "duplicate_problem": 1}),  # H4 layout
        (AIME24_VERL, 12, 3, {"duplicate_problem": 9}),  # VeRL layout, repeated 4x
        (AIME25, 5, 5, {}),  # question / int answer
        (AIME25_II, 4, 4, {}),  # capitalised Problem / Answer
        (BOXED_ONLY, 3, 3, {}),  # JSON array, answer only in \boxed{} of solution
    ],
)
def test_aime_layouts(path, rows_read, kept, dropped):
    records, report = D.load_records("aime", [path])
    assert (report.rows_read, report.kept, len(records)) == (rows_read, kept, kept)
    assert {k: v for k, v in report.dropped.items() if v} == dropped
    assert all(D.canonical_integer(r.ground_truth) == r.ground_truth for r in records)


def test_boxed_only_takes_the_last_box():
    records, _ = D.load_records("aime", [BOXED_ONLY])
    assert [r.ground_truth for r in records] == ["42", "99", "4"]


def test_folder_input(tmp_path):
    folder = tmp_path / "aime25"
    (folder / "data").mkdir(parents=True)
    for src in (AIME25, AIME25_II):
        (folder / "data" / src.name).write_bytes(src.read_bytes())
    (folder / "README.md").write_text("ignored\n")
    records, report = D.load_records("aime25", [folder])
    assert len(report.files) == 2 and report.kept == 9


# ---------------------------------------------------------------------------------------- prepare


def test_prepare_writes_verl_schema(prepared):
    import pyarrow as pa
    import pyarrow.parquet as pq

    out, result = prepared
    assert result.counts == {"train": 19, "val": 14}
    assert set(result.written) == {"train", "val", "manifest"}
    for kind in ("train", "val"):
        schema = pq.read_schema(out / (D.TRAIN_FILE if kind == "train" else D.VAL_FILE))
        assert schema.names == COLUMNS
        assert schema.field("prompt").type == pa.list_(
            pa.struct([("role", pa.string()), ("content", pa.string())])
        )
        assert schema.field("reward_model").type.get_field_index("ground_truth") >= 0
        assert schema.field("extra_info").type.get_field_index("index") >= 0

    train = read_rows(out / D.TRAIN_FILE)
    assert len(train) == 19
    assert {r["data_source"] for r in train} == {"math_dapo"}
    assert [r["extra_info"]["index"] for r in train] == list(range(19))
    for row in train:
        assert row["ability"] == "MATH"
        assert row["reward_model"]["style"] == "rule"
        assert (
            D.canonical_integer(row["reward_model"]["ground_truth"])
            == row["reward_model"]["ground_truth"]
        )
        assert row["extra_info"]["split"] == "train"
        (message,) = row["prompt"]
        assert message["role"] == "user"
        assert message["content"] == D.PROMPT_TEMPLATE.format(problem=row["extra_info"]["question"])

    val = read_rows(out / D.VAL_FILE)
    sources = [r["data_source"] for r in val]
    assert sources.count("aime24") == 5 and sources.count("aime25") == 9
    assert [r["extra_info"]["index"] for r in val] == list(range(14))
    assert {r["extra_info"]["split"] for r in val} == {"test"}
    assert val[0]["extra_info"]["source_id"] == "2024-I-1"
    assert val[0]["reward_model"]["ground_truth"] == "51"  # "051" in the source


def test_prepare_readable_by_pandas(prepared):
    import pandas as pd

    out, _ = prepared
    df = pd.read_parquet(out / D.TRAIN_FILE)
    assert list(df.columns) == COLUMNS and len(df) == 19
    first = df.iloc[0]
    assert first["reward_model"]["ground_truth"] == "6"
    assert first["prompt"][0]["role"] == "user"


def test_manifest_and_printed_summary(prepared):
    out, result = prepared
    manifest = json.loads((out / D.MANIFEST_FILE).read_text())
    assert manifest["prompt_template"] == D.PROMPT_TEMPLATE
    assert manifest["train"]["rows"] == 19
    assert manifest["train"]["sources"]["dapo"]["dropped"]["duplicate_problem"] == 11
    assert manifest["train"]["sources"]["dapo"]["validation_overlap"] == 1
    assert manifest["val"]["data_sources"] == {"aime24": 5, "aime25": 9}
    assert len(manifest["val"]["sha256"]) == 64
    text = "\n".join(result.lines())
    assert "dropped       11  duplicate_problem (1 with a different answer)" in text
    assert "1 kept problem(s) also appear in the validation set" in text
    assert f"wrote {out / D.TRAIN_FILE} (19 rows)" in text


def test_prepare_is_deterministic(tmp_path):
    a = D.prepare(dapo=[DAPO], aime24=[AIME24], out_dir=tmp_path / "a")
    b = D.prepare(dapo=[DAPO], aime24=[AIME24], out_dir=tmp_path / "b")
    ma = json.loads(a.written["manifest"].read_text())
    mb = json.loads(b.written["manifest"].read_text())
    assert ma["train"]["sha256"] == mb["train"]["sha256"]
    assert ma["val"]["sha256"] == mb["val"]["sha256"]


def test_decontaminate(tmp_path):
    result = D.prepare(dapo=[DAPO], aime24=[AIME24], out_dir=tmp_path, decontaminate=True)
    assert result.counts["train"] == 15
    assert result.reports[0].dropped["overlaps_validation"] == 1
    problems = {r["extra_info"]["question"] for r in read_rows(tmp_path / D.TRAIN_FILE)}
    assert "Compute $17 \\times 3$." not in problems


def test_partial_prepare_keeps_other_manifest_entry(tmp_path):
    D.prepare(dapo=[DAPO], out_dir=tmp_path)
    D.prepare(aime25=[AIME25], out_dir=tmp_path)
    manifest = json.loads((tmp_path / D.MANIFEST_FILE).read_text())
    assert manifest["train"]["rows"] == 16 and manifest["val"]["rows"] == 5


def test_default_out_dir_is_state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("PDM_HOME", str(tmp_path / "home"))
    result = D.prepare(aime24=[AIME24])
    assert result.written["val"] == tmp_path / "home" / "data" / D.VAL_FILE
    assert D.prepared_files()["train"] == tmp_path / "home" / "data" / D.TRAIN_FILE


def test_bad_input_writes_nothing(tmp_path):
    with pytest.raises(ConfigError):
        D.prepare(dapo=[DAPO], aime24=[BAD_NO_ANSWER], out_dir=tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (
            lambda p: p.write_text('{"problem": "x", "answer": "1"}\nnot json\n'),
            ":2: not valid JSON",
        ),
        (
            lambda p: p.write_text('{"prompt": "x", "reward_model": {"style": "rule"}}\n'),
            "ground_truth",
        ),
        (lambda p: p.write_text("[1, 2]"), "is not a JSON object"),
    ],
)
def test_malformed_files(tmp_path, make, needle):
    path = tmp_path / ("bad.json" if "JSON object" in needle else "bad.jsonl")
    make(path)
    with pytest.raises(ConfigError) as err:
        D.prepare(aime24=[path], out_dir=tmp_path / "out")
    assert str(path) in str(err.value) and needle in str(err.value)


def test_reward_model_struct_without_ground_truth(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "verl_layout.parquet"
    pq.write_table(
        pa.Table.from_pylist(
            [{"prompt": [{"role": "user", "content": "x"}], "reward_model": {"style": "rule"}}]
        ),
        path,
    )
    with pytest.raises(ConfigError, match="column reward_model has no ground_truth field"):
        D.prepare(dapo=[path], out_dir=tmp_path / "out")


def test_the_papers_set_from_a_local_copy(tmp_path):
    """Its train/ shards (extra_info typed differently per shard) for training, its test/ AIME
    files for validation, in pdmask's one template; what the filters drop is said."""
    from pdmask.backends.verl.paper_set import PAPER_SET as NAME

    result = D.prepare(paper_set=PAPER_SET, out_dir=tmp_path)
    assert result.counts == {"train": 5, "val": 5}
    (report, *_) = result.reports
    assert report.name == "paper-set" and len(report.files) == 2 and report.rows_read == 6
    assert report.dropped["non_integer_answer"] == 1
    train = read_rows(tmp_path / D.TRAIN_FILE)
    assert {r["extra_info"]["source_id"] for r in train} == {"p0", "p1", "p2", "q0", "q2"}
    for row in train:  # verl's boxed instruction replaced by the template every job's data has
        question = row["extra_info"]["question"]
        assert "boxed" not in question and question.startswith(("Compute", "How many"))
        assert row["prompt"][0]["content"] == D.PROMPT_TEMPLATE.format(problem=question)
    val = read_rows(tmp_path / D.VAL_FILE)
    assert [r["data_source"] for r in val] == ["aime24"] * 3 + ["aime25"] * 2
    manifest = json.loads((tmp_path / D.MANIFEST_FILE).read_text())
    assert manifest["train"]["paper_set"] is True
    said = manifest["train"]["differs_from_paper"]
    assert said.startswith(f"the paper's training set, {NAME}") and "1 non_integer_answer" in said
    assert f"training set: {said}" in result.lines()


def test_a_dapo_set_says_how_it_differs_from_the_papers(tmp_path):
    result = D.prepare(dapo=[DAPO], aime24=[AIME24], paper_set=None, out_dir=tmp_path)
    said = json.loads((tmp_path / D.MANIFEST_FILE).read_text())["train"]["differs_from_paper"]
    assert said.startswith("not the paper's training set") and "16 problems" in said
    assert "Jiawei415/DPAO_filter (about 13k problems)" in said and "--paper-set" in said
    assert "9 duplicate_problem" in said and f"training set: {said}" in result.lines()
    # AIME files given beside the paper's set replace its own
    mixed = D.prepare(paper_set=PAPER_SET, aime24=[AIME24], out_dir=tmp_path / "mixed")
    sources = [r["data_source"] for r in read_rows(tmp_path / "mixed" / D.VAL_FILE)]
    assert sources == ["aime24"] * 5 + ["aime25"] * 2 and mixed.counts["train"] == 5


def test_the_papers_set_refuses_what_is_not_a_copy_of_it(tmp_path):
    with pytest.raises(ConfigError, match="both name a training set"):
        D.prepare(dapo=[DAPO], paper_set=PAPER_SET, out_dir=tmp_path / "out")
    (tmp_path / "elsewhere" / "data").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"elsewhere: not a local copy .*found: data"):
        D.prepare(paper_set=tmp_path / "elsewhere", out_dir=tmp_path / "out")
    assert not (tmp_path / "out").exists()
