"""ranges -- the program's own annotations: record_function, pastaprof.range, NVTX ranges.

Every host-side range (``tools/_ranges.py host_ranges``: Kineto's ``user_annotation``, live
capture's ``pastaprof.range`` / ``record_function`` / NVTX; never the GPU-side ``gpu_user``
projections, which repeat the host ranges) is grouped by its *family*: the name with a trailing
number replaced by ``N`` (``step0``, ``step1`` -> ``stepN``; ``ProfilerStep#7`` ->
``ProfilerStep#N``), so one row covers every iteration of a loop.

Per family and domain (table ``ranges``): ``count``, ``total_ns``, ``mean_ns``, ``median_ns``,
``p99_ns`` (nearest rank), ``max_ns``; ``gpu_ns`` and ``gpu_activities``: the kernels, copies
and memsets whose launching runtime call (matched by correlation) started inside the range on
the range's own thread -- the GPU work the range asked for, wherever it ran on the device
clock; ``gpu_share`` = gpu_ns / total_ns.  Nested ranges each count their own launches.

Finding: a family with at least ``MIN_INSTANCES`` ranges whose instances vary, where the time
above the family's median (summed over its instances) is at least ``JITTER_SHARE`` of the
time covered by any range -- ``impact_ns`` is that excess: the time the slow
instances took beyond a typical one.
"""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pastaprof.events.schema import GPU_ACTIVITY_KINDS
from pastaprof.processor.intervals import group_codes
from pastaprof.tools._ranges import host_ranges
from pastaprof.tools._timeline_math import KeyIndex, name_codes, to_np
from pastaprof.tools.base import Finding, Report, Tool, sql

MIN_INSTANCES = 5     # variation means something with this many instances of a family ...
JITTER_SHARE = 0.05   # ... when the excess over the median is >= 5% of all ranges' time
_FAMILY = re.compile(r"(?<=[#_ \-.:A-Za-z])\d+$")
DISPLAY = {"ranges": ["range", "domain", "count", "total_ns", "mean_ns", "p99_ns", "max_ns", "gpu_ns", "gpu_share"]}


def family(name: str) -> str:
    """``step3`` -> ``stepN``; a name that is only digits stays itself."""
    return _FAMILY.sub("N", name)


