"""DAPO-Math-17k (or the paper's filtered copy of it) and AIME24/AIME25 → VeRL RL parquet files.

Input: files the user downloaded; for training either DAPO-Math-17k (``--dapo``) or a local copy of
the paper's filtered set ``Jiawei415/DPAO_filter`` (``--paper-set``: its ``train/`` shards, and its
``test/aime24``, ``test/aime25`` files unless AIME files are given; ``paper_set.py``). The
manifest and the printed summary say which, and how the training set differs from the paper's (``.parquet``, ``.jsonl``, ``.json``, or a folder of them). Two
layouts are understood, with column names matched case-insensitively:

- **VeRL/DAPO layout** (``BytedTsinghua-SIA/DAPO-Math-17k``, also ``.../AIME-2024``):
  ``prompt`` (a list of chat messages, or a string) and ``reward_model.ground_truth``; the problem
  is the last user message with DAPO's instruction prefix and ``Remember to put your answer ...``
  suffix (or a ``Please reason step by step ... \\boxed{}`` or ``Let's think step by step ...
  \\boxed{}`` suffix) removed; the source id is ``extra_info.index`` when present.
- **Flat layout** (``HuggingFaceH4/aime_2024``, ``Maxwell-Jia/AIME_2024``, ``yentinglin/aime_2025``,
  ``opencompass/AIME2025``, ``math-ai/aime25``, ...): a problem column (``problem``, ``question``,
  ``prompt``, ``query``) and an answer column (``answer``, ``ground_truth``, ``final_answer``,
  ``label``, ``gt``); without an answer column, the last ``\\boxed{}`` of ``solution`` is used.
  The source id is ``id``/``problem_id``/``idx``/``url`` when present.

Every problem is re-wrapped in **one** template, :data:`PROMPT_TEMPLATE` (DAPO's), for training and
validation alike.

Filters, applied in this order to each dataset and counted separately:

1. ``empty_problem``: no problem text after removing the template (missing, null or blank);
2. ``non_integer_answer``: the ground truth is not an integer after light normalisation (surrounding
   ``$``, ``\\boxed{}``, a trailing period, ``+``, leading zeros and thousands commas ``1,000`` are
   accepted; ``12.0`` counts as ``12``); the kept ground truth is the canonical integer string;
3. ``duplicate_problem``: the same problem text (whitespace-collapsed) as an earlier kept row; the
   first occurrence is kept (``duplicate_conflicting_answer`` counts, among these, the ones whose
   answer differed from the kept row's);
4. ``overlaps_validation`` (training only, with ``decontaminate=True``): the problem text equals a
   validation problem. Without it, the overlap is only counted (``validation_overlap``).

Output (VeRL's RL dataset format, read by ``verl.utils.dataset.rl_dataset.RLHFDataset``):
``data_source`` (``math_dapo`` for training — the name verl's default scorer routes to its DAPO rule —
and ``aime24``/``aime25`` for validation, so VeRL logs ``val-core/aime24/acc/mean@16``), ``prompt``
(``[{"role": "user", "content": ...}]``), ``ability`` (``MATH``), ``reward_model``
(``{"style": "rule", "ground_truth": "<int>"}``) and ``extra_info``
(``{"split", "index", "source_id", "question"}``; ``index`` is the row number in its file).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from pdmask.backends.verl.data_files import (
    Layout,
    check_reward_model,
    columns_of,
    detect_layout,
    input_files,
    iter_rows,
    require_pyarrow,
)
from pdmask.backends.verl.paper_set import PAPER_SET, how_it_differs, paper_set_files
from pdmask.errors import ConfigError

PROMPT_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of the "
    "form Answer: $Answer (without quotes) where $Answer is the answer to the problem."
)
PROMPT_SUFFIX = 'Remember to put your answer on its own line after "Answer:".'
PROMPT_TEMPLATE = PROMPT_PREFIX + "\n\n{problem}\n\n" + PROMPT_SUFFIX

TRAIN_DATA_SOURCE = "math_dapo"
VAL_DATA_SOURCES = ("aime24", "aime25")
ABILITY = "MATH"
TRAIN_FILE = "dapo_math_train.parquet"
VAL_FILE = "aime_val.parquet"
MANIFEST_FILE = "manifest.json"

FILTERS = ("empty_problem", "non_integer_answer", "duplicate_problem", "overlaps_validation")

_PREFIX_PATTERN = re.compile(
    r"\ASolve the following math problem step by step\.[^\n]*?"
    r"where \$Answer is the answer to the problem\.?\s*"
)
_DAPO_SUFFIX = "Remember to put your answer on its own line after"
_BOXED_SUFFIX_RE = re.compile(  # the \boxed{} instructions of verl's math data recipes
    r"\s*(?:Please reason step by step,? and put your final answer within \\boxed\{\}\.?"
    r"|Let's think step by step and output the final answer within \\boxed\{\}\.?)\s*\Z"
)
_THOUSANDS_RE = re.compile(r"^[+-]?\d{1,3}(?:,\d{3})+$")
_DECIMAL_RE = re.compile(r"^[+-]?\d+(?:\.\d*)?$")


def format_prompt(problem: str) -> list[dict[str, str]]:
    """The chat prompt for one problem: a single user message in :data:`PROMPT_TEMPLATE`."""
    return [{"role": "user", "content": PROMPT_TEMPLATE.format(problem=problem)}]


def strip_template(text: str) -> str:
    """The bare problem of a prompt that may already carry DAPO's (or a ``\\boxed{}``) instruction."""
    text = text.strip()
    m = _PREFIX_PATTERN.match(text)
    if m:
        text = text[m.end() :]
    cut = text.rfind(_DAPO_SUFFIX)
    if cut >= 0:
        text = text[:cut]
    tail = max(0, len(text) - 200)  # the boxed instruction is short: search only the tail
    m = _BOXED_SUFFIX_RE.search(text, tail)
    if m:
        text = text[: m.start()]
    return text.strip()


