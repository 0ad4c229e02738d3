"""Dedicated charts of the core tools and the page-wide views (GPU timeline, ranks).

Each view reads only a Report's tables and summary (by column name, skipping what a table
lacks), so a tool whose columns change loses a chart, never the page.  Tools without a
view here get :func:`generic_chart`: the top rows of their first table with a name and a
time or size column.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from pastaprof.report.html import charts
from pastaprof.report.html.sections import Page, esc
from pastaprof.tools.base import Report

MAX_LINE_POINTS = 1500
MAX_STACK_ROWS = 64


@dataclass
class Context:
    """What views share: the reports by tool, the time bins, and the page's time origin."""

    reports: dict[str, Report]
    bins: dict[str, Any] = field(default_factory=dict)
    origin_ns: int = 0

    def rows(self, tool: str, table: str) -> list[dict[str, Any]]:
        r = self.reports.get(tool)
        t = r.tables.get(table) if r is not None else None
        return t.to_pylist() if t is not None else []

    def rel_ms(self, ns: int | float) -> float:
        return charts.ms(ns - self.origin_ns)


def _lane_name(lane: dict[str, Any], ranks: int) -> str:
    who = f"rank {lane['rank']} " if ranks > 1 else ""
    dev = f"gpu {lane['device']}" if lane.get("device", -1) >= 0 else "gpu ?"
    return who + dev + (f" stream {lane['stream']}" if "stream" in lane else "")


def _step_marks(ctx: Context) -> list[float]:
    steps = ctx.rows("steps", "steps")
    first = min((s.get("rank", 0) for s in steps), default=0)
    return [ctx.rel_ms(s["start_ns"]) for s in steps if s.get("rank", 0) == first and s.get("start_ns")]


def gpu_timeline(ctx: Context, page: Page) -> str:
    """Busy fraction per stream (or device) and time bin, the classes stacked over time, and
    each stream's idle time split by its cause (the timeline tool's gaps)."""
    b = ctx.bins
    if not b.get("bins"):
        return page.section("gpu-timeline", "GPU timeline", '<p class="note">no GPU activity in this run</p>')
    n, bin_ns = b["bins"], b["bin_ns"]
    x = [ctx.rel_ms(b["t0_ns"] + (i + 0.5) * bin_ns) for i in range(n)]
    marks = _step_marks(ctx)
    ranks = len({s["rank"] for s in b["streams"]})
    lanes = [s for s in b["streams"] if "bins" in s]
    parts = []
    if lanes:
        z = [[round(sum(v[i] for v in s["bins"].values()) / bin_ns, 4) for i in range(n)] for s in lanes]
        parts.append(page.chart(charts.heatmap("busy per stream", [esc(_lane_name(s, ranks)) for s in lanes], x, z, marks),
                                "Each row is a GPU stream; darker is busier. Dotted lines: step starts."))
    elif b["devices"]:
        devs = b["devices"]
        z = [[round(v / bin_ns, 4) for v in d["bins"]] for d in devs]
        parts.append(page.chart(charts.heatmap("busy per device", [esc(_lane_name(d, ranks)) for d in devs], x, z, marks),
                                f"{len(b['streams']):,} streams: one row per device (its streams' union)."))
    devices = max(1, len(b["devices"]) or len({(s["rank"], s["device"]) for s in b["streams"]}))
    if lanes:
        series = {k: [round(sum(s["bins"][k][i] for s in lanes) / (bin_ns * devices), 4) for i in range(n)]
                  for k in charts.CLASSES_ORDER}
        parts.append(page.chart(charts.area("GPU time by class", x, series, marks),
                                "Compute, communication (NCCL) and memory (copies, memsets) as a share of all "
                                f"{devices} device(s)' time; overlapping streams can add up past 100%."))
    streams = ctx.rows("timeline", "streams")[:MAX_STACK_ROWS]
    if streams and {"busy_ns", "host_wait_ns", "kernel_wait_ns"} <= set(streams[0]):
        cats = [esc(_lane_name(s, ranks)) for s in streams]
        series = {"busy": [s["busy_ns"] for s in streams], "host_wait": [s["host_wait_ns"] for s in streams],
                  "kernel_wait": [s["kernel_wait_ns"] for s in streams],
                  "other_idle": [s.get("other_ns", 0) for s in streams]}
        parts.append(page.chart(charts.stacked("busy and idle per stream", cats, series, horizontal=True),
                                "Idle time split by cause: host wait (the GPU waited for the CPU to launch), "
                                "kernel wait (for other GPU work), other."))
    lead = (f"{len(b['streams']):,} stream(s) over {charts.ms(b['span_ns']):,.3f} ms, in {n} bins of "
            f"{charts.ms(bin_ns):,.3f} ms.")
    return page.section("gpu-timeline", "GPU timeline", "".join(parts), lead)


