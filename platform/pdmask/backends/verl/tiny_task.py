"""A verifiable task small enough for VeRL on two CPU cores: one-digit additions.

Prompt ``"7+5="``, answer ``"Answer: 12"``, scored by pdmask's own math reward
(``rewards.compute_score`` reads the text after ``Answer:``). Written in verl's RL parquet format
(``data_source``, ``prompt`` as chat messages, ``ability``, ``reward_model`` with the ground truth,
``extra_info``), like ``pdm data prepare``'s files, so the job builder treats both the same way.

Pure Python apart from pyarrow (a verl dependency) for the parquet files.
"""

from __future__ import annotations

import random
from pathlib import Path

# Bump when the problems, the split or the format change: the task's cache folder and every tiny
# model's cache key (its tokenizer and warm-up read the task) follow it.
VERSION = 1
DATA_SOURCE = "synth"  # verl logs val-core/synth/acc/mean@N, the embedded backend's name too
TRAIN_FILE = "train.parquet"
VAL_FILE = "val.parquet"


def problems() -> list[tuple[str, str]]:
    """Every ``(prompt, answer)`` of the task: a + b for one-digit a, b (100 problems)."""
    return [(f"{a}+{b}=", str(a + b)) for a in range(10) for b in range(10)]


def response_text(answer: str) -> str:
    """The completion the reward accepts (what the tiny model is briefly trained to write)."""
    return f"Answer: {answer}"


def split(seed: int = 0, val_size: int = 16) -> tuple[list, list]:
    """A fixed train / validation split of the problems."""
    items = problems()
    random.Random(seed).shuffle(items)
    return items[val_size:], items[:val_size]


def _rows(items: list[tuple[str, str]], split_name: str) -> list[dict]:
    return [
        {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": prompt}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": answer},
            "extra_info": {"split": split_name, "index": i},
        }
        for i, (prompt, answer) in enumerate(items)
    ]


def write_parquet(folder: Path) -> dict[str, Path]:
    """The train and validation parquet files in ``folder`` (written atomically)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    train, val = split()
    out = {}
    for name, items, file in (("train", train, TRAIN_FILE), ("val", val, VAL_FILE)):
        path = folder / file
        tmp = path.with_suffix(".tmp")
        pq.write_table(pa.Table.from_pylist(_rows(items, name)), tmp)
        tmp.replace(path)
        out[name] = path
    return out
