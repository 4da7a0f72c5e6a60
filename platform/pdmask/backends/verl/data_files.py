"""Reading the user's data files: parquet, JSON lines or JSON arrays, and which columns hold what.

Column names are matched case-insensitively against the candidates below; a file without a problem
or an answer column is a ConfigError naming the file, what was expected and what was found.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from pdmask.errors import BackendUnavailable, ConfigError

SUPPORTED_SUFFIXES = (".parquet", ".jsonl", ".json")
PROBLEM_COLUMNS = ("problem", "question", "prompt", "query")
ANSWER_COLUMNS = ("reward_model", "ground_truth", "answer", "final_answer", "label", "gt")
SOLUTION_COLUMNS = ("solution",)
ID_COLUMNS = ("id", "problem_id", "idx", "url")


def require_pyarrow():
    try:
        import pyarrow  # noqa: F401
        import pyarrow.parquet as pq
    except ImportError as err:  # pragma: no cover - pyarrow comes with mlflow, datasets and verl
        raise BackendUnavailable(
            "reading and writing parquet needs pyarrow: pip install pyarrow (or pdmask[verl])"
        ) from err
    return pq


def input_files(path: str | os.PathLike[str]) -> list[Path]:
    """The data files named by ``path``: the file itself, or the supported files of a folder."""
    p = Path(path).expanduser()
    if not p.exists():
        raise ConfigError(f"{p}: no such file or folder")
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix in SUPPORTED_SUFFIXES)
        if not files:
            raise ConfigError(
                f"{p}: folder has no data files (looked for {', '.join(SUPPORTED_SUFFIXES)})"
            )
        return files
    if p.suffix not in SUPPORTED_SUFFIXES:
        raise ConfigError(
            f"{p}: unsupported file type {p.suffix or '(none)'}; expected {', '.join(SUPPORTED_SUFFIXES)}"
        )
    return [p]


def json_rows(path: Path) -> Iterator[dict]:
    """Rows of a JSON-lines file, or of a ``.json`` file holding an array (or ``{"data": [...]}``)."""
    if path.suffix == ".json":
        text = path.read_text(encoding="utf-8")
        try:
            doc = json.loads(text)
        except json.JSONDecodeError:
            doc = None  # not one JSON document: read it as JSON lines below
        if isinstance(doc, dict):
            lists = [v for v in doc.values() if isinstance(v, list)]
            doc = lists[0] if len(lists) == 1 else [doc]
        if isinstance(doc, list):
            for i, row in enumerate(doc):
                if not isinstance(row, dict):
                    raise ConfigError(f"{path}: item {i} is not a JSON object")
                yield row
            return
    with path.open("r", encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ConfigError(f"{path}:{lineno}: not valid JSON: {err.msg}") from err
            if not isinstance(row, dict):
                raise ConfigError(f"{path}:{lineno}: a row must be a JSON object")
            yield row


def columns_of(path: Path) -> list[str]:
    if path.suffix == ".parquet":
        pq = require_pyarrow()
        try:
            return list(pq.ParquetFile(path).schema_arrow.names)
        except Exception as err:  # noqa: BLE001 - any pyarrow error means "not a parquet file"
            raise ConfigError(f"{path}: not a readable parquet file: {err}") from err
    names: dict[str, None] = {}
    for i, row in enumerate(json_rows(path)):
        names.update(dict.fromkeys(row))
        if i >= 99:
            break
    return list(names)


def iter_rows(path: Path, columns: list[str]) -> Iterator[dict]:
    if path.suffix == ".parquet":
        pq = require_pyarrow()
        for batch in pq.ParquetFile(path).iter_batches(batch_size=8192, columns=columns):
            yield from batch.to_pylist()
    else:
        yield from json_rows(path)


def pick_column(available: Sequence[str], candidates: Sequence[str]) -> str | None:
    lower = {name.lower(): name for name in reversed(list(available))}
    for cand in candidates:
        if cand in lower:
            return lower[cand]
    return None


@dataclass(frozen=True)
class Layout:
    """Which columns of one file hold what."""

    problem: str
    answer: str | None  # None: the answer is the last \boxed{} of ``solution``
    solution: str | None
    id: str | None
    extra_info: str | None

    @property
    def columns(self) -> list[str]:
        cols = [self.problem, self.answer, self.solution, self.id, self.extra_info]
        return list(dict.fromkeys(c for c in cols if c))


def detect_layout(path: Path, columns: Sequence[str]) -> Layout:
    """The :class:`Layout` of a file, or a :class:`ConfigError` naming the file and missing column."""
    found = ", ".join(columns) or "(none)"
    problem = pick_column(columns, PROBLEM_COLUMNS)
    if problem is None:
        raise ConfigError(
            f"{path}: no problem column; expected one of: {', '.join(PROBLEM_COLUMNS)} "
            f"(case-insensitive; columns found: {found})"
        )
    answer = pick_column(columns, ANSWER_COLUMNS)
    solution = pick_column(columns, SOLUTION_COLUMNS)
    if answer is None and solution is None:
        raise ConfigError(
            f"{path}: no answer column; expected one of: {', '.join(ANSWER_COLUMNS)}, or a "
            f"'solution' column with a \\boxed{{}} answer (case-insensitive; columns found: {found})"
        )
    return Layout(
        problem=problem,
        answer=answer,
        solution=solution if answer is None else None,
        id=pick_column(columns, ID_COLUMNS),
        extra_info=pick_column(columns, ("extra_info",)),
    )


def check_reward_model(path: Path, column: str) -> None:
    """A ``reward_model`` column must carry ``ground_truth`` (a struct field / a JSON key)."""
    if path.suffix == ".parquet":
        import pyarrow as pa

        pq = require_pyarrow()
        kind = pq.ParquetFile(path).schema_arrow.field(column).type
        ok = pa.types.is_struct(kind) and kind.get_field_index("ground_truth") >= 0
        fields = (
            [kind.field(i).name for i in range(kind.num_fields)] if pa.types.is_struct(kind) else []
        )
    else:
        ok, fields = False, []
        for i, row in enumerate(json_rows(path)):
            value = row.get(column)
            if isinstance(value, dict):
                fields = list(value)
                ok = "ground_truth" in value
                break
            if i >= 99:
                break
    if not ok:
        raise ConfigError(
            f"{path}: column {column} has no ground_truth field "
            f"(fields found: {', '.join(fields) or 'none'})"
        )
