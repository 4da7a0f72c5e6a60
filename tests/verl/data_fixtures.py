"""The data fixtures of the verl data tests (tests/fixtures/data; make_fixtures.py there says
what each holds) and a prepared data folder made from them."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdmask.backends.verl import data as D

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "data"
DAPO = FIX / "dapo_mini.parquet"
DAPO_EXTRA = FIX / "dapo_extra.jsonl"
AIME24 = FIX / "aime24_mini.jsonl"
AIME24_VERL = FIX / "aime24_verl_mini.parquet"
AIME25 = FIX / "aime25_mini.parquet"
AIME25_II = FIX / "aime25_ii_mini.jsonl"
BOXED_ONLY = FIX / "aime_boxed_only.json"
BAD_NO_ANSWER = FIX / "bad_no_answer.jsonl"
BAD_NO_PROBLEM = FIX / "bad_no_problem.parquet"
PAPER_SET = FIX / "dpao_filter"  # a local copy of Jiawei415/DPAO_filter, in its layout

COLUMNS = ["data_source", "prompt", "ability", "reward_model", "extra_info"]


def read_rows(path):
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


@pytest.fixture
def prepared(tmp_path):
    out = tmp_path / "data"
    result = D.prepare(
        dapo=[DAPO, DAPO_EXTRA], aime24=[AIME24], aime25=[AIME25, AIME25_II], out_dir=out
    )
    return out, result
