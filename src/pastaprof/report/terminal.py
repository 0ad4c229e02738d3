"""Rendering reports as rich tables in the terminal.

Findings come first (largest time at stake first), one line each plus an indented evidence
line and the suggestion (at most two lines); then each tool's summary and tables.  Everything fits the width (``COLUMNS``, else the
terminal's, else 100 when piped): one line per row, kernel names shortened by
``names.short_names`` and clipped, columns that do not fit dropped from the right; ``wide``
shows full names and every column.  Rows per table are capped; JSON keeps every row.

Every string a report carries (tool, table and column names, cells, summary keys
and values, finding titles, locations, evidence) goes through :func:`markup_safe`
here, so no tool's names can send control sequences to the terminal or be read as
rich markup; a new tool gets that without doing anything.
"""

from __future__ import annotations

import datetime as _dt
import os
import re
import textwrap
from typing import Any

import pyarrow as pa
from rich import box
from rich.cells import cell_len, set_cell_size
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from pastaprof.report.names import short_kernel_name, short_names, terminal_safe
from pastaprof.report.pipes import silence
from pastaprof.tools.base import Finding, Report, ordered_findings

MAX_ROWS = 10
EPOCH_NS_MIN = 10**17  # a *_ns value this large is a timestamp (after 1973), not a duration
MAX_NAME = 70
NAME_COLUMNS = {"name", "kernel", "dominant_kernel", "location"}
PIPED_WIDTH = 100  # not on a terminal (piped, CI logs) and no COLUMNS: this many columns
WIDE_WIDTH = 100_000  # --wide: a row is one line however long
MIN_NAME = 32  # a name column is squeezed no narrower than this while other columns can go
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


#: Byte counts whose names do not say "bytes": the memory tool's levels, the tensor events' totals.
BYTE_COLUMNS = frozenset({"allocated_at_start", "allocated_at_end", "max_total_allocated", "reserved_at_peak",
                          "total_allocated", "total_reserved"})


def format_value(column: str, v: Any) -> str:
    """Human formatting chosen by column name (``*_ns`` durations, ``*bytes*`` and ``BYTE_COLUMNS``
    sizes, ``*gbps`` bandwidths, shares), the same units in tables, summaries and findings."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else ""
    if isinstance(v, (int, float)):
        if (column.endswith("_ns") or column == "ns") and abs(v) >= EPOCH_NS_MIN:
            return _fmt_time(int(v))
        if column.endswith("_ns") or column == "ns":
            return _fmt_ns(v)
        if "bytes" in column or column in BYTE_COLUMNS:
            return _fmt_bytes(v)
        if column.endswith("gbps"):  # bytes per ns
            return f"{v:,.2f} GB/s"
        if column == "share" or column.startswith("share_") or "_share" in column or column.endswith("_frac"):
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


def clip(text: str, width: int) -> str:
    """``text`` made terminal-safe and cut to ``width`` cells (``…`` marks the cut)."""
    safe = terminal_safe(text)
    if cell_len(safe) <= width:
        return safe
    return set_cell_size(safe, max(width - 1, 0)) + "…"


def clip_column(texts: list[str], width: int) -> list[str]:
    """Each text of a column clipped to ``width`` (see ``clip``); where different texts would
    then read the same (GEMM kernels differing only in their tile shape, elementwise kernels in
    their functor), those are cut in the middle instead, to show where they differ."""
    out = [clip(t, width) for t in texts]
    if width < 8:
        return out
    groups: dict[str, set[str]] = {}
    for full, shown in zip(texts, out):
        groups.setdefault(shown, set()).add(terminal_safe(full))
    taken = {shown for shown, g in groups.items() if len(g) == 1}
    cut = {}
    for shown, g in groups.items():
        if len(g) > 1:
            cut[shown] = _cut_apart(sorted(g), width, taken)
            taken.update(cut[shown].values())
    return [cut[shown][terminal_safe(full)] if shown in cut else shown for full, shown in zip(texts, out)]


def _cut_apart(group: list[str], width: int, taken: set[str]) -> dict[str, str]:
    """Each text of ``group`` (alike in their first ``width - 1`` cells) cut to ``width`` cells so
    that they read apart from each other and from the column's other cells (``taken``): its head
    and its end when the ends tell them apart, else its head and a window from just before where
    it parts from the text most like it."""
    room = width - 1
    for head in (room // 2, room // 3):
        tail = room - head
        ends = {t: set_cell_size(t, head) + "…" + t[-tail:] for t in group}
        if len(set(ends.values())) == len(group) and not taken & set(ends.values()):
            return ends
    head = room // 3
    size = room - head - 1
    out = {}
    for t in group:
        parts = max(_common_prefix(t, r) for r in group if r != t)
        start = max(head, min(parts - 2, len(t) - size))
        out[t] = set_cell_size(t, head) + "…" + t[start:start + size] + ("…" if start + size < len(t) else "")
    return out


def _common_prefix(a: str, b: str) -> int:
    return len(os.path.commonprefix([a, b]))


def _width_from_env() -> int | None:
    try:
        n = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        return None
    return n if 20 <= n <= WIDE_WIDTH else None


class QuietOnClose(Console):
    """rich's Console, except that a closed pipe silences it (rich's own ends the process with
    exit 1 at once, before ``--json`` or a run directory is written)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        silence(2 if self.stderr else 1)


