"""memory -- where allocator memory goes: footprint over time, the peak and what was
live at it, blocks never freed, and step-over-step growth (leaks).

Input: caching-allocator block events (kind ``tensor``, PyTorch's ``[memory]``
instants: ``bytes`` < 0 on free), framework ops (to name who allocated a block),
ranges (to find training steps) and raw driver allocations (``alloc``/``free``).

Replay, per (rank, device, device_type): events in time order, ``replayed(t) =
cumsum(bytes)``.  Traces usually start mid-run, so the replay starts at 0 while the
allocator already held ``offset = total_allocated[0] - bytes[0]``; absolute levels
are ``offset + replayed`` and are checked against the allocator's own column.

Lifetimes: an alloc at address A is freed by the next event at A if that is a free
(sort by (address, position) and match neighbours).  A free with no alloc before it
is a pre-trace block: live from the trace start until that free.

Uses and patterns (_memory_patterns): each block's first and last use and number of uses,
from op input pointers (``op.input_ptrs``) or instrumented kernel accesses
(``access_summary``); from them DrGPUM's unused / early-allocation / late-deallocation
patterns, per allocation site.  Without use data the tool says ``use_data: none``.

Modules: ``replay`` (the replay, lifetimes and per-device peak), ``step_windows`` (steps,
growth, leaks), ``findings`` (findings, summary, bytes per category at the peak), ``common``
(constants and column helpers); block categories and use patterns are in ``tools/_memory_*``.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pastaprof.processor.intervals import innermost_enclosing
from pastaprof.tools._by_rank import rank_rows
from pastaprof.tools._codes import dense_codes
from pastaprof.tools._memory_categories import CATEGORIES, classify, optimizer_ranges
from pastaprof.tools._memory_patterns import block_uses, device_label, find_patterns
from pastaprof.tools.base import Finding, Report, Tool
from pastaprof.tools.memory.common import NEVER, SITE, group, i64, take
from pastaprof.tools.memory.common import as_str as _str  # noqa: F401  (uvm_advisor reads columns with these)
from pastaprof.tools.memory.common import i64 as _i64  # noqa: F401
from pastaprof.tools.memory.findings import device_findings, oom_findings, peak_by_category, summarize
from pastaprof.tools.memory.replay import Replay, device_rows
from pastaprof.tools.memory.step_windows import (  # noqa: F401  (the steps and ranks tools find steps alike)
    LEAK_MIN_BYTES_PER_STEP,
    OPTIMIZER_STEP,
    PASTAPROF_STEP_RE,
    PROFILER_STEP_RE,
    USER_STEP_RE,
    step_growth,
    step_windows,
)

DISPLAY = {  # what the terminal shows; JSON and programs get every table and column
    "devices": ["rank", "device", "device_type", "peak_bytes", "peak_ns", "live_at_peak_bytes", "pretrace_offset_bytes",
                "max_reserved_bytes", "never_freed_bytes", "end_bytes"],
    "live_at_peak_by_site": [],
    "peak_by_category": ["rank", "device", "device_type", "category", "bytes", "blocks"],
    "never_freed": [],
    "steps": ["rank", "device", "device_type", "step", "allocated_at_end", "growth_bytes", "peak_bytes",
              "survivor_bytes"],
    "memory_patterns": ["rank", "device", "device_type", "pattern", "op", "site", "blocks", "bytes", "max_idle_ns",
                        "peak_bytes_saved"],
}
MAX_POINTS = 500            # footprint curve: points per device (max kept per time bucket)
TOP_LIVE = 20               # largest live-at-peak blocks listed per device


class Memory(Tool):
    name = "memory"
    description = "Allocator footprint over time, peak and what was live at it, never-freed blocks, per-step growth, unused / early / late blocks"
    consumes = ("tensor", "alloc", "free", "op", "range", "access_summary", "kernel")
    optional = ("access_summary",)  # uses by kernels when instruction-level capture ran for another tool
    KERNEL_COLUMNS = ("start_ns", "end_ns", "rank", "device", "pid", "correlation")

    def on_batch(self, kind: str, batch: pa.RecordBatch) -> None:
        # kernels only time and place instrumented launches (access_summary): keep those columns
        super().on_batch(kind, batch.select(list(self.KERNEL_COLUMNS)) if kind == "kernel" else batch)

    def report(self) -> Report:
        ev = self.table("tensor")
        ev = ev.filter(pc.fill_null(pc.not_equal(ev["bytes"], 0), False))
        findings: list[Finding] = []
        tables: dict[str, pa.Table] = {"driver": self._driver()}
        if ev.num_rows == 0:  # say why, not a line of zeros and dashes
            return Report(self.name, tables=tables, summary={
                "devices": 0, "alloc_events": 0,
                "note": "no allocator events in this run (record with profile_memory=True)"})
        r = Replay(ev)
        blocks, op_idx = self._blocks(r)
        ops = self.table("op")
        blocks, use_complete, use_info = block_uses(blocks, op_idx, r.pid[r.rows], ops,
                                                    self.table("access_summary"), self.table("kernel"),
                                                    self.info.manifest)
        bkey = r.key[r.rows]                              # sorted: rows are in (key, time) order
        bseg = np.searchsorted(bkey, np.arange(len(r.seg) + 1))
        # ---- per device: peak, what was live at it, never freed
        caps = {int(d.get("id", -1)): d.get("totalGlobalMem") for d in self.info.devices if isinstance(d, dict)}
        dev_rows, curve, live_idx, by_site_idx = device_rows(
            r, bseg, caps, int(self.options.get("max_points", MAX_POINTS)), int(self.options.get("top_live", TOP_LIVE)))
        tables["devices"] = pa.Table.from_pylist(dev_rows)  # one row per (rank, device, device_type)
        tables["footprint"] = _footprint(r, np.concatenate(curve))
        tables["live_at_peak"] = blocks.take(pa.array(np.concatenate(live_idx), pa.int64()))
        by_site = blocks.take(pa.array(np.concatenate(by_site_idx), pa.int64()))
        tables["live_at_peak_by_site"] = group(by_site, SITE + ["pretrace"], ["bytes"])
        tables["peak_by_category"] = peak_by_category(by_site, dev_rows)
        details = {"lifetimes": blocks}  # one row per block: for programs, not the terminal
        at_peak = np.zeros(len(r.rows), bool)
        at_peak[np.concatenate(by_site_idx)] = True
        patterns, pat_findings, pat_summary = find_patterns(blocks, use_complete, at_peak, bkey, dev_rows,
                                                            self._rank_spans(r.rank, r.t), self.options)
        tables["memory_patterns"] = patterns
        never_tab = blocks.filter(pc.and_(pc.invert(blocks["pretrace"]), pc.is_null(blocks["free_ns"])))
        tables["never_freed"] = group(never_tab, SITE, ["bytes"], [("alloc_ns", "min"), ("alloc_ns", "max")],
                                      {"alloc_ns_min": "first_alloc_ns", "alloc_ns_max": "last_alloc_ns"})
        # ---- steps and growth
        min_growth = int(self.options.get("leak_min_bytes", LEAK_MIN_BYTES_PER_STEP))
        step_rows, surv_tabs, leaks = step_growth(r, blocks, bseg, self.table("range"), ops, min_growth)
        tables["steps"] = pa.Table.from_pylist(step_rows) if step_rows else pa.table({"step": pa.array([], pa.string())})
        tables["step_survivors"] = pa.concat_tables(surv_tabs) if surv_tabs else pa.table({"op_name": pa.array([], pa.string())})
        findings += device_findings(dev_rows, tables["never_freed"], leaks)
        findings += oom_findings(self.table("range"), blocks)
        summary = summarize(dev_rows, leaks, step_rows)
        summary.update(use_info)
        if use_info["use_data"] != "none":  # never a pattern from missing data
            findings += pat_findings
            summary.update(pat_summary)
        pc_tab = tables["peak_by_category"]
        main = pc_tab.filter(pc.equal(pc_tab["device_type"], summary["peak_device"].split(":")[0]))
        summary["peak_by_category"] = {
            x["category"]: x["bytes"] for x in main.to_pylist()
            if device_label(x["device_type"], x["device"]) == summary["peak_device"] and x["rank"] == summary["peak_rank"]}
        return Report(self.name, tables=tables, findings=findings, summary=summary, display=DISPLAY, details=details)

    def _blocks(self, r: Replay) -> tuple[pa.Table, np.ndarray]:
        """One row per block: place, address, size, alloc and free times, the allocating and
        freeing ops, the category; and each block's allocating op (row of the op table, or -1)."""
        rows, r_alloc, fpos, fidx, freed, n = r.rows, r.r_alloc, r.fpos, r.fidx, r.freed, r.n
        rank, pid, tid, t = r.rank, r.pid, r.tid, r.t
        # the op around each alloc and each free: one search, so the ops are indexed once
        found = self._allocating_op(np.r_[rank[rows], rank[fidx]], np.r_[pid[rows], pid[fidx]],
                                    np.r_[tid[rows], tid[fidx]], np.r_[t[rows], t[fidx]])
        op_idx = found[:len(rows)]
        op_idx[~r_alloc] = -1
        free_idx = np.full(len(rows), -1)
        free_idx[freed] = found[len(rows):]
        ops = self.table("op")
        op_cols = {c: take(ops[src], op_idx, typ) if ops.num_rows else pa.nulls(len(rows), typ)
                   for c, src, typ in (("op_id", "id", pa.int64()), ("op_name", "name", pa.string()),
                                       ("module", "module", pa.string()), ("call_site", "call_site", pa.string()))}
        blocks = pa.table({
            "rank": pa.array(rank[rows], pa.int32()), "device": pa.array(r.dev[rows], pa.int32()),
            "device_type": pa.array(r.dtype[rows], pa.string()),
            "address": pa.array(r.addr[rows], pa.uint64()), "bytes": pa.array(np.abs(r.nbytes[rows])),
            "alloc_ns": pa.array(t[rows], pa.int64(), mask=~r_alloc),
            "free_ns": pa.array(t[np.clip(fpos, 0, n - 1)], pa.int64(), mask=fpos == NEVER),
            "pretrace": pa.array(~r_alloc), **op_cols,
        })
        return self._with_free_and_category(blocks, rows, fpos, op_idx, free_idx, rank, t), op_idx


    def _with_free_and_category(self, blocks, rows, fpos, op_idx, free_idx, rank, t) -> pa.Table:
        """Add the freeing op and call site, and the inferred category (_memory_categories)."""
        n = len(t)
        ops = self.table("op")
        freed = fpos != NEVER
        fidx = np.clip(fpos, 0, n - 1)
        if ops.num_rows:
            bwd = pc.fill_null(ops["is_backward"], False).to_numpy(zero_copy_only=False).astype(bool)
            alloc_bwd = np.where(op_idx >= 0, bwd[np.clip(op_idx, 0, None)], False)
            free_bwd = np.where(free_idx >= 0, bwd[np.clip(free_idx, 0, None)], False)
            blocks = blocks.append_column("free_op_name", take(ops["name"], free_idx, pa.string()))
            blocks = blocks.append_column("free_call_site", take(ops["call_site"], free_idx, pa.string()))
        else:
            alloc_bwd = free_bwd = np.zeros(len(rows), bool)
            blocks = blocks.append_column("free_op_name", pa.nulls(len(rows), pa.string()))
            blocks = blocks.append_column("free_call_site", pa.nulls(len(rows), pa.string()))
        alloc_ns = i64(blocks["alloc_ns"], -1)
        free_ns = np.where(freed, t[fidx], NEVER)
        pretrace = blocks["pretrace"].to_numpy(zero_copy_only=False).astype(bool)
        cat = np.full(len(rows), CATEGORIES.index("unknown"), np.int8)
        brank = rank[rows]
        hi_all = int(t.max()) + 1
        of_block, of_event = rank_rows(brank), rank_rows(rank)
        for r in of_block.ranks():
            mine = of_block[r]
            starts, ends, _, _ = step_windows(self.table("range"), ops, int(r), int(t[of_event[r]].min()), hi_all)
            o_s, o_e = optimizer_ranges(self.table("range"), ops, int(r))
            cat[mine] = classify(alloc_ns[mine], free_ns[mine], alloc_bwd[mine], free_bwd[mine], pretrace[mine],
                                 starts, ends, o_s, o_e, hi_all)
        labels = pa.array(CATEGORIES, pa.string())
        return blocks.append_column("category", labels.take(pa.array(cat.astype(np.int32))))

    # ------------------------------------------------------------------ helpers
    def _rank_spans(self, rank: np.ndarray, t: np.ndarray) -> dict[int, tuple[int, int]]:
        """Per rank: first and last time of its allocator events, ops and kernels."""
        parts = [(rank, t, t)] + [(i64(x["rank"], 0), i64(x["start_ns"]), i64(x["end_ns"]))
                                  for x in (self.table("op"), self.table("kernel")) if x.num_rows]
        if all(len(p[0]) and p[0].min() == p[0].max() == rank[0] for p in parts):  # one rank: no sort
            return {int(rank[0]): (min(int(p[1].min()) for p in parts), max(int(p[2].max()) for p in parts))}
        r, lo, hi = (np.concatenate([p[i] for p in parts]) for i in range(3))
        of = rank_rows(r)
        return {int(k): (int(lo[of[k]].min()), int(hi[of[k]].max())) for k in np.unique(rank).tolist()}

    def _allocating_op(self, rank, pid, tid, time) -> np.ndarray:
        """Index (into the op table) of the innermost op on the same thread around each time, or -1."""
        ops = self.table("op")
        if ops.num_rows == 0 or len(time) == 0:
            return np.full(len(time), -1)
        no = ops.num_rows
        g = dense_codes(np.r_[i64(ops["rank"], 0), rank], np.r_[i64(ops["pid"]), pid], np.r_[i64(ops["tid"]), tid])
        return innermost_enclosing(g[:no], i64(ops["start_ns"]), i64(ops["end_ns"]), g[no:], time)

    def _driver(self) -> pa.Table:
        """The ``driver`` table: raw driver allocations and frees (kinds ``alloc`` / ``free``) per
        (rank, device, memory kind)."""
        parts = []
        for kind in ("alloc", "free"):
            x = self.table(kind)
            parts.append(pa.table({"kind": pa.array([kind] * x.num_rows, pa.string()), "rank": x["rank"],
                                   "device": x["device"], "memory_kind": x["memory_kind"].cast(pa.string()),
                                   "bytes": x["bytes"]}))
        allx = pa.concat_tables(parts)
        return group(allx, ["kind", "rank", "device", "memory_kind"], ["bytes"], count="events")


def _footprint(r: Replay, keep: np.ndarray) -> pa.Table:
    """The ``footprint`` table: the allocated level at the curve's kept event positions."""
    return pa.table({
        "rank": pa.array(r.rank[keep], pa.int32()), "device": pa.array(r.dev[keep], pa.int32()),
        "device_type": pa.array(r.dtype[keep], pa.string()), "time_ns": r.t[keep],
        "allocated_bytes": r.level[keep], "replayed_bytes": r.cs[keep],
        "total_allocated": r.ev["total_allocated"].take(pa.array(keep)),
        "total_reserved": r.ev["total_reserved"].take(pa.array(keep)),
    })