def ranks_view(ctx: Context, page: Page) -> str:
    """Per-rank bars: GPU time by class and step time, when the run has several ranks."""
    per_rank = ctx.bins.get("per_rank", [])
    steps = ctx.rows("steps", "steps")
    ranks = sorted({r["rank"] for r in per_rank} | {s.get("rank", 0) for s in steps})
    if len(ranks) < 2:
        return ""
    parts = []
    if per_rank:
        cats = [str(r["rank"]) for r in per_rank]
        parts.append(page.chart(charts.stacked("GPU busy time per rank", cats,
                                               {k: [r[k] for r in per_rank] for k in charts.CLASSES_ORDER},
                                               category_title="rank"),
                                "Summed over each rank's streams."))
    if steps:
        wall: dict[int, list[int]] = {}
        for s in steps:
            wall.setdefault(s.get("rank", 0), []).append(int(s.get("wall_ns") or 0))
        cats = [str(r) for r in sorted(wall)]
        med = [sorted(v)[len(v) // 2] for _, v in sorted(wall.items())]
        mx = [max(v) for _, v in sorted(wall.items())]
        spec = charts.stacked("step time per rank (median, and the slowest step above it)", cats,
                              {"busy": med, "other_idle": [a - b for a, b in zip(mx, med)]}, category_title="rank")
        spec["data"][0]["name"], spec["data"][1]["name"] = "median step", "slowest step (extra)"
        parts.append(page.chart(spec))
    return page.section("ranks", "ranks", "".join(parts), f"{len(ranks)} ranks.")


def _steps(r: Report, ctx: Context, page: Page) -> str:
    steps = ctx.rows("steps", "steps")
    if not steps or "wall_ns" not in steps[0]:
        return ""
    out = [page.chart(charts.step_bars("step time", steps), "Outlier steps are red (one rank).")]
    first = steps[0].get("rank", 0)
    mine = [s for s in steps if s.get("rank", 0) == first][:200]
    keys = [k for k in ("compute_ns", "communication_ns", "memory_ns", "other_gpu_ns", "host_wait_ns",
                        "kernel_wait_ns", "other_idle_ns") if any(s.get(k) is not None for s in mine)]
    if keys:
        cats = [esc(s.get("label") or s.get("step")) for s in mine]
        spec = charts.stacked("where each step's time went" + (f" (rank {first})" if len(steps) > len(mine) else ""),
                              cats, {k[:-3]: [s.get(k) or 0 for s in mine] for k in keys})
        out.append(page.chart(spec, "GPU busy by class, then idle by cause; the bars add up to the step's wall time."))
    return "".join(out)


def _top(table: pa.Table | None, name_col: str, value_col: str) -> tuple[list[Any], list[float]]:
    if table is None or not table.num_rows or name_col not in table.column_names or value_col not in table.column_names:
        return [], []
    if table[value_col].null_count == table.num_rows:  # no values (a CPU-only run's GPU times): no chart
        return [], []
    rows = sorted(table.select([name_col, value_col]).to_pylist(), key=lambda r: -(r[value_col] or 0))
    return [r[name_col] for r in rows], [r[value_col] or 0 for r in rows]


def _kernels(r: Report, ctx: Context, page: Page) -> str:
    names, vals = _top(r.tables.get("kernels"), "name", "total_ns")
    return page.chart(charts.hbar("GPU time per kernel (top 20)", names, vals)) if names else ""


def _ops(r: Report, ctx: Context, page: Page) -> str:
    out = []
    col = "self_gpu_ns" if "self_gpu_ns" in (r.tables.get("ops").column_names if "ops" in r.tables else []) else "gpu_ns"
    names, vals = _top(r.tables.get("ops"), "name", col)
    if names:
        out.append(page.chart(charts.hbar("GPU time launched per op (self, top 20)", names, vals)))
    names, vals = _top(r.tables.get("ops"), "name", "cpu_ns")
    if names:
        out.append(page.chart(charts.hbar("CPU time per op (inclusive, top 20)", names, vals)))
    mods = r.tables.get("modules")
    if mods is not None and mods.num_rows and {"module", "gpu_ns"} <= set(mods.column_names) \
            and mods["gpu_ns"].null_count < mods.num_rows:
        out.append(page.chart(charts.treemap("GPU time per module", mods["module"].to_pylist(), mods["gpu_ns"].to_pylist()),
                              "Each box is a module path; its area is its GPU time (its own ops plus its children's). "
                              "Click a box to zoom in."))
    return "".join(out)


def _downsample(x: list[int], y: list[int]) -> tuple[list[int], list[int]]:
    """At most ``MAX_LINE_POINTS`` points: each bucket keeps its highest point (peaks survive)."""
    if len(x) <= MAX_LINE_POINTS:
        return x, y
    step = -(-len(x) // MAX_LINE_POINTS)
    xs, ys = [], []
    for i in range(0, len(x), step):
        j = max(range(i, min(i + step, len(x))), key=y.__getitem__)
        xs.append(x[j])
        ys.append(y[j])
    return xs, ys


def _memory(r: Report, ctx: Context, page: Page) -> str:
    out = []
    foot = r.tables.get("footprint")
    gib = float(1 << 30)
    if foot is not None and foot.num_rows and {"time_ns", "allocated_bytes"} <= set(foot.column_names):
        groups: dict[tuple, tuple[list[int], list[int]]] = {}
        for row in foot.select([c for c in ("rank", "device", "time_ns", "allocated_bytes")
                                if c in foot.column_names]).to_pylist():
            g = groups.setdefault((row.get("rank", 0), row.get("device", 0)), ([], []))
            g[0].append(row["time_ns"])
            g[1].append(row["allocated_bytes"] or 0)
        lines = []
        for (rank, dev), (xs, ys) in sorted(groups.items(), key=lambda kv: (kv[0][0] or 0, kv[0][1] or 0))[:16]:
            xs, ys = _downsample(xs, ys)
            name = ("cpu" if dev is None or dev < 0 else f"gpu {dev}") + (f" rank {rank}" if len(groups) > 2 else "")
            lines.append((name, [ctx.rel_ms(v) for v in xs], [round(v / gib, 6) for v in ys]))
        peaks = [(("cpu" if (d.get("device") or 0) < 0 else f"gpu {d.get('device')}"), ctx.rel_ms(d["peak_ns"]),
                  round(d["peak_bytes"] / gib, 6)) for d in ctx.rows("memory", "devices")
                 if d.get("peak_ns") and d.get("peak_bytes")][:16]
        out.append(page.chart(charts.memory_lines("allocated memory over time", lines, peaks),
                              "The caching allocator's allocated bytes; the diamond marks each device's peak."))
    live = r.tables.get("live_at_peak_by_site")
    if live is not None and live.num_rows and "bytes" in live.column_names:
        rows = live.to_pylist()
        names = [f"{x.get('op_name') or '?'} @ {x.get('call_site') or x.get('module') or '?'}" for x in rows]
        out.append(page.chart(charts.hbar("live at the peak, by op and call site (top 20)", names,
                                          [x["bytes"] for x in rows], unit="MiB", scale=float(1 << 20))))
    cats = ctx.rows("memory", "peak_by_category")
    if cats and {"category", "bytes"} <= set(cats[0]):
        devs = sorted({(c.get("rank", 0), c.get("device", 0)) for c in cats})[:MAX_STACK_ROWS]
        names = sorted({c["category"] for c in cats})
        table = {(c.get("rank", 0), c.get("device", 0), c["category"]): c["bytes"] for c in cats}
        labels = [("cpu" if (d or 0) < 0 else f"gpu {d}") + (f" rank {r_}" if len(devs) > 2 else "") for r_, d in devs]
        out.append(page.chart(charts.stacked("live at the peak, by category", labels,
                                             {n: [table.get((r_, d, n), 0) for r_, d in devs] for n in names},
                                             unit="MiB", scale=float(1 << 20), horizontal=True)))
    return "".join(out)


def generic_chart(r: Report, ctx: Context, page: Page) -> str:
    """Top rows of the first table that has a name column and a time (or size) column."""
    for name, t in r.tables.items():
        if t.num_rows < 2:
            continue
        strings = [f.name for f in t.schema if pa.types.is_string(f.type) or pa.types.is_dictionary(f.type)
                   or pa.types.is_large_string(f.type)]
        values = [c for c in t.column_names if c.endswith("_ns") and pa.types.is_integer(t.schema.field(c).type)
                  and not c.startswith(("start", "end", "first", "last", "peak_ns", "time"))]
        sizes = [c for c in t.column_names if c == "bytes" or c.endswith("_bytes")]
        if strings and (values or sizes):
            col = (values or sizes)[0]
            names, vals = _top(t, strings[0], col)
            unit, scale = ("ms", 1e6) if values else ("MiB", float(1 << 20))
            return page.chart(charts.hbar(f"{name}: {col} (top 20)", names, vals, unit=unit, scale=scale))
    return ""


def _timeline(r: Report, ctx: Context, page: Page) -> str:
    return ""  # drawn in the GPU timeline section


VIEWS: dict[str, Callable[[Report, Context, Page], str]] = {
    "steps": _steps, "kernels": _kernels, "ops": _ops, "memory": _memory, "timeline": _timeline}