def _prompt_string(value: Any) -> str:
    """The raw text of a ``prompt``/``problem`` cell: a string, or the last user message of a chat."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return str(value.get("content") or "")
    try:
        messages = list(value)
    except TypeError:
        return str(value)
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role", "user") == "user":
            return str(message.get("content") or "")
    return ""


def problem_text(value: Any) -> str:
    """The problem of a ``prompt``/``problem`` cell, without any instruction template."""
    return strip_template(_prompt_string(value))


def dedup_key(problem: str) -> str:
    return " ".join(problem.split())


def canonical_integer(value: Any) -> str | None:
    """``"34"`` for 34, ``"034"``, ``"34.0"``, ``"$34$"``, ``"\\boxed{34}"``, ``"1,000"``→``"1000"``; else None."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, dict):
        return canonical_integer(value.get("ground_truth"))
    if isinstance(value, list | tuple):
        return canonical_integer(value[0]) if len(value) == 1 else None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else None
    s = str(value).strip().strip("$").strip()
    if s.startswith("\\boxed{") and s.endswith("}"):
        s = s[len("\\boxed{") : -1]
    s = s.strip().strip("$").strip().rstrip(".").strip()
    if _THOUSANDS_RE.match(s):
        s = s.replace(",", "")
    if len(s) > 64 or not _DECIMAL_RE.match(s):
        return None
    number = Decimal(s)
    if number != number.to_integral_value():
        return None
    return str(int(number))


# ---------------------------------------------------------------------------------------- converting


@dataclass
class Record:
    problem: str
    ground_truth: str
    source_id: str


@dataclass
class DatasetReport:
    """What happened to one dataset: rows read, per-filter drops, rows kept."""

    name: str
    files: list[str] = field(default_factory=list)
    rows_read: int = 0
    dropped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FILTERS, 0))
    duplicate_conflicting_answer: int = 0
    validation_overlap: int = 0
    kept: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "files": self.files,
            "rows_read": self.rows_read,
            "dropped": dict(self.dropped),
            "duplicate_conflicting_answer": self.duplicate_conflicting_answer,
            "validation_overlap": self.validation_overlap,
            "kept": self.kept,
        }

    def lines(self) -> list[str]:
        out = [f"{self.name}: {self.rows_read} rows read from {len(self.files)} file(s)"]
        for name in FILTERS:
            if (
                name == "overlaps_validation"
                and not self.dropped[name]
                and not self.validation_overlap
            ):
                continue
            extra = ""
            if name == "duplicate_problem" and self.duplicate_conflicting_answer:
                extra = f" ({self.duplicate_conflicting_answer} with a different answer)"
            out.append(f"  - dropped {self.dropped[name]:>8}  {name}{extra}")
        if self.validation_overlap and not self.dropped["overlaps_validation"]:
            out.append(
                f"  - note: {self.validation_overlap} kept problem(s) also appear in the validation set "
                "(use --decontaminate to drop them)"
            )
        out.append(f"  = kept    {self.kept:>8}")
        return out


