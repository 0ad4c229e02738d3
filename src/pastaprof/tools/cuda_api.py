"""cuda_api -- the host side of the GPU: CUDA/HIP API calls, and the ones that make the host wait.

Table ``apis``: per API name, calls, total / mean / p50 / p99 / max host time, share of all API
time, and whether the call synchronizes.

Synchronizing calls (table ``syncs``), each with the op that made it and its Python call site:

* ``sync``: stream / device / event / context synchronize (``cudaStreamSynchronize``,
  ``cudaDeviceSynchronize``, ``cudaEventSynchronize``, ``cuCtxSynchronize``, HIP's too);
* ``blocking memcpy``: a memcpy API without ``Async`` (``cudaMemcpy``, ``cuMemcpyDtoH_v2``, ...);
* ``pageable memcpy``: an ``...Async`` copy whose host side is pageable memory (Kineto names it
  ``Memcpy DtoH (Device -> Pageable)``): the driver completes it before returning.

The op is the outermost op around the call (``aten::item`` for ``.item()``, ``aten::to`` for
``.cpu()`` / ``.to("cpu")``: their inner ``aten::_local_scalar_dense`` / ``aten::copy_`` issue
the copy and the synchronize); the call site is that op's (the innermost Python frame outside
torch), else the innermost such frame around the call itself (``torch.cuda.synchronize()``
outside any op).  Blocked time is the call's host duration.

Findings: one per cause (the kind above and the op that made the call) and call site, over all
ranks, when the blocked time is at least ``SYNC_MIN_SHARE`` of the host span (first to last host
event, summed over ranks); ``impact_ns`` = the blocked time.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pastaprof.processor.intervals import group_codes, innermost_enclosing
from pastaprof.processor.link import _is_library
from pastaprof.tools._timeline_math import KeyIndex, fmt_ns, name_codes, to_np
from pastaprof.tools.base import Finding, Report, Tool, sql

SYNC_RE = re.compile(r"^(cuda|hip)(Stream|Device|Event|Thread|Ctx)Synchronize$|^cu(Stream|Ctx|Event)Synchronize(_v\d+)?$")
BLOCKING_MEMCPY_RE = re.compile(
    r"^(cuda|hip)Memcpy(2D|3D|Peer|ToSymbol|FromSymbol|ToArray|FromArray|2DToArray|2DFromArray|DtoH|HtoD|DtoD)?$"
    r"|^cuMemcpy(DtoH|HtoD|DtoD|AtoH|HtoA|DtoA|AtoD|AtoA|2D|2DUnaligned|3D|Peer|3DPeer)?(_v\d+)?$")
SYNC_MIN_SHARE = 0.01      # a cause+site blocking the host >= 1% of the host span is a finding ...
SYNC_WARN_SHARE = 0.10     # ... a warning from 10%
ITEM_OPS = ("aten::item", "aten::_local_scalar_dense")
COPY_OPS = ("aten::to", "aten::_to_copy", "aten::copy_", "aten::cpu")
SUGGESTIONS = {
    "item": "Keep the value on the GPU (accumulate a tensor) and read it with .item() once every N steps, "
            "not every iteration.",
    "copy": "Copy into pinned memory with non_blocking=True and synchronize once where the values are needed, "
            "or move the read out of the loop.",
    "sync": "Drop the explicit synchronize from the loop, or wait on an event only where the result is needed.",
    "pageable memcpy": "Use pinned (page-locked) host memory so the copy runs asynchronously.",
    "blocking memcpy": "Use the Async copy on a stream with pinned host memory.",
}
DISPLAY = {"apis": ["name", "calls", "total_ns", "mean_ns", "p99_ns", "max_ns", "share", "synchronizing"],
           "syncs": ["kind", "api", "op", "call_site", "calls", "blocked_ns", "p99_ns", "ranks"]}


def pattern_mask(names: list[str], pattern: re.Pattern[str]) -> np.ndarray:
    """Per distinct name: does it match (one regex call per distinct name, never per event)."""
    return np.array([bool(pattern.match(n)) for n in names], dtype=bool)


def root_ops(op: pa.Table) -> np.ndarray:
    """Row of the outermost op around each op (itself at depth 0), by pointer jumping on parent_id."""
    n = op.num_rows
    if n == 0:
        return np.zeros(0, np.int64)
    row = KeyIndex(to_np(op["rank"], dtype=np.int32), to_np(op["id"]))
    parent = row.find(to_np(op["rank"], dtype=np.int32), to_np(op["parent_id"])).astype(np.int64)
    root = np.where(parent >= 0, parent, np.arange(n))
    for _ in range(64):  # doubling: log2(depth) passes
        nxt = root[root]
        if np.array_equal(nxt, root):
            return root
        root = nxt
    # parent_id cycles (a damaged store) never settle: the ops on or under one are their own roots
    return np.where(root[root] == root, root, np.arange(n))


def user_frames_around(frame: pa.Table, rank: np.ndarray, pid: np.ndarray, tid: np.ndarray,
                       t: np.ndarray) -> pa.Array:
    """Name (``file(line): function``) of the innermost Python frame outside torch/pastaprof
    around each (rank, pid, tid, time), or null -- the op call site's rule, for host calls
    made outside any op."""
    n = len(t)
    if frame.num_rows == 0 or n == 0:
        return pa.nulls(n, pa.string())
    codes, files = name_codes(frame["file"])
    library = _is_library(pa.chunked_array([pa.array(files, pa.string())]))[codes]  # per distinct file
    usr = np.flatnonzero(~library & ~pc.fill_null(frame["is_module"], False).to_numpy(zero_copy_only=False))
    f = frame.take(pa.array(usr))
    g = group_codes(np.r_[to_np(f["rank"]), rank], np.r_[to_np(f["pid"]), pid], np.r_[to_np(f["tid"]), tid])
    hit = innermost_enclosing(g[:len(usr)], to_np(f["start_ns"]), to_np(f["end_ns"]), g[len(usr):], t)
    return f["name"].cast(pa.string()).combine_chunks().take(pa.array(hit, mask=hit < 0))


def host_span_ns(tables: list[pa.Table]) -> int:
    """Sum over ranks of (last end - first start) of the given host tables."""
    parts = [t.select(["rank", "start_ns", "end_ns"]) for t in tables if t.num_rows]
    if not parts:
        return 0
    con = sql(h=pa.concat_tables(parts))
    return int(con.execute("SELECT coalesce(sum(s), 0) FROM (SELECT max(end_ns) - min(start_ns) AS s "
                           "FROM h GROUP BY rank)").fetchall()[0][0])


class CudaApi(Tool):
    name = "cuda_api"
    description = ("CUDA/HIP API calls: count, total and p99 time per API; synchronizing calls "
                   "(syncs, blocking and pageable copies, .item()/.cpu()) with their op and call site")
    consumes = ("api", "op", "frame", "memcpy")
    optional = ("frame",)  # call sites of calls outside any op, where frames were recorded (imports)

    def report(self) -> Report:
        api = self.table("api")
        if api.num_rows == 0:
            return Report(self.name, summary={"note": "no CUDA/HIP API calls in this run (a CPU-only trace, "
                                                      "or a capture without CUPTI)"})
        codes, names = name_codes(api["name"])
        sync = pattern_mask(names, SYNC_RE)[codes]
        blocking = pattern_mask(names, BLOCKING_MEMCPY_RE)[codes]
        pageable = self._pageable_calls(api)
        kind = np.where(sync, "sync", np.where(blocking, "blocking memcpy",
                                               np.where(pageable, "pageable memcpy", "")))
        d = np.maximum(to_np(api["end_ns"]) - to_np(api["start_ns"]), 0)  # a negative duration blocks nothing
        calls = pa.table({"name": api["name"].cast(pa.string()), "d": d,
                          "kind": pa.array(kind)})
        con = sql(calls=calls)
        apis = con.sql("""
            SELECT name, count(*) AS calls, sum(d)::BIGINT AS total_ns, avg(d) AS mean_ns,
                   quantile_disc(d, 0.5) AS p50_ns, quantile_disc(d, 0.99) AS p99_ns, max(d) AS max_ns,
                   sum(d) / (SELECT sum(d) FROM calls) AS share,
                   bool_or(kind = 'sync' OR kind = 'blocking memcpy') AS synchronizing,
                   count(*) FILTER (kind = 'pageable memcpy') AS pageable_calls
            FROM calls GROUP BY name ORDER BY total_ns DESC, name
        """).to_arrow_table()
        rows = np.flatnonzero(kind != "")
        syncs = self._syncs(api.take(pa.array(rows)), kind[rows])
        span = host_span_ns([api, self.table("op")])
        totals = con.execute("SELECT count(*), coalesce(sum(d), 0)::BIGINT FROM calls WHERE kind <> ''").fetchall()[0]
        summary: dict[str, Any] = {
            "api_calls": api.num_rows, "api_ns": int(d.sum()), "distinct_apis": apis.num_rows,
            "sync_calls": int(totals[0]), "sync_blocked_ns": int(totals[1]), "host_span_ns": span,
            "sync_share_of_span": round(totals[1] / span, 4) if span else None,
        }
        return Report(self.name, tables={"apis": apis, "syncs": syncs}, findings=self._findings(syncs, span),
                      summary=summary, display=DISPLAY)

    def _pageable_calls(self, api: pa.Table) -> np.ndarray:
        """Per API row: does it launch a copy whose host memory is pageable (by the copy's name)."""
        mc = self.table("memcpy")
        out = np.zeros(api.num_rows, bool)
        if mc.num_rows == 0:
            return out
        codes, names = name_codes(mc["name"])
        page = np.array(["pageable" in n.lower() for n in names], bool)[codes]
        if not page.any():
            return out
        found = KeyIndex(to_np(api["rank"], dtype=np.int32), to_np(api["correlation"])).find(
            to_np(mc["rank"], dtype=np.int32)[page], to_np(mc["correlation"])[page])
        out[found[found >= 0]] = True
        return out

    def _syncs(self, calls: pa.Table, kind: np.ndarray) -> pa.Table:
        """Synchronizing calls grouped by (kind, api, outer op, call site)."""
        op = self.table("op")
        row = KeyIndex(to_np(op["rank"], dtype=np.int32), to_np(op["id"])).find(
            to_np(calls["rank"], dtype=np.int32), to_np(calls["op_id"]))
        n = calls.num_rows
        has = row >= 0
        op_name, inner, site = (pa.nulls(n, pa.string()) for _ in range(3))
        if has.any():
            root = root_ops(op)[np.clip(row, 0, None)]

            def pick(col: str, rows: np.ndarray) -> pa.Array:  # take first, cast the few taken values
                return op[col].take(pa.array(rows, mask=~has)).cast(pa.string())

            op_name, inner = pick("name", root), pick("name", np.clip(row, 0, None))
            site = pc.coalesce(pick("call_site", np.clip(row, 0, None)), pick("call_site", root))
        missing = np.flatnonzero(~pc.is_valid(site).to_numpy(zero_copy_only=False))
        if len(missing):  # no op, or an op without a call site: the Python frame around the call itself
            around = user_frames_around(self.table("frame"), *(to_np(calls[c]).take(missing) for c in
                                                                ("rank", "pid", "tid", "start_ns")))
            filled = np.array(site.to_pylist(), dtype=object)  # one value per synchronizing call
            filled[missing] = around.to_pylist()
            site = pa.array(filled, pa.string())
        t = pa.table({"kind": pa.array(kind, pa.string()), "api": calls["name"].cast(pa.string()),
                      "op": op_name, "inner_op": inner, "call_site": site,
                      "rank": calls["rank"], "d": np.maximum(to_np(calls["end_ns"]) - to_np(calls["start_ns"]), 0)})
        return sql(t=t).sql("""
            SELECT kind, api, op, call_site, count(*) AS calls, sum(d)::BIGINT AS blocked_ns,
                   quantile_disc(d, 0.99) AS p99_ns, max(d) AS max_ns,
                   first(inner_op ORDER BY inner_op) AS inner_op, list(DISTINCT rank ORDER BY rank) AS ranks
            FROM t GROUP BY kind, api, op, call_site ORDER BY blocked_ns DESC, kind, api
        """).to_arrow_table()

    @staticmethod
    def _cause(kind: str, op: str | None) -> str:
        if op in ITEM_OPS:
            return "item"
        if op in COPY_OPS:
            return "copy"
        return kind if kind != "sync" else "sync"

    def _findings(self, syncs: pa.Table, span: int) -> list[Finding]:
        if not span or syncs.num_rows == 0:
            return []
        groups: dict[tuple, dict[str, Any]] = {}
        for r in syncs.to_pylist():  # one row per (kind, api, op, site): few
            cause = self._cause(r["kind"], r["op"])
            g = groups.setdefault((cause, r["op"], r["call_site"]), {"blocked_ns": 0, "calls": 0, "apis": {},
                                                                     "ranks": set(), "max_ns": 0})
            g["blocked_ns"] += r["blocked_ns"]
            g["calls"] += r["calls"]
            g["apis"][r["api"]] = g["apis"].get(r["api"], 0) + r["calls"]
            g["ranks"].update(r["ranks"])
            g["max_ns"] = max(g["max_ns"], r["max_ns"])
        out = []
        for (cause, op, site), g in sorted(groups.items(), key=lambda kv: -kv[1]["blocked_ns"]):
            share = g["blocked_ns"] / span
            if share < SYNC_MIN_SHARE:
                continue
            what = {"item": f"{op} (.item())", "copy": f"{op} to the host (.cpu()/.to())"}.get(cause, op or "no op")
            apis = ", ".join(f"{n} x{c}" for n, c in sorted(g["apis"].items(), key=lambda kv: -kv[1]))
            title = (f"host blocked {fmt_ns(g['blocked_ns'])} ({share:.1%} of the host span) in {g['calls']} "
                     f"synchronizing calls from {what}")
            evidence = {"impact_ns": g["blocked_ns"], "calls": g["calls"], "share_of_span": round(share, 4),
                        "apis": apis, "max_ns": g["max_ns"], "ranks": sorted(g["ranks"]), "cause": cause,
                        "suggestion": SUGGESTIONS[cause]}
            out.append(Finding("warning" if share >= SYNC_WARN_SHARE else "info", title, evidence,
                               site or op or "(no op, no call site)"))
        return out
