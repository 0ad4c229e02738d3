"""HTML fragments any Report renders to: findings, summaries, sortable tables.

A tool nobody here knows about still gets a full section (its summary, findings and every
table), so tools added later appear without changes.  Every string from a report passes
``html.escape`` (attributes with quotes escaped too); numbers are formatted by the terminal's
unit rules (``format_value``: ``*_ns`` durations, ``*bytes*`` sizes, shares), and a numeric
cell keeps its raw value in ``data-v`` so sorting compares numbers, not text.
"""

from __future__ import annotations

import html
import math
import re
from typing import Any

import orjson
import pyarrow as pa

from pastaprof.report.names import short_names
from pastaprof.report.terminal import NAME_COLUMNS, format_value
from pastaprof.tools.base import Finding, Report

MAX_TABLE_ROWS = 300
_SLUG = re.compile(r"[^a-z0-9]+")


def esc(text: Any) -> str:
    return html.escape("" if text is None else str(text), quote=True)


def slug(*parts: Any) -> str:
    """An element id from names (only [a-z0-9-], so it is safe in attributes and URLs)."""
    return "-".join(_SLUG.sub("-", str(p).lower()).strip("-") or "x" for p in parts)


class Page:
    """What the sections produce besides HTML: the chart specs, by element id."""

    def __init__(self) -> None:
        self.charts: dict[str, dict[str, Any]] = {}
        self.nav: list[tuple[str, str]] = []

    def chart(self, spec: dict[str, Any] | None, note: str = "") -> str:
        if spec is None:
            return ""
        cid = f"chart-{len(self.charts)}"
        self.charts[cid] = spec
        caption = f'<p class="note">{esc(note)}</p>' if note else ""
        return f'<div class="chart" id="{cid}"></div>{caption}'

    def section(self, anchor: str, title: str, body: str, lead: str = "") -> str:
        self.nav.append((anchor, title))
        intro = f'<p class="lead">{esc(lead)}</p>' if lead else ""
        return f'<section id="{anchor}"><h2>{esc(title)}</h2>{intro}{body}</section>'


def _cell(column: str, v: Any, shown: str | None = None) -> str:
    if isinstance(v, (dict, list)):
        text = orjson.dumps(v, option=orjson.OPT_SERIALIZE_NUMPY, default=str).decode()
        return f"<td class=\"txt\">{esc(text if len(text) < 200 else text[:199] + '…')}</td>"
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        raw = v if not isinstance(v, float) or math.isfinite(v) else ""
        return f'<td class="num" data-v="{esc(raw)}">{esc(format_value(column, v))}</td>'
    if shown is not None and v is not None and shown != str(v):
        return f'<td class="txt" title="{esc(v)}">{esc(shown)}</td>'
    return f'<td class="txt">{esc(format_value(column, v) if shown is None else shown)}</td>'


