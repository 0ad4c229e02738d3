"""The HTML report's own aggregates: GPU busy time in fixed time bins, per stream and per device.

The tools' Reports say how much time went where in total; a timeline overview needs *when*.
Events are never copied into the page: :class:`TimeBins` (a Tool, so it rides along with the
analysis in the same pass over the events, live or offline) reduces every kernel, copy and
memset to ``BINS`` numbers per lane (rank, device, stream) and per class (compute,
communication, memory), exactly -- the busy nanoseconds of a bin are the overlap of each
interval with it, from prefix sums over sorted starts and ends, with no Python object per
event.  A device's line is the union of its streams (two overlapping kernels count once).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pastaprof.tools._timeline_math import COMM_RE, MEMORY_RE, name_codes, to_np
from pastaprof.tools.base import Report, Tool

BINS = 300
#: More lanes (rank, device, stream) than this: the heatmap shows devices, not streams.
MAX_STREAM_LANES = 96
#: More devices than this: device rows are dropped (per-rank totals remain).
MAX_DEVICE_LANES = 1024
CLASSES = ("compute", "communication", "memory")
TOOL_NAME = "html_bins"


def busy_per_bin(start: np.ndarray, end: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Nanoseconds of the intervals ``[start, end)`` inside each bin ``[edges[k], edges[k+1])``.

    F(t) = sum_i clamp(t - s_i, 0, e_i - s_i) = sum_{s_i < t} (t - s_i) - sum_{e_i < t} (t - e_i);
    a bin's busy time is F(right) - F(left).  Times are relative (small int64): no overflow for
    spans below ~10^12 ns with millions of intervals."""
    if len(start) == 0:
        return np.zeros(len(edges) - 1, dtype=np.int64)
    s = np.sort(start)
    e = np.sort(end)
    cs = np.concatenate(([0], np.cumsum(s)))
    ce = np.concatenate(([0], np.cumsum(e)))
    ks = np.searchsorted(s, edges, "left")
    ke = np.searchsorted(e, edges, "left")
    f = (ks * edges - cs[ks]) - (ke * edges - ce[ke])
    return np.diff(f)