def launched_inside(rng: pa.Table, acts: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Per range row: (summed duration, count) of the activities launched inside it on its thread."""
    n = rng.num_rows
    gpu, cnt = np.zeros(n, np.int64), np.zeros(n, np.int64)
    if n == 0 or len(acts["launch"]) == 0:
        return gpu, cnt
    keys = [np.concatenate([to_np(rng[c]), acts[c]]) for c in ("rank", "pid", "tid")]
    g = group_codes(*keys)
    g_rng, g_act = g[:n], g[n:]
    order = np.lexsort((acts["launch"], g_act))
    ga, la, da = g_act[order], acts["launch"][order], acts["dur"][order]
    csum = np.concatenate([[0], np.cumsum(da)])
    lo_t = to_np(rng["start_ns"])
    hi_t = np.maximum(to_np(rng["end_ns"]), lo_t)  # a damaged range ending before it starts holds nothing
    bounds = np.searchsorted(ga, np.arange(int(g.max()) + 2))  # segment of each group in the sorted acts
    for grp in np.unique(g_rng):
        rows = np.flatnonzero(g_rng == grp)
        a, b = bounds[grp], bounds[grp + 1]
        if a == b:
            continue
        i = a + np.searchsorted(la[a:b], lo_t[rows], side="left")
        j = a + np.searchsorted(la[a:b], hi_t[rows], side="left")
        gpu[rows], cnt[rows] = csum[j] - csum[i], j - i
    return gpu, cnt


def _covered(t: pa.Table) -> int:
    """Time covered by at least one range, summed over ranks (the relative threshold's base)."""
    from pastaprof.tools._timeline_math import merged

    rank, start, end = to_np(t["rank"]), to_np(t["start_ns"]), to_np(t["end_ns"])
    total = 0
    for r in np.unique(rank):
        m = np.flatnonzero(rank == r)
        m = m[np.argsort(start[m], kind="stable")]
        a, b, _ = merged(start[m], np.maximum(end[m], start[m]))
        total += int((b - a).sum())
    return total


class Ranges(Tool):
    name = "ranges"
    description = "User/NVTX/record_function ranges: count, total, mean, p99 time and the GPU time launched inside"
    consumes = ("range", "api", "kernel", "memcpy", "memset")

    def _activities(self) -> dict[str, np.ndarray]:
        """Launched GPU activities: launch-call start, duration, and the call's rank/pid/tid."""
        api = self.table("api")
        index = KeyIndex(to_np(api["rank"], dtype=np.int32), to_np(api["correlation"]))
        cols = {k: to_np(api[c]) for k, c in (("launch", "start_ns"), ("rank", "rank"), ("pid", "pid"),
                                              ("tid", "tid"))}
        parts = []
        for kind in GPU_ACTIVITY_KINDS:
            t = self.table(kind)
            if not t.num_rows:
                continue
            row = index.find(to_np(t["rank"], dtype=np.int32), to_np(t["correlation"]))
            ok = row >= 0
            d = np.maximum(to_np(t["end_ns"]) - to_np(t["start_ns"]), 0)[ok]
            parts.append({"dur": d, **{k: v[row[ok]] for k, v in cols.items()}})
        if not parts:
            return {k: np.zeros(0, np.int64) for k in ("dur", *cols)}
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    def report(self) -> Report:
        rng = host_ranges(self.table("range"))
        if not rng.num_rows:
            return Report(self.name, summary={"ranges": 0, "note": "no host ranges (record_function, "
                                              "pastaprof.range, NVTX or user annotations) in this run"})
        codes, names = name_codes(rng["name"])
        fam = np.array([family(x) for x in names], dtype=object)[codes] if len(names) else np.zeros(0, object)
        gpu, cnt = launched_inside(rng, self._activities())
        t = pa.table({"rank": rng["rank"], "range": pa.array(fam, pa.string()),
                      "name": rng["name"].cast(pa.string()),
                      "domain": pc.fill_null(rng["domain"].cast(pa.string()), "user"),
                      "start_ns": rng["start_ns"], "end_ns": rng["end_ns"],
                      "d": pc.max_element_wise(pc.subtract(rng["end_ns"], rng["start_ns"]), 0),
                      "gpu_ns": gpu, "gpu_activities": cnt})
        con = sql(r=t)
        table = con.sql("""
            WITH med AS (SELECT range, domain, quantile_cont(d, 0.5) AS m FROM r GROUP BY ALL)
            SELECT range, domain, count(*) AS count, count(DISTINCT name) AS names, sum(d)::BIGINT AS total_ns,
                   avg(d) AS mean_ns, quantile_disc(d, 0.5) AS median_ns, quantile_disc(d, 0.99) AS p99_ns,
                   max(d) AS max_ns, sum(gpu_ns)::BIGINT AS gpu_ns, sum(gpu_activities)::BIGINT AS gpu_activities,
                   round(sum(gpu_ns) / NULLIF(sum(d), 0), 4) AS gpu_share,
                   sum(greatest(d - med.m, 0))::BIGINT AS excess_ns
            FROM r JOIN med USING (range, domain) GROUP BY ALL ORDER BY total_ns DESC, range, domain
        """).to_arrow_table()
        covered = _covered(t)
        findings = []
        for r in table.to_pylist():
            if r["count"] >= MIN_INSTANCES and covered and r["excess_ns"] >= JITTER_SHARE * covered:
                findings.append(Finding(
                    "info", f"range {r['range']} varies: p99 {r['p99_ns'] / max(r['median_ns'], 1):.1f}x its median",
                    {"impact_ns": r["excess_ns"], "count": r["count"], "median_ns": r["median_ns"],
                     "p99_ns": r["p99_ns"], "max_ns": r["max_ns"],
                     "suggestion": "Look at what the slow instances do differently (first-call work, data "
                                   "loading, synchronization); keep warm-up out of the measurement."},
                    location=f"range {r['range']}", kind=f"range varies: {r['range']}"))
        summary = {"ranges": rng.num_rows, "families": table.num_rows, "covered_ns": covered,
                   "gpu_ns": int(gpu.sum()), "gpu_activities": int(cnt.sum())}
        return Report(self.name, tables={"ranges": table.drop_columns(["excess_ns"])}, findings=findings,
                      summary=summary, display=DISPLAY, details={"per range": t.drop_columns(["d"])})
