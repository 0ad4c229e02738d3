"""Rendering reports as rich tables in the terminal.

Every string a report carries (tool, table and column names, cells, summary keys
and values, finding titles, locations, evidence) goes through :func:`markup_safe`
here, so no tool's names can send control sequences to the terminal or be read as
rich markup; a new tool gets that without doing anything.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

import pyarrow as pa
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from pastaprof.report.names import short_kernel_name, terminal_safe
from pastaprof.tools.base import Report

MAX_ROWS = 15
EPOCH_NS_MIN = 10**17  # a *_ns value this large is a timestamp (after 1973), not a duration
MAX_NAME = 70
NAME_COLUMNS = {"name", "kernel", "dominant_kernel", "location"}
MIN_WIDTH = 150  # when not on a terminal (piped, CI logs), don't squeeze tables into 80 columns
SEVERITY_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}


def markup_safe(text: object) -> str:
    """``text`` as rich markup that prints it literally: control characters escaped, brackets too.
    A trailing backslash is written ``\\x5c``: rich would read it as escaping the markup that
    follows, and doubles it where nothing follows."""
    safe = terminal_safe(str(text))
    if safe.endswith("\\"):
        safe = safe[:-1] + "\\x5c"
    return escape(safe)


def _fmt_ns(v: int | float) -> str:
    v = float(v)
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if abs(v) >= scale:
            return f"{v / scale:,.2f} {unit}"
    return f"{v:,.0f} ns"


def _fmt_time(ns: int) -> str:
    """An absolute Unix-epoch timestamp as UTC time of day with microseconds."""
    t = _dt.datetime.fromtimestamp(ns // 1_000_000_000, _dt.timezone.utc)
    return f"{t:%H:%M:%S}.{(ns % 1_000_000_000) // 1000:06d}"


def _fmt_bytes(v: int | float) -> str:
    v = float(v)
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(v) >= scale:
            return f"{v / scale:,.2f} {unit}"
    return f"{v:,.0f} B"


def format_value(column: str, v: Any) -> str:
    """Human formatting chosen by column name (``*_ns`` durations, ``*bytes*`` sizes, shares)."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else ""
    if isinstance(v, (int, float)):
        if (column.endswith("_ns") or column == "ns") and abs(v) >= EPOCH_NS_MIN:
            return _fmt_time(int(v))
        if column.endswith("_ns") or column == "ns":
            return _fmt_ns(v)
        if "bytes" in column:
            return _fmt_bytes(v)
        if column in ("share",) or column.endswith("_share") or column.endswith("_frac"):
            return f"{100 * v:.1f}%"
        if column.endswith("_pct"):
            return f"{v:.2f}%"
        if isinstance(v, float):
            return f"{v:,.2f}"
        return f"{v:,}"
    s = str(v)
    if column in NAME_COLUMNS:
        s = short_kernel_name(s)
    return s if len(s) <= MAX_NAME else s[: MAX_NAME - 1] + "…"


def render_table(title: str, table: pa.Table, max_rows: int = MAX_ROWS) -> Table:
    out = Table(title=markup_safe(title), title_justify="left", show_lines=False, header_style="bold")
    numeric = {f.name for f in table.schema if pa.types.is_integer(f.type) or pa.types.is_floating(f.type)
               or pa.types.is_decimal(f.type)}
    for name in table.column_names:
        out.add_column(markup_safe(name), justify="right" if name in numeric else "left", overflow="fold")
    for row in table.slice(0, max_rows).to_pylist():
        out.add_row(*(markup_safe(format_value(c, row[c])) for c in table.column_names))
    if table.num_rows > max_rows:
        out.caption = f"{table.num_rows - max_rows} more rows (use --json for all)"
    return out


def print_reports(reports: list[Report], console: Console | None = None, max_rows: int = MAX_ROWS,
                  stderr: bool = False) -> None:
    if console is None:
        console = Console(stderr=stderr, emoji=False)  # names like "cpu:-1:" are not emoji codes
        if not console.is_terminal:
            console = Console(stderr=stderr, width=max(console.width, MIN_WIDTH), emoji=False)
    for rep in reports:
        console.rule(f"[bold]{markup_safe(rep.tool)}")
        if rep.summary:
            flat = {k: v for k, v in rep.summary.items() if not isinstance(v, (dict, list))}
            console.print("  ".join(f"[bold]{markup_safe(k)}[/]={markup_safe(format_value(k, v))}"
                                    for k, v in flat.items()))
        shown = rep.display or {name: [] for name in rep.tables}
        for title, columns in shown.items():
            table = rep.tables.get(title)
            if table is not None and table.num_rows:
                cols = [c for c in columns if c in table.column_names] or table.column_names
                console.print(render_table(title, table.select(cols), max_rows))
        for f in rep.findings:
            style = SEVERITY_STYLE.get(f.severity, "none")
            ev = ", ".join(f"{k}={format_value(k, v)}" for k, v in f.evidence.items())
            loc = f" @ {format_value('location', f.location)}" if f.location else ""
            console.print(f"[{style}]{markup_safe(f.severity.upper())}[/] {markup_safe(f.title)}{markup_safe(loc)}"
                          f"  [dim]{markup_safe(ev)}[/]")