def _answer_value(row: dict, layout: Layout) -> Any:
    if layout.answer is not None:
        value = row.get(layout.answer)
        if layout.answer.lower() == "reward_model":
            return value.get("ground_truth") if isinstance(value, dict) else None
        return value
    from pdmask.backends.verl.rewards import last_boxed

    solution = row.get(layout.solution or "")
    return last_boxed(solution) if isinstance(solution, str) else None


def _source_id(row: dict, layout: Layout, fallback: str) -> str:
    if layout.extra_info:
        info = row.get(layout.extra_info)
        if isinstance(info, dict) and info.get("index") is not None:
            return str(info["index"])
    if layout.id and row.get(layout.id) is not None:
        return str(row[layout.id])
    return fallback


def load_records(
    name: str, paths: Sequence[str | os.PathLike[str]]
) -> tuple[list[Record], DatasetReport]:
    """Read, filter (empty, non-integer, duplicate) and return one dataset's records."""
    report = DatasetReport(name=name)
    files: list[Path] = []
    for path in paths:
        files.extend(input_files(path))
    layouts = {f: detect_layout(f, columns_of(f)) for f in files}  # fail before reading anything
    for f, layout in layouts.items():
        if layout.answer is not None and layout.answer.lower() == "reward_model":
            check_reward_model(f, layout.answer)
    kept: dict[str, Record] = {}
    problems: dict[str, tuple[str, str]] = {}  # raw prompt -> (problem, key); DAPO repeats ~100x
    answers: dict[Any, str | None] = {}
    for f in files:
        report.files.append(str(f.resolve()))
        layout = layouts[f]
        for i, row in enumerate(iter_rows(f, layout.columns)):
            report.rows_read += 1
            raw = _prompt_string(row.get(layout.problem))
            cached = problems.get(raw)
            if cached is None:
                problem = strip_template(raw)
                cached = problems[raw] = (problem, dedup_key(problem))
            problem, key = cached
            if not problem:
                report.dropped["empty_problem"] += 1
                continue
            value = _answer_value(row, layout)
            if isinstance(value, str | int) and not isinstance(value, bool):
                if value not in answers:
                    answers[value] = canonical_integer(value)
                answer = answers[value]
            else:
                answer = canonical_integer(value)
            if answer is None:
                report.dropped["non_integer_answer"] += 1
                continue
            first = kept.get(key)
            if first is not None:
                report.dropped["duplicate_problem"] += 1
                if first.ground_truth != answer:
                    report.duplicate_conflicting_answer += 1
                continue
            kept[key] = Record(problem, answer, _source_id(row, layout, f"{f.name}:{i}"))
    report.kept = len(kept)
    return list(kept.values()), report


def _table(rows: list[dict[str, Any]]):
    import pyarrow as pa

    schema = pa.schema(
        [
            ("data_source", pa.string()),
            ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
            ("ability", pa.string()),
            ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
            (
                "extra_info",
                pa.struct(
                    [
                        ("split", pa.string()),
                        ("index", pa.int64()),
                        ("source_id", pa.string()),
                        ("question", pa.string()),
                    ]
                ),
            ),
        ]
    )
    return pa.Table.from_pylist(rows, schema=schema)


def to_rows(records: Sequence[Record], data_source: str, split: str, start: int = 0) -> list[dict]:
    """VeRL RL rows for ``records`` (``extra_info.index`` counts from ``start``)."""
    return [
        {
            "data_source": data_source,
            "prompt": format_prompt(r.problem),
            "ability": ABILITY,
            "reward_model": {"style": "rule", "ground_truth": r.ground_truth},
            "extra_info": {
                "split": split,
                "index": start + i,
                "source_id": r.source_id,
                "question": r.problem,
            },
        }
        for i, r in enumerate(records)
    ]


