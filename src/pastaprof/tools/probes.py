"""probes -- calls of probed host functions and USDT firings (``pastaprof run --probe``).

Per probe (table ``probes``): ``calls``, ``processes``, ``total_ns`` / ``mean_ns`` /
``median_ns`` / ``max_ns`` of the calls (entry to return; USDT firings are instants, 0),
and, where the run has GPU activity (kernels, copies, memsets), ``gpu_idle_ns``: the time
the calls overlapped a moment when no GPU activity ran (within the span from the first to
the last activity) -- what the host was in while the GPU waited.  The overlap is computed
from the cumulative idle time at each call's entry and return (``np.searchsorted`` over the
idle intervals: no per-call loop); nested calls of one probe (recursion) each count.

Finding: the probe whose calls overlap the GPU's idle time most, when that is at least
``IDLE_SHARE`` of the idle time.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from pastaprof.events.schema import GPU_ACTIVITY_KINDS
from pastaprof.tools._timeline_math import name_codes, to_np
from pastaprof.tools.base import Finding, Report, Tool

IDLE_SHARE = 0.10
DISPLAY = {"probes": ["probe", "calls", "processes", "total_ns", "mean_ns", "median_ns", "max_ns", "gpu_idle_ns"]}


class Probes(Tool):
    name = "probes"
    description = "Calls per eBPF probe (run --probe): counts, time, and time spent while the GPU was idle"
    consumes = ("probe", *GPU_ACTIVITY_KINDS)
    optional = GPU_ACTIVITY_KINDS

    def report(self) -> Report:
        t = self.table("probe")
        if t.num_rows == 0:
            return Report(self.name, summary={"calls": 0}, tables={"probes": pa.table({"probe": pa.array([], pa.string())})})
        codes, names = name_codes(t["name"])
        start, end = to_np(t["start_ns"]), to_np(t["end_ns"])
        dur = np.maximum(end - start, 0)
        pid = to_np(t["pid"], fill=0)
        idle = _idle_intervals([self.table(k) for k in GPU_ACTIVITY_KINDS])
        overlap = _overlap(start, end, *idle) if idle is not None else None
        rows = []
        for c, name in enumerate(names):
            sel = codes == c
            if not sel.any():
                continue
            d = dur[sel]
            rows.append({"probe": name, "calls": int(sel.sum()), "processes": int(len(np.unique(pid[sel]))),
                         "total_ns": int(d.sum()), "mean_ns": float(d.mean()), "median_ns": float(np.median(d)),
                         "max_ns": int(d.max()),
                         "gpu_idle_ns": int(overlap[sel].sum()) if overlap is not None else None})
        rows.sort(key=lambda r: (-r["total_ns"], -r["calls"], r["probe"]))
        table = pa.Table.from_pylist(rows, schema=pa.schema([
            ("probe", pa.string()), ("calls", pa.int64()), ("processes", pa.int64()), ("total_ns", pa.int64()),
            ("mean_ns", pa.float64()), ("median_ns", pa.float64()), ("max_ns", pa.int64()),
            ("gpu_idle_ns", pa.int64())]))
        findings = []
        idle_total = int((idle[1] - idle[0]).sum()) if idle is not None else 0
        with_idle = [r for r in rows if r["gpu_idle_ns"]]
        if idle_total and with_idle:
            top = max(with_idle, key=lambda r: r["gpu_idle_ns"])
            if top["gpu_idle_ns"] >= IDLE_SHARE * idle_total:
                findings.append(Finding(
                    "info", f"the host was in {top['probe']} for {top['gpu_idle_ns'] / idle_total:.0%} of the GPU's "
                    "idle time", {"gpu_idle_ns": top["gpu_idle_ns"], "idle_total_ns": idle_total,
                                  "calls": top["calls"]},
                    location=top["probe"], impact_ns=top["gpu_idle_ns"], kind="host in probe while GPU idle",
                    suggestion="Move this call off the training loop's thread or out of the step, or make it "
                               "cheaper: the GPU waits while the host is in it."))
        return Report(self.name, tables={"probes": table}, findings=findings, display=DISPLAY,
                      summary={"calls": int(t.num_rows), "probes": len(rows), "gpu_idle_ns": idle_total or None})


def _idle_intervals(tables: list[pa.Table]) -> tuple[np.ndarray, np.ndarray] | None:
    """(starts, ends) of the gaps between the union of GPU activities, sorted; None without any."""
    starts = [to_np(t["start_ns"]) for t in tables if t.num_rows]
    if not starts:
        return None
    s = np.concatenate(starts)
    e = np.concatenate([to_np(t["end_ns"]) for t in tables if t.num_rows])
    order = np.argsort(s, kind="stable")
    s, e = s[order], np.maximum(e[order], s[order])
    reach = np.maximum.accumulate(e)
    gap = s[1:] > reach[:-1]  # a new busy interval starts after everything before it ended
    return reach[:-1][gap], s[1:][gap]


def _overlap(start: np.ndarray, end: np.ndarray, idle_s: np.ndarray, idle_e: np.ndarray) -> np.ndarray:
    """Per call, the length of [start, end) inside the idle intervals: idle time before end
    minus idle time before start, from the intervals' cumulative lengths."""
    cum = np.concatenate([[0], np.cumsum(idle_e - idle_s)])

    def before(x: np.ndarray) -> np.ndarray:
        i = np.searchsorted(idle_s, x, side="right")  # intervals starting at or before x
        partial = np.where(i > 0, np.clip(x - idle_s[np.maximum(i - 1, 0)], 0,
                                          (idle_e - idle_s)[np.maximum(i - 1, 0)]), 0)
        return cum[np.maximum(i - 1, 0)] * (i > 0) + partial

    return np.maximum(before(end) - before(start), 0)
