"""`pdm data prepare` on the command line, and verl 0.9.1's own dataset reading what it wrote."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pdmask.backends.verl import data as D
from pdmask.cli import main as cli_main

from .data_fixtures import (
    AIME24_VERL,
    AIME25,
    BAD_NO_ANSWER,
    BAD_NO_PROBLEM,
    DAPO,
    DAPO_EXTRA,
    PAPER_SET,
    read_rows,
)

# -------------------------------------------------------------------------------------------- CLI


def _cli(args, capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main(args)
    captured = capsys.readouterr()
    return exc.value.code, captured.out, captured.err


def test_cli_prepare(tmp_path, capsys):
    code, out, err = _cli(
        [
            "data", "prepare",
            "--dapo", str(DAPO), "--dapo", str(DAPO_EXTRA),
            "--aime24", str(AIME24_VERL),
            "--aime25", str(AIME25),
            "--out", str(tmp_path),
        ],
        capsys,
    )  # fmt: skip
    assert code == 0, err
    assert "dapo: 36 rows read from 2 file(s)" in out
    assert "dropped        3  non_integer_answer" in out
    assert "= kept          19" in out
    assert "aime24: 12 rows read from 1 file(s)" in out
    assert f"wrote {tmp_path / D.TRAIN_FILE} (19 rows)" in out
    assert f"wrote {tmp_path / D.VAL_FILE} (8 rows)" in out


@pytest.mark.parametrize(
    ("flag", "path", "column"),
    [
        ("--aime24", BAD_NO_ANSWER, "no answer column"),
        ("--dapo", BAD_NO_PROBLEM, "no problem column"),
    ],
)
def test_cli_missing_column_exits_2(tmp_path, flag, path, column):
    """Run as a user would: a real process, exit status 2, the file and column named, no traceback."""
    env = {**os.environ, "PDM_HOME": str(tmp_path / "home")}
    proc = subprocess.run(
        [sys.executable, "-m", "pdmask", "data", "prepare", flag, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 2
    assert str(path) in proc.stderr and column in proc.stderr
    assert "expected one of:" in proc.stderr and "columns found:" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "home" / "data" / D.TRAIN_FILE).exists()


def test_cli_prepares_the_papers_set(tmp_path, capsys):
    code, out, err = _cli(
        ["data", "prepare", "--paper-set", str(PAPER_SET), "--out", str(tmp_path)], capsys
    )
    assert code == 0, err
    assert "paper-set: 6 rows read from 2 file(s)" in out
    assert "training set: the paper's training set, Jiawei415/DPAO_filter" in out
    assert f"wrote {tmp_path / D.VAL_FILE} (5 rows)" in out


def test_cli_errors(tmp_path, capsys):
    code, _, err = _cli(["data", "prepare", "--out", str(tmp_path)], capsys)
    assert code == 2 and "nothing to prepare" in err
    code, _, err = _cli(["data", "prepare", "--paper-set", str(tmp_path / "nowhere")], capsys)
    assert code == 2 and "nowhere: no such folder" in err
    code, _, err = _cli(["data", "prepare", "--dapo", str(tmp_path / "missing.parquet")], capsys)
    assert code == 2 and "missing.parquet: no such file or folder" in err
    (tmp_path / "x.csv").write_text("a,b\n")
    code, _, err = _cli(["data", "prepare", "--dapo", str(tmp_path / "x.csv")], capsys)
    assert code == 2 and "unsupported file type .csv" in err


# ------------------------------------------------------------------------ verl 0.9.1 (real package)


@pytest.fixture
def verl_dataset(monkeypatch, tmp_path):
    pytest.importorskip("verl")
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    def make(files, tokenizer=None, **cfg):
        config = OmegaConf.create({"cache_dir": str(tmp_path / "verl-cache"), **cfg})
        return RLHFDataset(data_files=[str(f) for f in files], tokenizer=tokenizer, config=config)

    environ = os.environ
    yield make
    # The overlong filter (datasets' map in workers) leaves a new os.environ object behind; rich
    # (typer's help and errors) keeps reading the original one, so a later in-process CLI test
    # would lose its COLUMNS. Put the original back, with what the test left in it.
    if os.environ is not environ:
        environ.clear()
        environ.update(os.environ)
        os.environ = environ  # noqa: B003 (the object itself is what rich holds)


@pytest.mark.verl
def test_rlhf_dataset_reads_output(prepared, verl_dataset):
    out, _ = prepared
    ds = verl_dataset([out / D.TRAIN_FILE, out / D.VAL_FILE], filter_overlong_prompts=False)
    assert len(ds) == 19 + 14
    row = ds[19]  # first validation row
    assert row["data_source"] == "aime24"
    assert row["raw_prompt"] == row["prompt"] and row["raw_prompt"][0]["role"] == "user"
    assert row["reward_model"]["ground_truth"] == "51"
    assert row["index"] == 0 and row["extra_info"]["split"] == "test"
    assert row["tools_kwargs"] == {} and row["interaction_kwargs"] == {}


@pytest.mark.verl
def test_rlhf_dataset_overlong_filter_with_tiny_tokenizer(prepared, verl_dataset):
    """verl applies the chat template to our ``prompt`` list; a word-level tokenizer is enough."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab={"[UNK]": 0, "<pad>": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="<pad>",
        chat_template=(
            "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }} {% endfor %}"
            "{% if add_generation_prompt %}assistant:{% endif %}"
        ),
    )
    out, _ = prepared
    train = read_rows(out / D.TRAIN_FILE)
    lengths = sorted(len(f"user: {r['prompt'][0]['content']} assistant:".split()) for r in train)
    limit = lengths[len(lengths) // 2]
    expected = sum(n <= limit for n in lengths)
    assert 0 < expected < len(lengths)
    ds = verl_dataset(
        [out / D.TRAIN_FILE],
        tokenizer=tokenizer,
        filter_overlong_prompts=True,
        filter_overlong_prompts_workers=1,
        max_prompt_length=limit,
    )
    assert len(ds) == expected