def table_html(title: str, table: pa.Table, anchor: str, max_rows: int = MAX_TABLE_ROWS) -> str:
    """A sortable table of the first ``max_rows`` rows (a tool's own order), with a row count.
    Columns null in every row (a CPU-only run's GPU columns) are left out, said beside the count."""
    empty = [c for c in table.column_names if table[c].null_count == table.num_rows > 0]
    if not empty or len(empty) == table.num_columns:
        empty = []
    table = table.drop_columns(empty) if empty else table
    rows = table.slice(0, min(max_rows, table.num_rows)).to_pylist()  # no columns: slice() makes rows
    cols = table.column_names
    shown: dict[str, list[str | None]] = {}
    for c in cols:
        if c in NAME_COLUMNS:
            texts = [r[c] for r in rows]
            strs = [t for t in texts if isinstance(t, str)]
            it = iter(short_names(strs))
            shown[c] = [next(it) if isinstance(t, str) else None for t in texts]
    head = "".join(f'<th data-col="{i}" title="sort by {esc(c)}">{esc(c)}</th>' for i, c in enumerate(cols))
    body = "".join(
        "<tr>" + "".join(_cell(c, r[c], shown[c][i] if c in shown else None) for c in cols) + "</tr>"
        for i, r in enumerate(rows))
    count = (f"{table.num_rows:,} rows" if table.num_rows <= max_rows else
             f"the first {max_rows:,} of {table.num_rows:,} rows (the JSON output, --json, has all)")
    if empty:
        count += f"; {len(empty)} empty column{'s' if len(empty) > 1 else ''} left out ({', '.join(empty)})"
    if not table.num_rows:
        return f'<h3>{esc(title)}</h3><p class="note">no rows</p>'
    return (f'<h3 id="{anchor}">{esc(title)} <span class="count">{esc(count)}</span></h3>'
            f'<div class="scroll"><table class="sortable" data-rows="{len(rows)}"><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table></div>")


def summary_html(summary: dict[str, Any]) -> str:
    """Headline numbers as a definition list; nested values (per-rank lists) folded away."""
    items, nested = [], []
    for k, v in summary.items():
        if isinstance(v, (dict, list)):
            text = orjson.dumps(v, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY, default=str).decode()
            nested.append(f"<details><summary>{esc(k)}</summary><pre>{esc(text[:20000])}</pre></details>")
        else:
            items.append(f"<dt>{esc(k)}</dt><dd>{esc(format_value(str(k), v))}</dd>")
    dl = f'<dl class="summary">{"".join(items)}</dl>' if items else ""
    return dl + "".join(nested)


def _impact(f: Finding) -> str:
    """The time at stake, and the bytes at stake of a finding measured in bytes."""
    text = format_value("impact_ns", f.impact_ns) if f.impact_ns is not None else "-"
    return text + (f" ({format_value('impact_bytes', f.impact_bytes)})" if f.impact_bytes is not None else "")


def findings_html(findings: list[Finding]) -> str:
    """One row per finding, largest time at stake first, evidence folded under its title."""
    if not findings:
        return '<p class="note">no findings</p>'
    rows = []
    for i, f in enumerate(findings, 1):
        ev = "".join(f"<li><b>{esc(k)}</b>: {esc(format_value(str(k), v))}</li>" for k, v in f.evidence.items())
        rows.append(
            f'<tr class="finding sev-{esc(f.severity)}"><td class="num" data-v="{i}">{i}</td>'
            f'<td class="txt"><span class="badge {esc(f.severity)}">{esc(f.severity)}</span></td>'
            f'<td class="num" data-v="{esc(f.impact_ns if f.impact_ns is not None else -1)}">{esc(_impact(f))}</td>'
            f'<td class="txt"><details><summary>{esc(f.title)}</summary><ul>{ev}</ul>'
            f'<p class="note">id {esc(f.id)}</p></details></td>'
            f'<td class="txt loc">{esc(f.location or "")}</td><td class="txt">{esc(f.tool)}</td></tr>')
    head = "".join(f'<th data-col="{i}">{h}</th>' for i, h in
                   enumerate(("#", "severity", "time at stake", "finding", "where", "tool")))
    return (f'<div class="scroll"><table class="sortable findings" data-rows="{len(rows)}"><thead><tr>{head}</tr>'
            f'</thead><tbody>{"".join(rows)}</tbody></table></div>')


def report_html(report: Report, page: Page, charts: str = "") -> str:
    """A tool's whole section: its dedicated charts (if any), summary, findings, every table."""
    parts = [charts, summary_html(report.summary)]
    if report.findings:
        parts.append(f"<h3>findings of {esc(report.tool)}</h3>")
        parts.append(findings_html(sorted(report.findings, key=Finding.sort_key)))
    for name, table in report.tables.items():
        parts.append(table_html(name, table, slug("t", report.tool, name)))
    if not report.tables and not report.summary:
        parts.append('<p class="note">no results</p>')
    return page.section(slug("tool", report.tool), f"{report.tool}", "".join(parts))
