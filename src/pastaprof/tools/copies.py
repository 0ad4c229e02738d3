"""copies -- GPU copies: bandwidth per kind, synchronous copies, copies that do not overlap compute.

Copy kind (table ``kinds``): the direction (HtoD, DtoH, DtoD, ...) and the host memory, read from
Kineto's copy name ``Memcpy DtoH (Device -> Pageable)``: ``pinned``, ``pageable``, ``device``
(DtoD) or ``unknown`` (live CUPTI captures and older traces name no memory).  Bandwidth =
bytes / copy time (GB/s == bytes per ns), over the kind and per copy (median).

Synchronous copies (table ``synchronous``): launched by a memcpy API without ``Async``
(``blocking memcpy``), or from pageable host memory (``pageable``: the driver finishes the
copy before the call returns), or by an op that synchronizes right after (``synchronized``:
the same op also calls a synchronize, as ``.cpu()`` does).

Overlap (table ``overlap``, per rank, device, stream, direction): a copy is *exposed* for the
part of its time when no kernel of its device runs (on any stream); ``compute_stream`` says the
stream also runs compute kernels, so the copy waits for them and they for it.

Findings (``impact_ns`` always the time at stake; thresholds are shares of the rank's span, so
more steps of the same program give the same findings):

Each finding needs ``MIN_SHARE`` of the summed span of the ranks involved (a warning from ``WARN_SHARE``).

* pageable copies of at least ``PAGEABLE_MIN_BYTES``: impact = their time minus the time the
  same bytes take at pinned bandwidth -- measured in this trace (pinned copies of at least
  ``PAGEABLE_MIN_BYTES``, same direction first, else any direction), else the stated
  ``REFERENCE_PINNED_GBPS``; one finding per direction and call site;
* exposed copy time per direction, memory and call site, at least ``MIN_SHARE`` of the span --
  pageable copies aside: they cannot overlap anything until pinned, which the first finding says.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pastaprof.tools._by_rank import rank_rows
from pastaprof.tools._timeline_math import (
    COMPUTATION,
    KeyIndex,
    fmt_ns,
    hta_kernel_class,
    merged,
    name_codes,
    overlap,
    to_np,
)
from pastaprof.tools.base import Finding, Report, Tool, sql
from pastaprof.tools.cuda_api import BLOCKING_MEMCPY_RE, SYNC_RE, pattern_mask

PAGEABLE_MIN_BYTES = 1 << 20     # below this a copy is latency-bound: pinning buys little
REFERENCE_PINNED_GBPS = 25.0     # stated reference when the trace has no big pinned copy: PCIe 4.0 x16, pinned
MIN_SHARE = 0.01                 # a finding needs impact >= 1% of the rank's span ...
WARN_SHARE = 0.10                # ... and is a warning from 10%
MEMORY_WORDS = {"pinned": "pinned", "pageable": "pageable", "device": "device", "managed": "managed",
                "array": "array"}
DISPLAY = {
    "kinds": ["direction", "memory", "copies", "bytes", "total_ns", "gbps", "median_gbps", "synchronous",
              "exposed_ns"],
    "synchronous": ["reason", "direction", "memory", "op", "call_site", "copies", "bytes", "copy_ns", "ranks"],
    "overlap": ["rank", "device", "stream", "direction", "copies", "copy_ns", "exposed_ns", "compute_stream"],
}


def host_memory(names: list[str], direction: list[str]) -> list[str]:
    """Per distinct (name, direction): the host-side memory named in ``Memcpy X (Src -> Dst)``."""
    out = []
    for n, d in zip(names, direction):
        inside = n[n.find("(") + 1:n.rfind(")")] if "(" in n and "->" in n else ""
        src, _, dst = (p.strip().lower() for p in inside.partition("->"))
        side = dst if d == "DtoH" else src if d == "HtoD" else src if src != "device" else dst
        out.append(MEMORY_WORDS.get(side, "unknown") if inside else ("device" if d == "DtoD" else "unknown"))
    return out


class Copies(Tool):
    name = "copies"
    description = ("GPU copies: bandwidth per kind (direction, pinned/pageable), synchronous copies, "
                   "copies not overlapped with compute")
    consumes = ("memcpy", "kernel", "api", "op")

    def report(self) -> Report:
        mc = self.table("memcpy")
        if mc.num_rows == 0:
            return Report(self.name, summary={"note": "no GPU copies in this run"})
        t = self._copies(mc)
        con = sql(c=t)
        kinds = con.sql("""
            SELECT direction, memory, count(*) AS copies, sum(bytes)::BIGINT AS bytes, sum(d)::BIGINT AS total_ns,
                   sum(bytes) / NULLIF(sum(d), 0) AS gbps, median(bytes / NULLIF(d, 0)) AS median_gbps,
                   max(bytes) AS max_bytes, count(*) FILTER (reason IS NOT NULL) AS synchronous,
                   sum(exposed)::BIGINT AS exposed_ns
            FROM c GROUP BY ALL ORDER BY total_ns DESC, direction, memory
        """).to_arrow_table()
        synchronous = con.sql("""
            SELECT reason, direction, memory, op, call_site, count(*) AS copies, sum(bytes)::BIGINT AS bytes,
                   sum(d)::BIGINT AS copy_ns, list(DISTINCT rank ORDER BY rank) AS ranks
            FROM c WHERE reason IS NOT NULL GROUP BY ALL ORDER BY copy_ns DESC, reason, direction
        """).to_arrow_table()
        overlap_t = con.sql("""
            SELECT rank, device, stream, direction, count(*) AS copies, sum(d)::BIGINT AS copy_ns,
                   sum(exposed)::BIGINT AS exposed_ns, bool_or(compute_stream) AS compute_stream
            FROM c GROUP BY ALL ORDER BY exposed_ns DESC, rank, device, stream, direction
        """).to_arrow_table()
        spans = dict(con.execute("SELECT rank, any_value(span) FROM c GROUP BY rank").fetchall())
        ref = self._reference(con)
        findings = self._pageable_findings(con, ref, spans) + self._exposed_findings(con, spans)
        totals = con.execute("SELECT count(*), sum(bytes)::BIGINT, sum(d)::BIGINT, sum(exposed)::BIGINT, "
                             "count(*) FILTER (reason IS NOT NULL) FROM c").fetchall()[0]
        summary: dict[str, Any] = {"copies": int(totals[0]), "bytes": int(totals[1] or 0), "copy_ns": int(totals[2] or 0),
                                   "exposed_ns": int(totals[3] or 0), "synchronous": int(totals[4]),
                                   "pinned_reference_gbps": round(ref[0], 2), "pinned_reference": ref[1]}
        return Report(self.name, tables={"kinds": kinds, "synchronous": synchronous, "overlap": overlap_t},
                      findings=findings, summary=summary, display=DISPLAY)

    # ------------------------------------------------------------------ per copy

    def _copies(self, mc: pa.Table) -> pa.Table:
        """One row per copy: direction, memory, bytes, duration, sync reason, exposed time, op, site, span."""
        n = mc.num_rows
        codes, names = name_codes(mc["name"])
        dcodes, dnames = name_codes(mc["direction"])
        pair, inv = np.unique(np.stack([codes, dcodes], axis=1), axis=0, return_inverse=True)
        mem = np.array(host_memory([names[a] for a in pair[:, 0]], [dnames[b] for b in pair[:, 1]]),
                       dtype=object)[inv.reshape(-1)]
        direction = np.array(dnames, dtype=object)[dcodes]
        start, end = to_np(mc["start_ns"]), to_np(mc["end_ns"])
        end = np.maximum(end, start)
        rank, device = to_np(mc["rank"], dtype=np.int32), to_np(mc["device"], dtype=np.int32)
        stream = to_np(mc["stream"])
        exposed, compute_stream = self._exposure(rank, device, stream, start, end)
        reason, op_row = self._sync_reason(mc, mem)
        op = self.table("op")
        has = op_row >= 0
        take = pa.array(np.clip(op_row, 0, None))
        null = pa.scalar(None, pa.string())
        op_name = pc.if_else(pa.array(has), op["name"].cast(pa.string()).take(take), null) if op.num_rows else \
            pa.nulls(n, pa.string())
        site = pc.if_else(pa.array(has), op["call_site"].cast(pa.string()).take(take), null) if op.num_rows else \
            pa.nulls(n, pa.string())
        span = self._spans(rank)
        return pa.table({
            "rank": rank, "device": device, "stream": stream, "direction": pa.array(direction, pa.string()),
            "memory": pa.array(mem, pa.string()), "bytes": to_np(mc["bytes"], fill=0), "d": end - start,
            "reason": pa.array(reason, pa.string()), "exposed": exposed, "compute_stream": compute_stream,
            "op": op_name, "call_site": site, "span": span,
        })

    def _exposure(self, rank, device, stream, start, end) -> tuple[np.ndarray, np.ndarray]:
        """Per copy: time with no kernel of its (rank, device) running; does its stream run compute kernels."""
        k = self.table("kernel")
        exposed = end - start
        compute_stream = np.zeros(len(start), bool)
        if k.num_rows == 0:
            return exposed, compute_stream
        ks, ke = to_np(k["start_ns"]), to_np(k["end_ns"])
        ke = np.maximum(ke, ks)
        kr, kd, kst = to_np(k["rank"], dtype=np.int32), to_np(k["device"], dtype=np.int32), to_np(k["stream"])
        codes, names = name_codes(k["name"])
        comp = (np.array([hta_kernel_class(x) for x in names], np.int8) == COMPUTATION)[codes]
        busy = KeyIndex(kr[comp], kd[comp], kst[comp])
        compute_stream = busy.find(rank, device, stream) >= 0
        def pair(r: np.ndarray, d: np.ndarray) -> np.ndarray:  # (rank, device) as one int64 key
            return (r.astype(np.int64) << 32) | (d.astype(np.int64) & 0xFFFFFFFF)

        kernels_of, copies_of = rank_rows(pair(kr, kd)), rank_rows(pair(rank, device))
        for key in copies_of.ranks():  # each (rank, device)'s kernels and copies from one sort, not a scan each
            sel = kernels_of[key]
            o = np.argsort(ks[sel], kind="stable")
            a, b, _ = merged(ks[sel][o], ke[sel][o])
            mine = copies_of[key]
            exposed[mine] -= overlap(a, b, start[mine], end[mine])
        return exposed, compute_stream

    def _sync_reason(self, mc: pa.Table, mem: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per copy: why it is synchronous (or None), and the row of its op (-1)."""
        api, op = self.table("api"), self.table("op")
        n = mc.num_rows
        reason = np.full(n, None, dtype=object)
        call = KeyIndex(to_np(api["rank"], dtype=np.int32), to_np(api["correlation"])).find(
            to_np(mc["rank"], dtype=np.int32), to_np(mc["correlation"]))
        op_id = to_np(mc["op_id"])
        reason[mem == "pageable"] = "pageable"
        if api.num_rows:
            codes, names = name_codes(api["name"])
            blocking = pattern_mask(names, BLOCKING_MEMCPY_RE)[codes]
            is_sync = pattern_mask(names, SYNC_RE)[codes]
            # ops that call a synchronize: their copies are waited for right away
            sync_ops = KeyIndex(to_np(api["rank"], dtype=np.int32)[is_sync], to_np(api["op_id"])[is_sync])
            waited = sync_ops.find(to_np(mc["rank"], dtype=np.int32), op_id) >= 0
            reason[(reason == None) & waited] = "synchronized"  # noqa: E711 -- elementwise on an object array
            has = call >= 0
            hit = np.zeros(n, bool)
            hit[has] = blocking[call[has]]
            reason[hit] = "blocking memcpy"
        row = KeyIndex(to_np(op["rank"], dtype=np.int32), to_np(op["id"])).find(to_np(mc["rank"], dtype=np.int32),
                                                                                 op_id)
        return reason, row

    def _spans(self, rank: np.ndarray) -> np.ndarray:
        """Per copy: its rank's span (first start to last end of host and GPU events)."""
        parts = [self.table(k).select(["rank", "start_ns", "end_ns"]) for k in self.consumes if self.table(k).num_rows]
        con = sql(h=pa.concat_tables(parts))
        spans = dict(con.execute("SELECT rank, max(end_ns) - min(start_ns) FROM h GROUP BY rank").fetchall())
        ranks, inverse = np.unique(rank, return_inverse=True)
        return np.array([spans.get(int(r), 0) for r in ranks], np.int64)[inverse.reshape(-1)]

    # ------------------------------------------------------------------ findings

    @staticmethod
    def _reference(con) -> tuple[float, str]:
        """Pinned bandwidth to compare pageable copies with, and where it comes from."""
        rows = con.execute(f"""
            SELECT direction, sum(bytes) / sum(d), count(*), sum(bytes) FROM c
            WHERE memory = 'pinned' AND bytes >= {PAGEABLE_MIN_BYTES} AND d > 0 GROUP BY direction
            ORDER BY direction""").fetchall()
        if not rows:
            return REFERENCE_PINNED_GBPS, f"stated reference {REFERENCE_PINNED_GBPS:g} GB/s (PCIe 4.0 x16, pinned)"
        by_dir = {r[0]: r for r in rows}
        return float(by_dir.get("DtoH", rows[0])[1]), "; ".join(
            f"pinned {r[0]} measured in this trace: {r[1]:.1f} GB/s over {r[2]} copies, {r[3]} bytes" for r in rows)

    def _pageable_findings(self, con, ref: tuple[float, str], spans: dict[int, int]) -> list[Finding]:
        measured = dict(con.execute(f"""SELECT direction, sum(bytes) / sum(d) FROM c WHERE memory = 'pinned'
                                        AND bytes >= {PAGEABLE_MIN_BYTES} AND d > 0 GROUP BY 1""").fetchall())
        rows = con.execute(f"""
            SELECT direction, coalesce(call_site, op, 'stream ' || any_value(stream)) AS loc, count(*), sum(bytes),
                   sum(d), list(DISTINCT rank ORDER BY rank), min(bytes / NULLIF(d, 0)), max(bytes / NULLIF(d, 0))
            FROM c WHERE memory = 'pageable' AND bytes >= {PAGEABLE_MIN_BYTES} AND d > 0
            GROUP BY direction, call_site, op
            ORDER BY sum(d) DESC""").fetchall()
        out = []
        for direction, loc, n, nbytes, d, ranks, lo, hi in rows:
            gbps = measured.get(direction, ref[0])
            source = (f"pinned {direction} measured in this trace" if direction in measured else ref[1])
            impact = int(d - nbytes / gbps)
            share = impact / max(sum(spans.get(r, 0) for r in ranks), 1)
            if impact <= 0 or share < MIN_SHARE:
                continue
            out.append(Finding(
                "warning" if share >= WARN_SHARE else "info",
                f"{n} pageable {direction} copies ran at {nbytes / d:.1f} GB/s vs {gbps:.1f} GB/s pinned: "
                f"{fmt_ns(impact)} ({share:.1%} of the span) lost",
                {"impact_ns": impact, "copies": n, "bytes": int(nbytes), "copy_ns": int(d), "gbps": round(nbytes / d, 3),
                 "min_gbps": round(lo or 0, 3), "max_gbps": round(hi or 0, 3), "pinned_gbps": round(gbps, 3),
                 "pinned_reference": source, "share_of_span": round(share, 4), "ranks": ranks, "cause": "pageable",
                 "suggestion": "Allocate the host buffer pinned (pin_memory=True / torch.empty(..., pin_memory=True)) "
                               "and copy with non_blocking=True."}, loc))
        return out

    def _exposed_findings(self, con, spans: dict[int, int]) -> list[Finding]:
        rows = con.execute("""
            SELECT direction, memory, coalesce(call_site, op, 'stream ' || any_value(stream)) AS loc, count(*),
                   sum(exposed), sum(d), bool_or(compute_stream), list(DISTINCT rank ORDER BY rank),
                   list(DISTINCT stream ORDER BY stream)
            FROM c WHERE memory <> 'pageable' GROUP BY direction, memory, call_site, op
            ORDER BY sum(exposed) DESC""").fetchall()
        out = []
        for direction, memory, loc, n, exposed, d, on_compute, ranks, streams in rows:
            share = exposed / max(sum(spans.get(r, 0) for r in ranks), 1)
            if share < MIN_SHARE:
                continue
            where = (f"on compute stream {', '.join(map(str, streams))}" if on_compute
                     else "with no kernel running")
            tip = ("Move the copy to its own stream (torch.cuda.Stream) from pinned memory with non_blocking=True "
                   "so it overlaps compute, e.g. prefetch the next batch." if on_compute else
                   "Issue the copy earlier, on a side stream with non_blocking=True, while kernels run "
                   "(e.g. prefetch the next batch during this step's compute).")
            out.append(Finding(
                "warning" if share >= WARN_SHARE else "info",
                f"{n} {direction} copies ({memory}) exposed for {fmt_ns(exposed)} ({share:.1%} of the span), "
                f"{where}",
                {"impact_ns": int(exposed), "copies": n, "copy_ns": int(d), "share_of_span": round(share, 4),
                 "compute_stream": bool(on_compute), "streams": streams, "ranks": ranks,
                 "cause": "exposed on compute stream" if on_compute else "exposed", "suggestion": tip}, loc))
        return out
