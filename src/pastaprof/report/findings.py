"""Machine-readable output: findings, summaries and tables as one JSON document."""

from __future__ import annotations

import decimal
import math
from pathlib import Path
from typing import Any

import orjson

from pastaprof.store.outputs import write_output
from pastaprof.tools.base import Report, ordered_findings

JSON_FORMAT_VERSION = 1


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, decimal.Decimal):
        return int(v) if v == v.to_integral_value() else float(v)
    if isinstance(v, dict):
        return {str(k): _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


def reports_to_dict(reports: list[Report], source: str | None = None, max_rows: int | None = 1000) -> dict[str, Any]:
    """The JSON document: every finding flat (id, tool, severity, title, impact_ns, evidence,
    location), largest impact first (``ordered_findings``), plus each tool's summary and tables (rows capped at ``max_rows``)."""
    return _clean({
        "format_version": JSON_FORMAT_VERSION,
        "source": source,
        "findings": [f.to_dict() for f in ordered_findings(reports)],
        "tools": {
            r.tool: {
                "summary": r.summary,
                "tables": {name: t.slice(0, min(max_rows, t.num_rows)).to_pylist() if max_rows else t.to_pylist()
                           for name, t in r.tables.items()},
                "truncated": {name: t.num_rows for name, t in r.tables.items() if max_rows and t.num_rows > max_rows},
            }
            for r in reports
        },
    })


def write_json(reports: list[Report], path: str | Path, source: str | None = None) -> None:
    """Write the document whole or not at all, to what ``path`` names (``-``: standard output;
    a FIFO or device is written into, never replaced; see ``store.outputs``)."""
    data = orjson.dumps(reports_to_dict(reports, source), option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY)
    write_output(path, data + b"\n")