def make_console(stderr: bool = False, wide: bool = False) -> Console:
    """A console as wide as ``COLUMNS`` says, else the terminal, else ``PIPED_WIDTH``; with ``wide``
    unbounded.  No emoji: names like "cpu:-1:" are not emoji codes."""
    probe = Console(stderr=stderr, emoji=False)
    width = WIDE_WIDTH if wide else _width_from_env() or (probe.width if probe.is_terminal else PIPED_WIDTH)
    return QuietOnClose(stderr=stderr, width=width, emoji=False, highlight=False, soft_wrap=False)


def _cells(table: pa.Table, rows: list[dict[str, Any]], wide: bool) -> dict[str, list[str]]:
    """Each column's shown text: name columns shortened together (distinct names stay distinct)."""
    out: dict[str, list[str]] = {}
    for c in table.column_names:
        values = [row[c] for row in rows]
        if c in NAME_COLUMNS and not wide:
            texts = [v if isinstance(v, str) else None for v in values]
            shorts = short_names([t for t in texts if t is not None])
            it = iter(shorts)
            out[c] = [terminal_safe(next(it)) if t is not None else format_value(c, v) for t, v in zip(texts, values)]
        elif c in NAME_COLUMNS:
            out[c] = [terminal_safe(str(v)) if v is not None else "-" for v in values]
        else:
            out[c] = [terminal_safe(format_value(c, v)) for v in values]
    return out


