"""Write an analysis's files: report, tables, per-seed and per-token CSVs, summary, plot."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from pdmask.analysis.plot import paired_plot
from pdmask.analysis.report import markdown_report, table_rows, write_table_csv
from pdmask.analysis.summary import summarize
from pdmask.analysis.tables import write_per_seed_csv, write_tokens_csv


def _json_safe(value: Any) -> Any:
    """NaN becomes null (strict JSON readers refuse NaN)."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def write_outputs(
    records: list[dict], meta: dict[str, Any], folder: Path
) -> tuple[dict[str, Any], dict[str, Path]]:
    summary = summarize(records)
    paths = {
        "report": folder / "report.md",
        "table": folder / "table.csv",
        "per_seed": folder / "per_seed.csv",
        "tokens": folder / "tokens.csv",
        "summary": folder / "summary.json",
        "plot": folder / "paired.png",
    }
    paths["report"].write_text(markdown_report(summary, meta))
    write_table_csv(table_rows(summary), paths["table"])
    write_per_seed_csv(records, paths["per_seed"])
    write_tokens_csv(records, paths["tokens"])
    paths["summary"].write_text(json.dumps(_json_safe({"meta": meta, **summary}), indent=2))
    paired_plot(summary, paths["plot"])
    return summary, paths
