"""The HTML report: one self-contained page (``pastaprof report``, ``analyze --html``).

Built from the tools' Reports (findings, summaries, tables: any tool renders) plus
:class:`~pastaprof.report.html.collect.TimeBins`, which bins GPU busy time in the same pass
over the events.  See docs/html-report.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pastaprof.report.html.collect import TOOL_NAME, TimeBins
from pastaprof.report.html.page import build_page, plotly_js
from pastaprof.tools.base import Report, Tool

#: Kinds only special runs have; a run directory with rows of one gets the tools that read it
#: (when no tools are named), so its UVM and instruction-level results are in the page.
SPECIAL_KINDS = ("uvm", "access_summary", "access_pc", "access_heatmap", "access_launch")

__all__ = ["TOOL_NAME", "TimeBins", "build_page", "check_available", "split", "tools_for", "write_html"]


def check_available() -> None:
    """Fail early (a UsageError naming the fix) when plotly is not installed."""
    plotly_js()


def tools_for(source: Path | None, tools: Sequence[str | Tool] | None) -> list[str | Tool]:
    """The tools to run for a report: those named, else the default set plus, for a run
    directory, every tool that reads a special kind the run has; with the bins collector."""
    from pastaprof.tools.registry import available, resolve

    if tools:
        chosen: list[str | Tool] = list(tools)
    else:
        chosen = [cls.name for cls in resolve(None)]
        present = _special_kinds(source) if source is not None else set()
        for name, cls in available().items():
            needed = set(cls.consumes) - set(cls.optional)
            if name not in chosen and needed & present:
                chosen.append(name)
    return [*chosen, TimeBins()]


def _special_kinds(source: Path) -> set[str]:
    from pastaprof.api import is_run_dir

    if not is_run_dir(source):
        return set()
    try:
        from pastaprof.store.run import open_run_dir

        rows = open_run_dir(source).manifest.get("rows", {})
    except Exception:  # the analysis itself says what is wrong with the run
        return set()
    out = set()
    for kind in SPECIAL_KINDS:
        n = rows.get(kind) if isinstance(rows, dict) else None
        total = sum(v for v in n.values() if isinstance(v, int)) if isinstance(n, dict) else n
        if isinstance(total, int) and total > 0:
            out.add(kind)
    return out


def split(reports: list[Report]) -> tuple[list[Report], list[Report]]:
    """(the tools' reports, everything including the bins) -- the terminal and JSON get the first."""
    return [r for r in reports if r.tool != TOOL_NAME], reports


def write_html(reports: list[Report], path: str | Path, source: str | None = None) -> int:
    """Write the page to what ``path`` names (atomically; ``-``: standard output).  Returns its size."""
    from pastaprof.store.outputs import write_output

    data = build_page(reports, source).encode("utf-8", "replace")
    write_output(path, data)
    return len(data)
