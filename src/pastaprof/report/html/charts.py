"""Plotly figure specs (plain dicts, drawn in the page by the inlined plotly.js).

Every string that comes from a trace goes through :func:`label` first: plotly reads a small
set of HTML-like tags in labels (``<b>``, ``<br>``, ``<a href>``) and decodes entities, so
escaping ``& < >`` makes a kernel named ``<b>x</b>`` show as those characters, not as bold.
Specs carry aggregates only (tens to hundreds of points per chart), never events.
"""

from __future__ import annotations

import html
from typing import Any

from pastaprof.report.names import short_names

Spec = dict[str, Any]
PALETTE = {"compute": "#4C78A8", "communication": "#F58518", "memory": "#54A24B", "host_wait": "#E45756",
           "kernel_wait": "#B279A2", "other_idle": "#BAB0AC", "busy": "#4C78A8", "other_gpu": "#72B7B2"}
HOVER_MAX = 300
CLASSES_ORDER = ("compute", "communication", "memory")
TOP = 20


def label(text: Any, limit: int | None = None) -> str:
    """A trace's name made literal for plotly (see the module doc), optionally clipped."""
    s = "" if text is None else str(text)
    if limit is not None and len(s) > limit:
        s = s[: limit - 1] + "…"
    return html.escape(s, quote=False)


def short_labels(names: list[Any]) -> list[str]:
    """Names shortened together (distinct names stay distinct), then made literal."""
    texts = ["-" if n is None else str(n) for n in names]
    return [label(s, 80) for s in short_names(texts)]


def ms(ns: float) -> float:
    return round(ns / 1e6, 6)


def _layout(title: str, **extra: Any) -> dict[str, Any]:
    base = {"title": {"text": label(title), "font": {"size": 14}, "x": 0.01, "xanchor": "left"}, "margin": {"l": 60, "r": 20, "t": 40, "b": 40},
            "font": {"family": "system-ui, sans-serif", "size": 11}, "hovermode": "closest",
            "legend": {"orientation": "h", "x": 1, "xanchor": "right", "y": 1.0, "yanchor": "bottom"}, "paper_bgcolor": "white", "plot_bgcolor": "white"}
    base.update(extra)
    return base


def hbar(title: str, names: list[Any], values: list[float], unit: str = "ms", hover: list[str] | None = None,
         scale: float = 1e6) -> Spec:
    """Horizontal bars, largest on top: the top-N chart of a table.  Rows with the same name
    (one kernel on several ranks, one site in several modules) are one bar: their sum."""
    summed: dict[str, float] = {}
    for n, v in zip(names, values):
        key = "-" if n is None else str(n)
        summed[key] = summed.get(key, 0.0) + float(v or 0)
    if hover is None and len(summed) < len(names):
        ranked = sorted(summed.items(), key=lambda kv: -kv[1])
        names, values = [k for k, _ in ranked], [v for _, v in ranked]
    names, values = names[:TOP], values[:TOP]
    full = hover or [label(n, HOVER_MAX) for n in names]
    y = short_labels(names)
    x = [round(float(v or 0) / scale, 6) for v in values]
    trace = {"type": "bar", "orientation": "h", "y": y[::-1], "x": x[::-1], "customdata": full[::-1],
             "hovertemplate": f"%{{customdata}}<br>%{{x:,.3f}} {unit}<extra></extra>", "marker": {"color": "#4C78A8"}}
    return {"data": [trace], "layout": _layout(title, height=max(220, 24 * len(y) + 80),
                                                margin={"l": 320, "r": 20, "t": 40, "b": 40},
                                                xaxis={"title": {"text": unit}}, yaxis={"automargin": True})}


def stacked(title: str, categories: list[str], series: dict[str, list[float]], unit: str = "ms",
            horizontal: bool = False, scale: float = 1e6, hover: list[str] | None = None,
            category_title: str = "") -> Spec:
    """Stacked bars: one bar per category (step, stream, rank), one colour per series."""
    data = []
    for key, values in series.items():
        vals = [round(float(v or 0) / scale, 6) for v in values]
        trace: dict[str, Any] = {"type": "bar", "name": label(key.replace("_", " ")),
                                 "marker": {"color": PALETTE.get(key, None)},
                                 "hovertemplate": f"%{{fullData.name}}: %{{{'x' if horizontal else 'y'}:,.3f}} {unit}"
                                                  "<extra>%{customdata}</extra>",
                                 "customdata": hover or categories}
        if horizontal:
            trace.update(orientation="h", y=categories, x=vals)
        else:
            trace.update(x=categories, y=vals)
        data.append(trace)
    axis = {"title": {"text": unit}}
    lay = _layout(title, barmode="stack", height=min(1200, max(260, 22 * len(categories) + 100)) if horizontal else 320)
    if horizontal:
        lay.update(xaxis=axis, yaxis={"automargin": True, "autorange": "reversed"}, margin={"l": 160, "r": 20, "t": 40, "b": 40})
    else:
        lay.update(yaxis=axis, xaxis={"type": "category", "title": {"text": label(category_title)}})
    return {"data": data, "layout": lay}