def union(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Overlapping or touching intervals merged (vectorized: running maximum of the ends)."""
    if len(start) == 0:
        return start, end
    order = np.argsort(start, kind="stable")
    s, e = start[order], end[order]
    reach = np.maximum.accumulate(e)
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = s[1:] > reach[:-1]
    first = np.flatnonzero(new)
    last = np.concatenate((first[1:] - 1, [len(s) - 1]))
    return s[first], reach[last]


def group_codes(*cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct key rows, the row of each event): per-column dense codes combined into one
    int64 (a 1-D unique; ``np.unique(axis=0)`` sorts rows as void and is many times slower)."""
    code = np.zeros(len(cols[0]), dtype=np.int64)
    values = []
    for col in cols:
        vals, inv = np.unique(col, return_inverse=True)
        code = code * len(vals) + inv.reshape(-1)
        values.append(vals)
    distinct, of = np.unique(code, return_inverse=True)
    keys = np.empty((len(distinct), len(cols)), dtype=np.int64)
    rest = distinct.copy()
    for j in range(len(cols) - 1, -1, -1):
        n = len(values[j])
        keys[:, j] = values[j][rest % n]
        rest //= n
    return keys, of.reshape(-1)


def _classes(kind: str, table: pa.Table) -> np.ndarray:
    """Class code per row: kernels by HTA's name rules (NCCL: communication), copies and
    memsets are memory."""
    if kind != "kernel":
        return np.full(table.num_rows, 2, dtype=np.int8)
    codes, names = name_codes(table["name"])
    per_name = np.array([1 if COMM_RE.match(n) else 2 if MEMORY_RE.match(n) else 0 for n in names] or [0],
                        dtype=np.int8)
    return per_name[codes]


class TimeBins(Tool):
    """GPU busy time per time bin, lane and class, for the HTML report's timeline overview."""

    name: ClassVar[str] = TOOL_NAME
    description: ClassVar[str] = "GPU busy time in time bins (the HTML report's timeline)"
    consumes: ClassVar[tuple[str, ...]] = ("kernel", "memcpy", "memset")

    def _columns(self) -> dict[str, np.ndarray]:
        parts: dict[str, list[np.ndarray]] = {k: [] for k in ("start", "end", "rank", "device", "stream", "cls")}
        for kind in self.consumes:
            t = self.table(kind)
            if not t.num_rows:
                continue
            t = t.filter(pc.is_valid(t["start_ns"]))
            parts["start"].append(to_np(t["start_ns"], 0))
            parts["end"].append(np.maximum(to_np(t["end_ns"], 0), to_np(t["start_ns"], 0)))
            parts["rank"].append(to_np(t["rank"], 0))
            parts["device"].append(to_np(t["device"], -1))
            parts["stream"].append(to_np(t["stream"], -1))
            parts["cls"].append(_classes(kind, t))
        return {k: np.concatenate(v) if v else np.zeros(0, dtype=np.int64) for k, v in parts.items()}

    def report(self) -> Report:
        c = self._columns()
        if not len(c["start"]):
            return Report(self.name, summary={"bins": 0, "note": "no GPU activity in this run"})
        t0, t1 = int(c["start"].min()), int(c["end"].max())
        bin_ns = max(1, -(-(t1 - t0) // BINS))
        edges = np.arange(BINS + 1, dtype=np.int64) * bin_ns
        start, end = c["start"] - t0, c["end"] - t0
        keys, lane_of = group_codes(c["rank"], c["device"], c["stream"])
        order = np.argsort(lane_of, kind="stable")
        bounds = np.searchsorted(lane_of[order], np.arange(len(keys) + 1))
        streams, per_rank = [], {}
        for i, (rank, device, stream) in enumerate(keys.tolist()):
            rows = order[bounds[i]:bounds[i + 1]]
            by_class = {}
            for code, cls in enumerate(CLASSES):
                sel = rows[c["cls"][rows] == code]
                by_class[cls] = busy_per_bin(start[sel], end[sel], edges)
            lane = {"rank": rank, "device": device, "stream": stream,
                    "events": int(len(rows)), "busy_ns": {k: int(v.sum()) for k, v in by_class.items()}}
            if len(keys) <= MAX_STREAM_LANES:
                lane["bins"] = {k: v.tolist() for k, v in by_class.items()}
            streams.append(lane)
            tot = per_rank.setdefault(rank, dict.fromkeys(CLASSES, 0))
            for k, v in lane["busy_ns"].items():
                tot[k] += v
        devices = self._devices(c, start, end, edges)
        return Report(self.name, summary={
            "bins": BINS, "t0_ns": t0, "bin_ns": bin_ns, "span_ns": t1 - t0, "streams": streams,
            "devices": devices, "per_rank": [{"rank": r, **v} for r, v in sorted(per_rank.items())]})

    def _devices(self, c: dict[str, np.ndarray], start: np.ndarray, end: np.ndarray,
                 edges: np.ndarray) -> list[dict[str, Any]]:
        """Per (rank, device): the union of its streams per bin (busy, any class)."""
        keys, dev_of = group_codes(c["rank"], c["device"])
        if len(keys) > MAX_DEVICE_LANES:
            return []
        order = np.argsort(dev_of, kind="stable")
        bounds = np.searchsorted(dev_of[order], np.arange(len(keys) + 1))
        out = []
        for i, (rank, device) in enumerate(keys.tolist()):
            rows = order[bounds[i]:bounds[i + 1]]
            s, e = union(start[rows], end[rows])
            bins = busy_per_bin(s, e, edges)
            out.append({"rank": rank, "device": device, "busy_ns": int(bins.sum()), "bins": bins.tolist()})
        return out
