"""Page assembly: header, overview, findings, GPU timeline, ranks, one section per tool.

The page is one file that works offline: plotly.js is read from the installed ``plotly``
package (``pip install 'pastaprof[html]'``) and inlined, the chart data sits in a
``<script type="application/json">`` element with ``<``, ``>``, ``&`` and U+2028/U+2029
written as JSON escapes (so no name can close the element or break the parser), and the
page names no other file or host.
"""

from __future__ import annotations

import datetime as dt
from importlib import resources
from typing import Any

import orjson

from pastaprof import __version__
from pastaprof.errors import UsageError
from pastaprof.report.html import template, views
from pastaprof.report.html.collect import TOOL_NAME
from pastaprof.report.html.sections import Page, esc, findings_html, report_html
from pastaprof.report.terminal import format_value
from pastaprof.tools.base import Report, ordered_findings

#: What each core tool's section tells a reader who never ran pastaprof.
LEADS = {
    "steps": "Training or inference steps found in the trace (the rule used is in the summary), with each "
             "step's wall time and where it went.",
    "kernels": "GPU kernels by total time: the work the GPU actually did.",
    "ops": "Framework operators (aten::...) by the GPU time they launched and their CPU time, then per "
           "nn.Module path and per Python call site.",
    "timeline": "GPU busy and idle time per device and stream; idle time is split by what the GPU waited for.",
    "cuda_api": "CUDA runtime calls on the host, and the calls that made the CPU wait for the GPU.",
    "copies": "Memory copies between host and device: bandwidth, pinned vs pageable memory.",
    "memory": "Memory allocated over time, its peak, and what was live at the peak.",
}
_SAFE_JSON = {ord("<"): "\\u003c", ord(">"): "\\u003e", ord("&"): "\\u0026",
              0x2028: "\\u2028", 0x2029: "\\u2029"}


def script_json(value: Any) -> str:
    """JSON that is safe inside ``<script>``: no ``</script>``, ``<!--`` or line separators."""
    text = orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS, default=str).decode()
    return text.translate(_SAFE_JSON)


def plotly_js() -> str:
    """The minified plotly.js of the installed plotly package (a UsageError names the fix)."""
    try:
        js = (resources.files("plotly") / "package_data" / "plotly.min.js").read_text(encoding="utf-8")
    except (ModuleNotFoundError, FileNotFoundError, OSError):
        raise UsageError("the HTML report needs the plotly package: pip install 'pastaprof[html]'") from None
    return js.replace("</script", "<\\/script")


def _cards(reports: dict[str, Report], bins: dict[str, Any]) -> str:
    cards: list[tuple[str, str]] = []
    tl = reports.get("timeline")
    for d in (tl.tables["devices"].to_pylist() if tl is not None and "devices" in tl.tables else [])[:4]:
        cards.append((f"{d.get('busy_pct', 0):.1f}%", f"GPU busy (rank {d.get('rank')} gpu {d.get('device')})"))
    st = reports.get("steps")
    if st is not None and st.summary.get("steps"):
        cards.append((str(st.summary["steps"]), f"steps ({st.summary.get('rule', '?')})"))
        if st.summary.get("median_wall_ns"):
            cards.append((format_value("ns", st.summary["median_wall_ns"]), "median step time"))
    k = reports.get("kernels")
    if k is not None and k.summary.get("kernel_ns"):
        cards.append((format_value("ns", k.summary["kernel_ns"]), f"kernel time ({k.summary.get('kernels', 0):,} launches)"))
    if bins.get("span_ns"):
        cards.append((format_value("ns", bins["span_ns"]), "GPU activity span"))
    m = reports.get("memory")
    if m is not None and m.summary.get("peak_bytes"):
        cards.append((format_value("bytes", m.summary["peak_bytes"]), f"memory peak ({m.summary.get('peak_device', '')})"))
    return '<div class="cards">' + "".join(
        f'<div class="card"><div class="v">{esc(v)}</div><div class="k">{esc(k_)}</div></div>' for v, k_ in cards) + "</div>"


def _origin(reports: dict[str, Report], bins: dict[str, Any]) -> int:
    """The page's time zero: the earliest of the first GPU activity, step and memory event."""
    times = [bins["t0_ns"]] if bins.get("t0_ns") else []
    st = reports.get("steps")
    if st is not None and "steps" in st.tables and st.tables["steps"].num_rows:
        times.append(min(v for v in st.tables["steps"]["start_ns"].to_pylist() if v is not None))
    m = reports.get("memory")
    if m is not None and "footprint" in m.tables and m.tables["footprint"].num_rows:
        times.append(min(v for v in m.tables["footprint"]["time_ns"].to_pylist() if v is not None))
    return min(times) if times else 0


def _descriptions() -> dict[str, str]:
    try:
        from pastaprof.tools.registry import available

        return {n: cls.description for n, cls in available().items()}
    except Exception:  # a plugin's trouble costs a description, not the report
        return {}


def build_page(reports: list[Report], source: str | None = None) -> str:
    """The whole HTML page for ``reports`` (the HTML report's own ``html_bins`` one among them)."""
    bins_report = next((r for r in reports if r.tool == TOOL_NAME), None)
    bins = bins_report.summary if bins_report is not None else {}
    shown = [r for r in reports if r.tool != TOOL_NAME]
    by_tool = {r.tool: r for r in shown}
    ctx = views.Context(by_tool, bins, _origin(by_tool, bins))
    page = Page()
    findings = ordered_findings(shown)
    body = [page.section("findings", "findings, by time at stake", findings_html(findings),
                         "What pastaprof concluded, the largest time at stake first. Open a finding for its "
                         "evidence; 'where' is the place to look (file:line, module path or kernel).")]
    body.append(views.gpu_timeline(ctx, page))
    body.append(views.ranks_view(ctx, page))
    descriptions = _descriptions()
    for r in shown:
        view = views.VIEWS.get(r.tool, views.generic_chart)
        try:
            charts_html = view(r, ctx, page)
        except Exception as e:  # a tool's changed columns cost its chart, never the page
            charts_html = (f'<p class="note chart-error">(no chart: {esc(type(e).__name__)}: {esc(e)}; '
                           "the tables below are complete)</p>")
        lead = LEADS.get(r.tool) or descriptions.get(r.tool, "")
        section = report_html(r, page, charts_html)
        if lead:
            section = section.replace("</h2>", f'</h2><p class="lead">{esc(lead)}</p>', 1)
        body.append(section)
    nav = "".join(f'<a href="#{a}">{esc(t)}</a>' for a, t in page.nav)
    when = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    tools = ", ".join(r.tool for r in shown)
    name = (source or "run").rstrip("/").rsplit("/", 1)[-1]
    header = (f"<header><h1>pastaprof report: {esc(name)}</h1>"
              f'<div class="meta">source {esc(source or "-")} · tools {esc(tools)} · pastaprof {esc(__version__)}'
              f" · written {esc(when)}</div>{_cards(by_tool, bins)}</header>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>pastaprof report: {esc(name)}</title><style>{template.CSS}</style></head><body>"
            f"{header}<nav>{nav}</nav><main>{''.join(body)}</main>"
            f'<script type="application/json" id="pp-charts">{script_json(page.charts)}</script>'
            f"<script>{plotly_js()}</script><script>{template.JS}</script></body></html>\n")
