"""``pastaprof diff`` in the terminal: readable at 100 columns, top regressions first.

Every name from a trace goes through ``markup_safe`` (no control sequences, no rich
markup); kernel names are shortened with ``short_kernel_name``; JSON keeps them whole.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from rich import box
from rich.console import Console
from rich.table import Table

from pastaprof.report.diff import Diff
from pastaprof.report.names import short_kernel_name, terminal_safe
from pastaprof.report.terminal import SEVERITY_STYLE, QuietOnClose, format_value, markup_safe

WIDTH = 100  # when not on a terminal (CI logs, pipes)
_GPU_NAMES = {"kernel", "memcpy", "memset"}
LABELS = {"kernel": "kernel", "memcpy": "memcpy", "memset": "memset", "op_gpu": "op (GPU)", "op": "op",
          "module_gpu": "module (GPU)", "module": "module", "call_site_gpu": "site (GPU)", "call_site": "call site"}


def _ns(v: float | None) -> str:
    return "-" if v is None else format_value("x_ns", v)


def _delta(v: float) -> str:
    return ("+" if v > 0 else "") + _ns(v) if v else "0"


def _ratio(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _name(row: dict[str, Any]) -> str:
    """What a row is called on screen: a kernel's shortened original name, else the key."""
    if row["kind"] == "kernel":
        shown = short_kernel_name(row["new_name"] or row["base_name"] or row["name"])
    else:
        shown = row["name"]
    return ("≈ " if row.get("match") == "family" else "") + shown


def _table(title: str, columns: list[str], rows: list[list[str]], width: int) -> Table:
    """A table of at most ``width`` columns whose number columns are never cut: the name
    column alone gives way (its end becomes an ellipsis)."""
    rows = [[terminal_safe(x) for x in r] for r in rows]  # widths of what the terminal shows
    widths = [max([len(c), *(len(r[i]) for r in rows)]) for i, c in enumerate(columns)]
    room = width - sum(w for c, w in zip(columns, widths) if c != "name") - 3 * len(columns)
    t = Table(title=markup_safe(title), title_justify="left", box=box.SIMPLE_HEAD, header_style="bold",
              pad_edge=False, padding=(0, 1))
    for c, w in zip(columns, widths):
        if c == "name":
            t.add_column(c, no_wrap=True, overflow="ellipsis", max_width=max(20, min(w, room)))
        else:
            t.add_column(c, justify="left" if c in ("kind", "column") else "right", no_wrap=True, min_width=w)
    for r in rows:
        t.add_row(*(markup_safe(x) for x in r))
    return t


def _entries(console: Console, title: str, table: pa.Table, max_rows: int, which: str) -> None:
    if not table.num_rows:
        return
    cols = {"both": ["kind", "name", "base", "new", "delta", "ratio"], "new": ["kind", "name", "new", "count"],
            "base": ["kind", "name", "base", "count"]}[which]
    rows = []
    for r in table.slice(0, min(max_rows, table.num_rows)).to_pylist():
        cells = {"kind": LABELS.get(r["kind"], r["kind"]), "name": _name(r), "base": _ns(r["base_ns"]),
                 "new": _ns(r["new_ns"]), "delta": _delta(r["delta_ns"]), "ratio": _ratio(r["ratio"]),
                 "count": f"{r['new_count'] if which == 'new' else r['base_count']:,}"}
        rows.append([cells[c] for c in cols])
    t = _table(f"{title} ({table.num_rows})", cols, rows, console.width)
    if table.num_rows > max_rows:
        t.caption = f"{table.num_rows - max_rows} more (--rows N, or --json for all)"
    console.print(t)