def step_bars(title: str, steps: list[dict[str, Any]]) -> Spec:
    """Wall time per step, one colour per rank; outlier steps drawn red."""
    ranks = sorted({s.get("rank", 0) for s in steps})
    data = []
    if len(ranks) > 16:
        title += f" (the first 16 of {len(ranks)} ranks; all ranks' medians are in the ranks section)"
    for rank in ranks[:16]:
        mine = [s for s in steps if s.get("rank", 0) == rank]
        data.append({"type": "bar", "name": f"rank {rank}", "x": [label(s.get("label") or s.get("step")) for s in mine],
                     "y": [ms(s.get("wall_ns") or 0) for s in mine],
                     "marker": {"color": ["#E45756" if s.get("outlier") else PALETTE["busy"] for s in mine]}
                     if len(ranks) == 1 else {},
                     "hovertemplate": "%{x}: %{y:,.3f} ms<extra>%{fullData.name}</extra>"})
    return {"data": data, "layout": _layout(title, barmode="group", height=300, yaxis={"title": {"text": "ms"}},
                                            xaxis={"type": "category"})}


def heatmap(title: str, rows: list[str], x_ms: list[float], z: list[list[float]], marks: list[float]) -> Spec:
    """Busy fraction per lane (row) and time bin; vertical lines at step starts."""
    shapes = [{"type": "line", "xref": "x", "yref": "paper", "x0": m, "x1": m, "y0": 0, "y1": 1,
               "line": {"color": "#333", "width": 1, "dash": "dot"}} for m in marks[:200]]
    trace = {"type": "heatmap", "x": x_ms, "y": rows, "z": z, "zmin": 0, "zmax": 1, "colorscale": [[0, "#f4f6f8"], [0.001, "#deebf7"], [1, "#08306b"]],
             "colorbar": {"title": {"text": "busy"}, "tickformat": ".0%"},
             "hovertemplate": "%{y}<br>%{x:,.3f} ms: %{z:.1%} busy<extra></extra>"}
    return {"data": [trace], "layout": _layout(title, height=min(900, max(200, 22 * len(rows) + 110)), shapes=shapes,
                                                xaxis={"title": {"text": "ms from the start of the trace"}},
                                                yaxis={"automargin": True, "autorange": "reversed", "type": "category"},
                                                margin={"l": 150, "r": 20, "t": 40, "b": 50})}


def area(title: str, x_ms: list[float], series: dict[str, list[float]], marks: list[float]) -> Spec:
    """Stacked area over time of per-class utilization (fractions of the devices' capacity)."""
    data = [{"type": "scatter", "mode": "lines", "stackgroup": "one", "name": label(k), "x": x_ms, "y": v,
             "line": {"width": 0.5, "color": PALETTE.get(k)},
             "hovertemplate": "%{x:,.3f} ms: %{y:.1%}<extra>%{fullData.name}</extra>"} for k, v in series.items()]
    shapes = [{"type": "line", "xref": "x", "yref": "paper", "x0": m, "x1": m, "y0": 0, "y1": 1,
               "line": {"color": "#333", "width": 1, "dash": "dot"}} for m in marks[:200]]
    return {"data": data, "layout": _layout(title, height=300, shapes=shapes,
                                            yaxis={"tickformat": ".0%", "title": {"text": "of GPU capacity"}},
                                            xaxis={"title": {"text": "ms from the start of the trace"}})}


def memory_lines(title: str, lines: list[tuple[str, list[float], list[float]]],
                 peaks: list[tuple[str, float, float]]) -> Spec:
    """Allocated bytes over time per device (GiB), with each device's peak marked."""
    data: list[dict[str, Any]] = [{"type": "scatter", "mode": "lines", "name": label(n), "x": x, "y": y,
                                   "line": {"shape": "hv", "width": 1.2},
                                   "hovertemplate": "%{x:,.3f} ms: %{y:,.3f} GiB<extra>%{fullData.name}</extra>"}
                                  for n, x, y in lines]
    if peaks:
        data.append({"type": "scatter", "mode": "markers+text", "name": "peak", "x": [p[1] for p in peaks],
                     "y": [p[2] for p in peaks], "text": [f"peak {p[2]:,.2f} GiB" for p in peaks],
                     "textposition": "top center", "marker": {"color": "#E45756", "size": 9, "symbol": "diamond"},
                     "customdata": [label(p[0]) for p in peaks],
                     "hovertemplate": "peak of %{customdata}: %{y:,.3f} GiB at %{x:,.3f} ms<extra></extra>"})
    return {"data": data, "layout": _layout(title, height=320, yaxis={"title": {"text": "GiB"}},
                                            xaxis={"title": {"text": "ms from the start of the trace"}})}


def treemap(title: str, paths: list[str], values: list[float], sep: str = "/") -> Spec:
    """Module paths as a treemap: each node's own time plus its children's (``remainder``)."""
    own: dict[str, float] = {}
    for p, v in zip(paths, values):
        p = p or "(no module)"
        own[p] = own.get(p, 0.0) + float(v or 0)
    nodes: dict[str, str] = {}
    for p in list(own):
        parts = p.split(sep)
        for i in range(len(parts)):
            node = sep.join(parts[: i + 1])
            nodes.setdefault(node, sep.join(parts[:i]))
    ids = list(nodes)
    trace = {"type": "treemap", "ids": [label(i) for i in ids], "parents": [label(nodes[i]) for i in ids],
             "labels": [label(i.split(sep)[-1], 60) for i in ids], "values": [ms(own.get(i, 0.0)) for i in ids],
             "branchvalues": "remainder", "customdata": [label(i, HOVER_MAX) for i in ids],
             "hovertemplate": "%{customdata}<br>own %{value:,.3f} ms<extra></extra>", "maxdepth": 4}
    return {"data": [trace], "layout": _layout(title, height=480, margin={"l": 10, "r": 10, "t": 40, "b": 10})}
