"""The paper's training set, ``Jiawei415/DPAO_filter``: a local copy's layout, and how a prepared
training set differs from it.

The paper (arXiv 2607.10848, appendix) trains on DAPO-Math-17k filtered to about 13k problems,
published on the Hugging Face Hub as ``Jiawei415/DPAO_filter``. Public copies of scripts that read
it (found in stored public code; the dataset itself was not available here) show its layout:
``train/`` holds the training shards and ``test/aime24.parquet``, ``test/aime25.parquet`` the
evaluation sets, all in verl's RL layout (``prompt`` as a list of chat messages,
``reward_model.ground_truth``, ``extra_info``; ``extra_info`` differs between shards, a struct
with ``index`` only in one and ``index`` and ``split`` in another, so the shards are read one by
one). How the paper filtered DAPO-Math-17k is not stated there.

A local copy is what ``huggingface-cli download Jiawei415/DPAO_filter --repo-type dataset
--local-dir DIR`` (or ``git clone``) leaves in ``DIR``; ``pdm data prepare --paper-set DIR``
converts it with pdmask's template and filters (``data.py``), which should drop nothing from an
already filtered set: what they drop is counted and said.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pdmask.backends.verl.data_files import SUPPORTED_SUFFIXES, input_files
from pdmask.errors import ConfigError

PAPER_SET = "Jiawei415/DPAO_filter"
PAPER_SET_SIZE = "about 13k"  # the paper's own figure for its filtered set
DAPO = "BytedTsinghua-SIA/DAPO-Math-17k"


@dataclass(frozen=True)
class PaperSetFiles:
    """The files of a local copy of the paper's set, by role."""

    train: list[Path]
    aime24: list[Path]
    aime25: list[Path]


def paper_set_files(root: str | os.PathLike[str]) -> PaperSetFiles:
    """The training shards and AIME files of a local copy of :data:`PAPER_SET` at ``root``, or a
    ``ConfigError`` naming the folder and what it lacks."""
    base = Path(root).expanduser()
    if not base.is_dir():
        raise ConfigError(f"{base}: no such folder (a local copy of {PAPER_SET})")
    train = base / "train"
    if not train.is_dir():
        found = ", ".join(sorted(p.name for p in base.iterdir())) or "nothing"
        raise ConfigError(
            f"{base}: not a local copy of {PAPER_SET}: no train/ folder with its training shards "
            f"(found: {found})"
        )

    def test_file(name: str) -> list[Path]:
        return [
            f for f in sorted((base / "test").glob(f"{name}.*")) if f.suffix in SUPPORTED_SUFFIXES
        ]

    return PaperSetFiles(input_files(train), test_file("aime24"), test_file("aime25"))


def how_it_differs(paper_set: bool, kept: int, dropped: dict[str, int]) -> str:
    """One sentence on how a prepared training set of ``kept`` problems (``dropped``: pdmask's
    filter counts) differs from the paper's."""
    drops = ", ".join(f"{n} {name}" for name, n in dropped.items() if n)
    if paper_set:
        if not drops:
            return f"the paper's training set, {PAPER_SET}: {kept} problems, as published"
        return (
            f"the paper's training set, {PAPER_SET}, less what pdmask's filters dropped "
            f"({drops}): {kept} problems"
        )
    return (
        f"not the paper's training set: {DAPO} with pdmask's filters only"
        + (f" ({drops} dropped)" if drops else "")
        + f", {kept} problems; the paper trains on {PAPER_SET} ({PAPER_SET_SIZE} problems), "
        "DAPO-Math-17k filtered further by criteria it does not publish here "
        "(pdm data prepare --paper-set DIR converts a local copy)"
    )