def _fit(columns: list[str], cells: dict[str, list[str]], width: int) -> dict[str, int]:
    """Column -> width: natural widths, name columns squeezed (not below ``MIN_NAME``) and
    columns dropped from the right until a row fits ``width`` (two cells of padding per column)."""
    natural = {c: max([cell_len(c), *(cell_len(x) for x in cells[c])]) for c in columns}
    kept = list(columns)
    # first to go: columns whose shown rows all hold one value (rank 0, device cuda), from the right
    drops = [c for c in reversed(columns) if c not in NAME_COLUMNS and len(set(cells[c])) <= 1 and len(cells[c]) > 1]
    drops += [c for c in reversed(columns) if c not in NAME_COLUMNS and c not in drops]
    while True:
        fixed = sum(natural[c] + 2 for c in kept if c not in NAME_COLUMNS)
        names = [c for c in kept if c in NAME_COLUMNS]
        room = width - fixed - 2 * len(names)
        if not names and fixed <= width or names and room >= MIN_NAME * len(names) or len(kept) == 1:
            break
        kept.remove(next((c for c in drops if c in kept), kept[-1]))
    names = [c for c in kept if c in NAME_COLUMNS]
    out = {c: natural[c] for c in kept}
    if names:
        room = width - sum(natural[c] + 2 for c in kept if c not in NAME_COLUMNS) - 2 * len(names)
        share = max(room // len(names), 1)
        for c in names:
            out[c] = max(min(natural[c], share), 1)
    if len(kept) == 1:
        out[kept[0]] = min(out[kept[0]], max(width - 2, 1))
    return out


def render_table(title: str, table: pa.Table, max_rows: int = MAX_ROWS, width: int = PIPED_WIDTH,
                 wide: bool = False) -> Table:
    """One rich table, every row one line within ``width`` (see ``_fit``); ``wide``: all of it.
    Columns null in every row are left out (said in the caption) unless ``wide``."""
    hidden = 0
    if not wide:  # a column null in every row says nothing (a CPU-only run's GPU columns): left out
        empty = [c for c in table.column_names if table[c].null_count == table.num_rows > 0]
        if empty and len(empty) < table.num_columns:
            hidden = len(empty)
            table = table.drop_columns(empty)
    rows = table.slice(0, min(max_rows, table.num_rows)).to_pylist()  # no columns: slice() makes rows
    cells = _cells(table, rows, wide)
    widths = {c: max([cell_len(c), *(cell_len(x) for x in cells[c])]) for c in table.column_names} if wide \
        else _fit(table.column_names, cells, width)
    numeric = {f.name for f in table.schema if pa.types.is_integer(f.type) or pa.types.is_floating(f.type)
               or pa.types.is_decimal(f.type)}
    out = Table(title=markup_safe(clip(title, width)), title_justify="left", header_style="bold", box=box.SIMPLE_HEAD,
                show_edge=False, pad_edge=False, padding=(0, 1), collapse_padding=True)
    for name, w in widths.items():
        out.add_column(markup_safe(clip(name, w)), justify="right" if name in numeric else "left",
                       no_wrap=True, overflow="ellipsis", width=w)
    shown = {c: clip_column(cells[c], w) for c, w in widths.items()}
    for i in range(len(rows)):
        out.add_row(*(markup_safe(shown[c][i]) for c in widths))
    notes = []
    if table.num_rows > max_rows:
        notes.append(f"{table.num_rows - max_rows} more rows (--rows, --json)")
    if len(widths) < table.num_columns:
        notes.append(f"{table.num_columns - len(widths)} columns not shown (--wide, --json)")
    if hidden:
        notes.append(f"{hidden} empty column{'s' if hidden > 1 else ''} left out")
    if notes:
        out.caption = markup_safe(", ".join(notes))
        out.caption_justify = "left"
    return out


def _summary_lines(summary: dict[str, Any], width: int, wide: bool = False) -> list[str]:
    """``key=value`` items packed into lines of ``width`` (an item is never split; ``wide``: nor clipped)."""
    items = [f"{k}={terminal_safe(v) if (wide or k == 'note') and isinstance(v, str) else format_value(k, v)}"
             for k, v in summary.items() if not isinstance(v, (dict, list))]  # a note: as wide as the line
    items = items if wide else [clip(item, width) for item in items]
    lines: list[str] = []
    for item in items:
        if lines and cell_len(lines[-1]) + 2 + cell_len(item) <= width:
            lines[-1] += "  " + item
        else:
            lines.append(item)
    return lines


_DIRS = re.compile(r"(?<![\w/.])[\w.\-]*(?:/[\w.\-]+)*/(?=[\w.\-]+\.py\(\d+\))")  # a/b/c.py(1) -> c.py(1)


def _finding_lines(f: Finding, width: int) -> list[str]:
    """The finding's line (severity, time at stake, title, location), its evidence line and its
    suggestion (at most two lines, the second clipped)."""
    impact = _fmt_ns(f.impact_ns) if f.impact_ns is not None else "-"
    prefix = f"{f.severity.upper():<8} {impact:>10}  "
    title = terminal_safe(f.title)
    loc = terminal_safe(f" @ {_DIRS.sub('', format_value('location', f.location))}") if f.location else ""
    room = width - cell_len(prefix)
    if cell_len(title) + cell_len(loc) > room:  # both clipped, the location keeping up to 3/5 of the room
        loc_room = min(cell_len(loc), max(room * 3 // 5, room - cell_len(title)))
        title, loc = clip(title, room - loc_room), clip(loc, loc_room)
    head = clip(prefix + title + loc, width)
    at_stake = {"impact_bytes": f.impact_bytes} if f.impact_bytes is not None else {}
    ev = ", ".join(f"{k}={format_value(k, v)}" for k, v in (at_stake | f.evidence).items()
                   if k not in ("impact_ns", "suggestion", "at_stake") and not isinstance(v, (dict, list)))
    lines = [head, clip(f"{'':20}{f.tool}: {ev}" if ev else f"{'':20}{f.tool}", width)]
    if f.suggestion:
        room = max(width - 22, 20)
        said = textwrap.wrap(terminal_safe(f.suggestion), room)
        if len(said) > 2:
            said = [said[0], clip(" ".join(said[1:]), room)]
        lines += [clip(f"{'':20}{'> ' if i == 0 else '  '}{x}", width) for i, x in enumerate(said)]
    return lines


def print_findings(reports: list[Report], console: Console) -> None:
    """Every tool's findings, largest time at stake first (``ordered_findings``)."""
    findings = ordered_findings(reports)
    console.rule(f"[bold]findings[/] ({len(findings)}, largest time at stake first)")
    for f in findings:
        head, ev, *said = _finding_lines(f, console.width)
        style = SEVERITY_STYLE.get(f.severity, "none")
        console.print(f"[{style}]{markup_safe(head)}[/]", no_wrap=True, overflow="ignore")
        console.print(f"[dim]{markup_safe(ev)}[/]", no_wrap=True, overflow="ignore")
        for line in said:
            console.print(markup_safe(line), no_wrap=True, overflow="ignore")


def print_reports(reports: list[Report], console: Console | None = None, max_rows: int = MAX_ROWS,
                  stderr: bool = False, wide: bool = False) -> None:
    """Findings first, then each tool's summary and tables, fitted to the console's width."""
    if console is None:
        console = make_console(stderr=stderr, wide=wide)
    width = console.width
    if any(r.findings for r in reports):
        print_findings(reports, console)
    for rep in reports:
        console.rule(f"[bold]{markup_safe(rep.tool)}")
        for line in _summary_lines(rep.summary, width, wide):
            console.print(markup_safe(line), no_wrap=True, overflow="ignore")
        shown = rep.display or {name: [] for name in rep.tables}
        for title, columns in shown.items():
            table = rep.tables.get(title)
            if table is not None and table.num_rows:
                cols = [c for c in columns if c in table.column_names] or table.column_names
                console.print(render_table(title, table.select(cols), max_rows, width, wide))