def _write_parquet(rows: list[dict], path: Path) -> str:
    pq = require_pyarrow()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(_table(rows), tmp)
    os.replace(tmp, path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return digest


def default_data_dir() -> Path:
    from pdmask.paths import state_dir

    return state_dir() / "data"


def prepared_files(out_dir: str | os.PathLike[str] | None = None) -> dict[str, Path]:
    """Where :func:`prepare` writes: ``{"train": ..., "val": ..., "manifest": ...}``."""
    base = Path(out_dir).expanduser() if out_dir is not None else default_data_dir()
    return {"train": base / TRAIN_FILE, "val": base / VAL_FILE, "manifest": base / MANIFEST_FILE}


@dataclass
class PrepareResult:
    out_dir: Path
    written: dict[str, Path]
    counts: dict[str, int]
    reports: list[DatasetReport]
    training_set: str | None = None  # how the training set differs from the paper's

    def lines(self) -> list[str]:
        out: list[str] = []
        for report in self.reports:
            out.extend(report.lines())
        if self.training_set:
            out.append(f"training set: {self.training_set}")
        for kind, path in self.written.items():
            if kind == "manifest":
                out.append(f"wrote {path}")
            else:
                out.append(f"wrote {path} ({self.counts[kind]} rows)")
        return out


def prepare(
    dapo: Sequence[str | os.PathLike[str]] = (),
    aime24: Sequence[str | os.PathLike[str]] = (),
    aime25: Sequence[str | os.PathLike[str]] = (),
    out_dir: str | os.PathLike[str] | None = None,
    decontaminate: bool = False,
    paper_set: str | os.PathLike[str] | None = None,
) -> PrepareResult:
    """Convert the given sources; write the training and/or validation parquet and a manifest.

    ``paper_set``: a local copy of the paper's training set (:data:`paper_set.PAPER_SET`), in
    place of ``dapo``; its AIME files serve where ``aime24``/``aime25`` are not given. Every input
    is read and checked before anything is written.
    """
    if paper_set is not None:
        if dapo:
            raise ConfigError(
                "--dapo and --paper-set both name a training set: give one (--paper-set is the "
                f"paper's, {PAPER_SET})"
            )
        found = paper_set_files(paper_set)
        dapo, aime24, aime25 = found.train, aime24 or found.aime24, aime25 or found.aime25
    if not (dapo or aime24 or aime25):
        raise ConfigError(
            "nothing to prepare: give --dapo or --paper-set, and/or --aime24/--aime25 files"
        )
    targets = prepared_files(out_dir)

    reports: list[DatasetReport] = []
    val_records: dict[str, list[Record]] = {}
    for name, paths in (("aime24", aime24), ("aime25", aime25)):
        if paths:
            records, report = load_records(name, paths)
            val_records[name] = records
            reports.append(report)
    val_keys = {dedup_key(r.problem) for recs in val_records.values() for r in recs}

    train_records: list[Record] | None = None
    training_set = None
    if dapo:
        train_records, report = load_records("paper-set" if paper_set else "dapo", dapo)
        overlapping = [r for r in train_records if dedup_key(r.problem) in val_keys]
        report.validation_overlap = len(overlapping)
        if decontaminate and overlapping:
            train_records = [r for r in train_records if dedup_key(r.problem) not in val_keys]
            report.dropped["overlaps_validation"] = len(overlapping)
            report.kept = len(train_records)
        reports.insert(0, report)
        training_set = how_it_differs(paper_set is not None, report.kept, report.dropped)

    for report in reports:
        if report.kept == 0:
            raise ConfigError(
                f"{', '.join(report.files)}: no usable rows in {report.name} "
                f"({report.rows_read} read; dropped: {report.dropped})"
            )

    written: dict[str, Path] = {}
    counts: dict[str, int] = {}
    manifest_entries: dict[str, Any] = {}
    if train_records is not None:
        rows = to_rows(train_records, TRAIN_DATA_SOURCE, "train")
        digest = _write_parquet(rows, targets["train"])
        written["train"], counts["train"] = targets["train"], len(rows)
        manifest_entries["train"] = {
            "file": TRAIN_FILE,
            "rows": len(rows),
            "sha256": digest,
            "data_sources": {TRAIN_DATA_SOURCE: len(rows)},
            "decontaminated": decontaminate,
            "sources": {r.name: r.to_dict() for r in reports[:1]},
            "paper_set": paper_set is not None,
            "differs_from_paper": training_set,
        }
    if val_records:
        rows = []
        for name, records in val_records.items():
            rows.extend(to_rows(records, name, "test", start=len(rows)))
        digest = _write_parquet(rows, targets["val"])
        written["val"], counts["val"] = targets["val"], len(rows)
        manifest_entries["val"] = {
            "file": VAL_FILE,
            "rows": len(rows),
            "sha256": digest,
            "data_sources": {name: len(recs) for name, recs in val_records.items()},
            "sources": {r.name: r.to_dict() for r in reports if r.name in val_records},
        }
    _write_manifest(targets["manifest"], manifest_entries)
    written["manifest"] = targets["manifest"]
    return PrepareResult(targets["train"].parent, written, counts, reports, training_set)


def _write_manifest(path: Path, entries: dict[str, Any]) -> None:
    manifest: dict[str, Any] = {}
    if path.exists():
        try:
            manifest = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            manifest = {}
    manifest.update(entries)
    manifest["prompt_template"] = PROMPT_TEMPLATE
    manifest["filters"] = list(FILTERS)
    manifest["updated"] = datetime.now(UTC).isoformat(timespec="seconds")
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)