def _findings(console: Console, title: str, table: pa.Table, max_rows: int) -> None:
    if not table.num_rows:
        return
    console.print(f"[bold]{markup_safe(title)} ({table.num_rows})[/]")
    for f in table.slice(0, min(max_rows, table.num_rows)).to_pylist():
        style = SEVERITY_STYLE.get(f["severity"] or "", "none")
        console.print(f"  [{style}]{markup_safe((f['severity'] or '').upper())}[/] "
                      f"{markup_safe(f['title'] or '')} [dim]({markup_safe(f['tool'])})[/]")
        if f["location"]:
            loc = format_value("location", f["location"])
            loc = loc if len(loc) <= console.width - 8 else loc[: max(console.width - 9, 1)] + "…"
            console.print(f"      [dim]@ {markup_safe(loc)}[/]")
    if table.num_rows > max_rows:
        console.print(f"  [dim]{table.num_rows - max_rows} more (--json for all)[/]")


def gate_line(d: Diff, fail_above: float) -> str:
    """One line saying whether the worst added time is above ``--fail-above``."""
    w = d.worst()
    what = "step" if d.normalization == "per step" else "total time"
    if w is None:
        return f"pastaprof: diff: nothing got slower (--fail-above {fail_above:g}%)"
    share = "inf" if w["share_pct"] == float("inf") else f"{w['share_pct']:.2f}%"
    verdict = "above" if w["share_pct"] > fail_above else "within"
    name = short_kernel_name(w["shown_name"]) if w["kind"] in _GPU_NAMES else w["shown_name"]
    name = terminal_safe(name)
    name = name if len(name) <= 32 else name[:31] + "…"
    return (f"pastaprof: diff: {_delta(w['delta_ns'])} ({LABELS.get(w['kind'], w['kind'])} {name}) = {share} "
            f"of the base {what}, {verdict} --fail-above {fail_above:g}%")


def print_diff(d: Diff, console: Console | None = None, max_rows: int = 15, stderr: bool = False,
               fail_above: float | None = None) -> None:
    """Header (sources, normalization), step table, regressions, improvements, new, vanished, findings."""
    if console is None:
        console = QuietOnClose(stderr=stderr, emoji=False, highlight=False)
        if not console.is_terminal:
            console = QuietOnClose(stderr=stderr, width=WIDTH, emoji=False, highlight=False)
    console.rule("[bold]diff")
    for which in ("base", "new"):
        s = d.sources[which]
        ranks = f", {s['ranks']} ranks" if s["ranks"] > 1 else ""
        steps = f"{s['steps']} steps ({s['rule']})" if s["steps"] else "no steps"
        console.print(f"[bold]{which:<4}[/] {markup_safe(s['source'])}  [dim]{markup_safe(steps + ranks)}[/]")
    console.print(f"[dim]times: {markup_safe(d.normalization_note)}[/]")
    if d.steps.num_rows:
        rows = [[r["name"], _ns(r["base_ns"]), _ns(r["new_ns"]), _delta(r["delta_ns"]), _ratio(r["ratio"])]
                for r in d.steps.to_pylist() if r["base_ns"] or r["new_ns"]]
        console.print(_table("per step", ["column", "base", "new", "delta", "ratio"], rows, console.width))
    _entries(console, "regressions", d.regressions, max_rows, "both")
    _entries(console, "improvements", d.improvements, max_rows, "both")
    _entries(console, "new (only in NEW)", d.new, max_rows, "new")
    _entries(console, "vanished (only in BASE)", d.vanished, max_rows, "base")
    if any("family" in t["match"].to_pylist()[:max_rows] for t in (d.regressions, d.improvements)):
        console.print("[dim]≈ : one base and one new name that differ only in template arguments or line[/]")
    _findings(console, "findings introduced", d.findings_introduced, max_rows)
    _findings(console, "findings resolved", d.findings_resolved, max_rows)
    if not (d.regressions.num_rows or d.improvements.num_rows or d.new.num_rows or d.vanished.num_rows):
        console.print(f"no differences ({d.unchanged} entries equal)")
    if fail_above is not None:
        console.print(markup_safe(gate_line(d, fail_above)))
