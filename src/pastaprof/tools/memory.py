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
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pastaprof.processor.intervals import innermost_enclosing
from pastaprof.tools._by_rank import rank_rows, rows_of_rank
from pastaprof.tools._codes import dense_codes
from pastaprof.tools._memory_categories import CATEGORIES, classify, optimizer_ranges
from pastaprof.tools._memory_patterns import block_uses, device_label, find_patterns
from pastaprof.tools._ranges import host_ranges
from pastaprof.tools.base import Finding, Report, Tool

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
MIN_STEPS = 3               # growth needs >= 2 step-to-step deltas
LEAK_MIN_BYTES_PER_STEP = 1 << 20
WARN_BYTES = 16 << 20       # never-freed severity thresholds
CRITICAL_BYTES = 1 << 30
CAPACITY_SHARE = 0.9        # reserved peak this close to device memory is a warning
FRAG_MIN_BYTES = 256 << 20  # reserved-but-unallocated at the peak worth a finding ...
FRAG_SHARE = 0.2            # ... when it is also this share of what is reserved
PROFILER_STEP_RE = r"^ProfilerStep#\d+$"
USER_STEP_RE = r"^(train_?|iter(ation)?_?)?step[\s#_-]*\d+$"
#: The ranges a live run records for ``pastaprof.step()`` calls (handlers/session.py).
PASTAPROF_STEP_RE = r"^pastaprof\.step#\d+$"
OPTIMIZER_STEP = "Optimizer.step#"
GPU_TYPES = ("cuda", "hip")
NEVER = np.iinfo(np.int64).max
SITE = ["rank", "device", "device_type", "op_name", "call_site", "module"]


def _i64(col, fill: int = -1) -> np.ndarray:
    return np.asarray(pc.fill_null(col, fill).to_numpy(zero_copy_only=False), dtype=np.int64)


def _str(col) -> np.ndarray:
    return np.asarray(pc.fill_null(col.cast(pa.string()), "").to_numpy(zero_copy_only=False), dtype=object)


def _str_codes(col) -> np.ndarray:
    """``np.unique(_str(col), return_inverse=True)[1]`` from a hash encoding: only the distinct
    strings are sorted (a sort of a Python object per row was most of the time on 0.5 M events)."""
    enc = pc.dictionary_encode(pc.fill_null(col.cast(pa.string()), "")).combine_chunks()
    distinct = enc.dictionary.to_pylist()
    rank = np.empty(len(distinct), np.int64)
    rank[sorted(range(len(distinct)), key=distinct.__getitem__)] = np.arange(len(distinct))
    return rank[np.asarray(enc.indices.to_numpy(zero_copy_only=False), dtype=np.int64)]


def _matches(col: pa.ChunkedArray, pattern: str) -> pa.ChunkedArray:
    """``pc.match_substring_regex(col, pattern, ignore_case=True)`` on a (dictionary) name
    column: the regex runs on each chunk's distinct names, not on a string per row."""
    out = []
    for ch in col.chunks:
        if pa.types.is_dictionary(ch.type):
            hit = pc.match_substring_regex(ch.dictionary.cast(pa.string()), pattern, ignore_case=True)
            out.append(hit.take(ch.indices))
        else:
            out.append(pc.match_substring_regex(ch.cast(pa.string()), pattern, ignore_case=True))
    return pa.chunked_array(out, pa.bool_())


def _take(values: pa.Array | pa.ChunkedArray, idx: np.ndarray, typ: pa.DataType | None = None) -> pa.Array:
    """``values[idx]`` (null where idx < 0) as one array of ``typ``: taken before the cast, so a
    dictionary-encoded op column casts the picked rows only, not a string per op."""
    out = values.take(pa.array(idx, pa.int64(), mask=idx < 0))
    out = out.cast(typ) if typ is not None else out
    return out.combine_chunks() if isinstance(out, pa.ChunkedArray) else out


def _fmt(b: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(b) >= size:
            return f"{b / size:.1f} {unit}"
    return f"{int(b)} B"


def _downsample(t: np.ndarray, v: np.ndarray, max_points: int) -> np.ndarray:
    """Indices of <= max_points rows: the max of ``v`` per time bucket, plus the last row."""
    n = len(t)
    if n <= max_points:
        return np.arange(n)
    nb = max(max_points - 1, 1)
    bucket = (t - t[0]) * nb // (t[-1] - t[0] + 1)
    o = np.lexsort((-v, bucket))
    _, first = np.unique(bucket[o], return_index=True)
    return np.union1d(o[first], [n - 1])


def _group(t: pa.Table, keys: list[str], sums: list[str], extra: list | None = None,
           names: dict[str, str] | None = None, count: str = "blocks") -> pa.Table:
    """Group ``t`` by ``keys``: sums (same names), a row count and extra aggregations; largest first."""
    aggs = [(c, "sum") for c in sums] + [(keys[0], "count")] + (extra or [])
    g = t.group_by(keys, use_threads=False).aggregate(aggs)
    ren = {f"{c}_sum": c for c in sums} | {f"{keys[0]}_count": count} | (names or {})
    g = g.rename_columns([ren.get(c, c) for c in g.column_names])
    return g.sort_by([(sums[0], "descending")] + [(k, "ascending") for k in keys])


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
        if ev.num_rows == 0:
            return Report(self.name, tables=tables, summary=self._summary([], [], []))
        # ---- replay, per device key, in time order (original order breaks ties)
        dtype_all = _str(ev["device_type"])
        dcode = _str_codes(ev["device_type"])
        rank0, dev0 = _i64(ev["rank"], 0), _i64(ev["device"])
        key0 = dense_codes(rank0, dev0, dcode)
        order = np.lexsort((np.arange(ev.num_rows), _i64(ev["start_ns"]), key0))
        # only the columns read below travel through the reordering take
        ev = ev.select(["start_ns", "bytes", "address", "total_allocated", "total_reserved", "pid", "tid"]).take(
            pa.array(order))
        n = ev.num_rows
        key, rank, dev, dtype = key0[order], rank0[order], dev0[order], dtype_all[order]
        t = _i64(ev["start_ns"])
        nbytes = _i64(ev["bytes"], 0)
        addr = np.asarray(pc.fill_null(ev["address"], 0).to_numpy(zero_copy_only=False), dtype=np.uint64)
        ta_ok = pc.is_valid(ev["total_allocated"]).to_numpy(zero_copy_only=False)
        ta, tr = _i64(ev["total_allocated"], 0), _i64(ev["total_reserved"], 0)
        seg = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
        seg_end = np.r_[seg[1:], n]
        seg_len = seg_end - seg
        csg = np.cumsum(nbytes)
        cs = csg - np.repeat(csg[seg] - nbytes[seg], seg_len)
        offset = np.where(ta_ok[seg], ta[seg] - nbytes[seg], 0)
        level = cs + np.repeat(offset, seg_len)
        mismatched = np.add.reduceat((ta_ok & (ta != level)).astype(np.int64), seg)
        # ---- lifetimes: pair each alloc with the next event at its address if that is a free
        pos = np.arange(n)
        o2 = np.lexsort((pos, addr, key))
        a, b = o2[:-1], o2[1:]
        m = (key[a] == key[b]) & (addr[a] == addr[b]) & (nbytes[a] > 0) & (nbytes[b] < 0)
        free_of = np.full(n, -1)
        free_of[a[m]] = b[m]
        paired_free = np.zeros(n, bool)
        paired_free[b[m]] = True
        is_alloc, is_free = nbytes > 0, nbytes < 0
        pre = is_free & ~paired_free                  # frees of blocks allocated before the trace
        rows = np.flatnonzero(is_alloc | pre)        # one row per block
        r_alloc = is_alloc[rows]
        fpos = np.where(r_alloc, free_of[rows], rows)
        fpos = np.where(fpos < 0, NEVER, fpos)
        apos = np.where(r_alloc, rows, -1)
        pid, tid = _i64(ev["pid"]), _i64(ev["tid"])
        freed = fpos != NEVER
        fidx = np.clip(fpos, 0, n - 1)[freed]
        # the op around each alloc and each free: one search, so the ops are indexed once
        found = self._allocating_op(np.r_[rank[rows], rank[fidx]], np.r_[pid[rows], pid[fidx]],
                                    np.r_[tid[rows], tid[fidx]], np.r_[t[rows], t[fidx]])
        op_idx = found[:len(rows)]
        op_idx[~r_alloc] = -1
        free_idx = np.full(len(rows), -1)
        free_idx[freed] = found[len(rows):]
        ops = self.table("op")
        op_cols = {c: _take(ops[src], op_idx, typ) if ops.num_rows else pa.nulls(len(rows), typ)
                   for c, src, typ in (("op_id", "id", pa.int64()), ("op_name", "name", pa.string()),
                                       ("module", "module", pa.string()), ("call_site", "call_site", pa.string()))}
        blocks = pa.table({
            "rank": pa.array(rank[rows], pa.int32()), "device": pa.array(dev[rows], pa.int32()),
            "device_type": pa.array(dtype[rows], pa.string()),
            "address": pa.array(addr[rows], pa.uint64()), "bytes": pa.array(np.abs(nbytes[rows])),
            "alloc_ns": pa.array(t[rows], pa.int64(), mask=~r_alloc),
            "free_ns": pa.array(t[np.clip(fpos, 0, n - 1)], pa.int64(), mask=fpos == NEVER),
            "pretrace": pa.array(~r_alloc), **op_cols,
        })
        blocks = self._with_free_and_category(blocks, rows, fpos, op_idx, free_idx, rank, t)
        blocks, use_complete, use_info = block_uses(blocks, op_idx, pid[rows], ops,
                                                    self.table("access_summary"), self.table("kernel"),
                                                    self.info.manifest)
        bkey = key[rows]                              # sorted: rows are in (key, time) order
        bseg = np.searchsorted(bkey, np.arange(len(seg) + 1))
        # ---- per device: peak, what was live at it, never freed
        max_points = int(self.options.get("max_points", MAX_POINTS))
        top_live = int(self.options.get("top_live", TOP_LIVE))
        dev_rows, curve, live_idx, by_site_idx = [], [], [], []
        caps = {int(d.get("id", -1)): d.get("totalGlobalMem") for d in self.info.devices if isinstance(d, dict)}
        for k, (s, e) in enumerate(zip(seg, seg_end, strict=True)):
            p = s + int(np.argmax(cs[s:e]))           # first time the replay reaches its maximum
            bs, be = bseg[k], bseg[k + 1]
            live = bs + np.flatnonzero((apos[bs:be] <= p) & (p < fpos[bs:be]))
            traced_live = live[r_alloc[live]]
            by_site_idx.append(live)
            live_idx.append(live[np.argsort(-np.abs(nbytes[rows[live]]), kind="stable")[:top_live]])
            never = bs + np.flatnonzero(r_alloc[bs:be] & (fpos[bs:be] == NEVER))
            pre_freed = int(-nbytes[rows[bs:be][~r_alloc[bs:be]]].sum())
            curve.append(s + _downsample(t[s:e], cs[s:e], max_points))
            ta_max = int(ta[s:e][ta_ok[s:e]].max()) if ta_ok[s:e].any() else None
            row = {
                "rank": int(rank[s]), "device": int(dev[s]), "device_type": str(dtype[s]),
                "alloc_events": int(is_alloc[s:e].sum()), "free_events": int(is_free[s:e].sum()),
                "first_ns": int(t[s]), "last_ns": int(t[e - 1]),
                "pretrace_offset_bytes": int(offset[k]), "peak_bytes": int(level[p]), "peak_ns": int(t[p]),
                "peak_replayed_bytes": int(cs[p]), "max_total_allocated": ta_max,
                "replay_consistent": ta_max is None or ta_max == int(level[p]), "mismatched_events": int(mismatched[k]),
                "reserved_at_peak": int(tr[p]), "max_reserved_bytes": int(tr[s:e].max()),
                "live_at_peak_blocks": len(traced_live), "live_at_peak_bytes": int(nbytes[rows[traced_live]].sum()),
                "pretrace_at_peak_bytes": int(level[p] - nbytes[rows[traced_live]].sum()),
                "pretrace_freed_bytes": pre_freed, "pretrace_unfreed_bytes": int(offset[k]) - pre_freed,
                "never_freed_blocks": len(never), "never_freed_bytes": int(nbytes[rows[never]].sum()),
                "end_bytes": int(level[e - 1]),
            }
            cap = caps.get(row["device"]) if row["device_type"] in GPU_TYPES else None
            row["device_memory_bytes"] = int(cap) if isinstance(cap, (int, float)) else None
            dev_rows.append(row)
        devices = pa.Table.from_pylist(dev_rows)
        keep = np.concatenate(curve)
        tables["devices"] = devices  # one row per (rank, device, device_type)
        tables["footprint"] = pa.table({
            "rank": pa.array(rank[keep], pa.int32()), "device": pa.array(dev[keep], pa.int32()),
            "device_type": pa.array(dtype[keep], pa.string()), "time_ns": t[keep],
            "allocated_bytes": level[keep], "replayed_bytes": cs[keep],
            "total_allocated": ev["total_allocated"].take(pa.array(keep)),
            "total_reserved": ev["total_reserved"].take(pa.array(keep)),
        })
        live_tab = blocks.take(pa.array(np.concatenate(live_idx), pa.int64()))
        tables["live_at_peak"] = live_tab
        by_site = blocks.take(pa.array(np.concatenate(by_site_idx), pa.int64()))
        tables["live_at_peak_by_site"] = _group(by_site, SITE + ["pretrace"], ["bytes"])
        tables["peak_by_category"] = self._peak_by_category(by_site, dev_rows)
        details = {"lifetimes": blocks}  # one row per block: for programs, not the terminal
        at_peak = np.zeros(len(rows), bool)
        at_peak[np.concatenate(by_site_idx)] = True
        patterns, pat_findings, pat_summary = find_patterns(blocks, use_complete, at_peak, bkey, dev_rows,
                                                            self._rank_spans(rank, t), self.options)
        tables["memory_patterns"] = patterns
        never_tab = blocks.filter(pc.and_(pc.invert(blocks["pretrace"]), pc.is_null(blocks["free_ns"])))
        tables["never_freed"] = _group(never_tab, SITE, ["bytes"], [("alloc_ns", "min"), ("alloc_ns", "max")],
                                         {"alloc_ns_min": "first_alloc_ns", "alloc_ns_max": "last_alloc_ns"})
        # ---- steps and growth
        step_rows, surv_tabs, leaks = self._steps(rank, dev, dtype, seg, seg_end, t, level, offset, blocks, bseg, fpos)
        tables["steps"] = pa.Table.from_pylist(step_rows) if step_rows else pa.table({"step": pa.array([], pa.string())})
        tables["step_survivors"] = pa.concat_tables(surv_tabs) if surv_tabs else pa.table({"op_name": pa.array([], pa.string())})
        findings += self._findings(dev_rows, tables["never_freed"], leaks)
        findings += self._ooms(blocks)
        summary = self._summary(dev_rows, leaks, step_rows)
        summary.update(use_info)
        if use_info["use_data"] != "none":  # never a pattern from missing data
            findings += pat_findings
            summary.update(pat_summary)
        pc_tab = tables["peak_by_category"]
        main = pc_tab.filter(pc.equal(pc_tab["device_type"], summary["peak_device"].split(":")[0]))
        summary["peak_by_category"] = {
            r["category"]: r["bytes"] for r in main.to_pylist()
            if device_label(r['device_type'], r['device']) == summary["peak_device"] and r["rank"] == summary["peak_rank"]}
        return Report(self.name, tables=tables, findings=findings, summary=summary, display=DISPLAY, details=details)

    @staticmethod
    def _peak_by_category(live: pa.Table, dev_rows: list[dict]) -> pa.Table:
        """Bytes live at each device's peak per category; memory the allocator held from before
        the trace and never freed in it (no block of its own) is added to ``before_trace``, so
        each device's rows sum to its peak."""
        keys = ["rank", "device", "device_type", "category"]
        rows = {tuple(r[k] for k in keys): r for r in _group(live, keys, ["bytes"]).to_pylist()}
        seen: dict[tuple, list[int]] = {}
        for k, r in rows.items():  # each device's categories, in one pass (not a scan of all rows per device)
            seen.setdefault(k[:3], []).append(r["bytes"])
        for d in dev_rows:
            dk = (d["rank"], d["device"], d["device_type"])
            unseen = d["peak_bytes"] - sum(seen.get(dk, []))
            if unseen:
                r = rows.setdefault((*dk, "before_trace"), dict(zip(keys, (*dk, "before_trace"))) | {"bytes": 0, "blocks": 0})
                r["bytes"] += unseen
        out = sorted(rows.values(), key=lambda r: (r["rank"], r["device_type"] != "cuda", r["device"], -r["bytes"]))
        return pa.Table.from_pylist(out) if out else pa.table({"category": pa.array([], pa.string())})

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
            blocks = blocks.append_column("free_op_name", _take(ops["name"], free_idx, pa.string()))
            blocks = blocks.append_column("free_call_site", _take(ops["call_site"], free_idx, pa.string()))
        else:
            alloc_bwd = free_bwd = np.zeros(len(rows), bool)
            blocks = blocks.append_column("free_op_name", pa.nulls(len(rows), pa.string()))
            blocks = blocks.append_column("free_call_site", pa.nulls(len(rows), pa.string()))
        alloc_ns = _i64(blocks["alloc_ns"], -1)
        free_ns = np.where(freed, t[fidx], NEVER)
        pretrace = blocks["pretrace"].to_numpy(zero_copy_only=False).astype(bool)
        cat = np.full(len(rows), CATEGORIES.index("unknown"), np.int8)
        brank = rank[rows]
        hi_all = int(t.max()) + 1
        of_block, of_event = rank_rows(brank), rank_rows(rank)
        for r in of_block.ranks():
            mine = of_block[r]
            starts, ends, _, _ = self._step_windows(int(r), int(t[of_event[r]].min()), hi_all)
            o_s, o_e = optimizer_ranges(self.table("range"), ops, int(r))
            cat[mine] = classify(alloc_ns[mine], free_ns[mine], alloc_bwd[mine], free_bwd[mine], pretrace[mine],
                                 starts, ends, o_s, o_e, hi_all)
        labels = pa.array(CATEGORIES, pa.string())
        return blocks.append_column("category", labels.take(pa.array(cat.astype(np.int32))))

    # ------------------------------------------------------------------ helpers
    def _rank_spans(self, rank: np.ndarray, t: np.ndarray) -> dict[int, tuple[int, int]]:
        """Per rank: first and last time of its allocator events, ops and kernels."""
        parts = [(rank, t, t)] + [(_i64(x["rank"], 0), _i64(x["start_ns"]), _i64(x["end_ns"]))
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
        g = dense_codes(np.r_[_i64(ops["rank"], 0), rank], np.r_[_i64(ops["pid"]), pid], np.r_[_i64(ops["tid"]), tid])
        return innermost_enclosing(g[:no], _i64(ops["start_ns"]), _i64(ops["end_ns"]), g[no:], time)

    def _step_windows(self, r: int, t_lo: int, t_hi: int) -> tuple[np.ndarray, np.ndarray, list[str], str]:
        """Step windows of rank ``r``: ProfilerStep#N, user ``stepN`` ranges, optimizer steps,
        else exact repetition of the top-level op sequence on the busiest thread."""
        rng, ops = self.table("range"), self.table("op")
        rng = host_ranges(rows_of_rank(rng, r))
        ops = rows_of_rank(ops, r)
        named = pa.schema([("name", pa.string()), ("start_ns", pa.int64()), ("end_ns", pa.int64())])
        for pattern, source in ((PROFILER_STEP_RE, "ProfilerStep"), (PASTAPROF_STEP_RE, "pastaprof.step()"),
                                (USER_STEP_RE, "step ranges")):
            hit = pa.concat_tables([x.filter(_matches(x["name"], pattern)).select(["name", "start_ns", "end_ns"])
                                    .cast(named) for x in (rng, ops)])
            if hit.num_rows:
                g = hit.group_by("name").aggregate([("start_ns", "min"), ("end_ns", "max")]).sort_by("start_ns_min")
                return _i64(g["start_ns_min"]), _i64(g["end_ns_max"]), g["name"].to_pylist(), source
        opt = rng.filter(pc.starts_with(rng["name"].cast(pa.string()), OPTIMIZER_STEP))
        if opt.num_rows:
            ends = np.sort(_i64(opt["end_ns"]))
            return np.r_[t_lo, ends[:-1]], ends, [f"step {i}" for i in range(len(ends))], "optimizer steps"
        top = ops.filter(pc.fill_null(pc.equal(ops["depth"], 0), True))
        if top.num_rows >= MIN_STEPS:
            th = dense_codes(_i64(top["pid"]), _i64(top["tid"]))
            top = top.filter(pa.array(th == np.bincount(th).argmax())).sort_by("start_ns")
            c = np.unique(_str(top["name"]), return_inverse=True)[1]
            nt = len(c)
            periods = np.arange(1, nt // MIN_STEPS + 1)
            for p in periods[nt % periods == 0]:        # the sequence must be whole repetitions of a block
                if np.array_equal(c[p:], c[:-p]):
                    starts = _i64(top["start_ns"])[::p]
                    return starts, np.r_[starts[1:], t_hi], [f"iteration {i}" for i in range(len(starts))], "repeated ops"
        return np.array([], np.int64), np.array([], np.int64), [], "none"

    def _steps(self, rank, dev, dtype, seg, seg_end, t, level, offset, blocks, bseg, fpos):
        """Per device and step: level at step start/end, growth, survivors; leak records."""
        step_rows, surv_tabs, leaks = [], [], []
        min_growth = int(self.options.get("leak_min_bytes", LEAK_MIN_BYTES_PER_STEP))
        ops, rng = self.table("op"), self.table("range")
        windows: dict[int, tuple] = {}
        alloc_ns = _i64(blocks["alloc_ns"], -1)
        bbytes = _i64(blocks["bytes"], 0)
        of_event = rank_rows(rank)
        for k, (s, e) in enumerate(zip(seg, seg_end, strict=True)):
            r = int(rank[s])
            if r not in windows:
                mine = of_event[r]
                hi = max([int(t[mine].max())] + [int(_i64(rows_of_rank(x, r)["end_ns"]).max(initial=0))
                                                 for x in (ops, rng)])
                windows[r] = self._step_windows(r, int(t[mine].min()), hi + 1)
            starts, ends, labels, source = windows[r]
            if len(starts) == 0:
                continue
            tk, lk = t[s:e], level[s:e]
            i_start = np.searchsorted(tk, starts, "left") - 1   # last event before the step starts
            i_end = np.searchsorted(tk, ends, "left") - 1       # last event before it ends
            at_start = np.where(i_start >= 0, lk[np.clip(i_start, 0, None)], offset[k])
            at_end = np.where(i_end >= 0, lk[np.clip(i_end, 0, None)], offset[k])
            bs, be = bseg[k], bseg[k + 1]
            a_k, f_k, b_k = alloc_ns[bs:be], fpos[bs:be], bbytes[bs:be]
            for j in range(len(starts)):
                lo, hi = i_start[j] + 1, i_end[j] + 1
                surv = (a_k >= starts[j]) & (a_k < ends[j]) & (f_k >= s + hi)   # made in the step, live after it
                step_rows.append({"rank": r, "device": int(dev[s]), "device_type": str(dtype[s]), "step": labels[j],
                                  "source": source, "start_ns": int(starts[j]), "end_ns": int(ends[j]),
                                  "allocated_at_start": int(at_start[j]), "allocated_at_end": int(at_end[j]),
                                  "growth_bytes": int(at_end[j] - at_start[j]),
                                  "peak_bytes": int(lk[lo:hi].max(initial=at_start[j])),
                                  "survivor_blocks": int(surv.sum()), "survivor_bytes": int(b_k[surv].sum())})
            deltas = np.diff(at_end)
            if len(starts) < MIN_STEPS or not (deltas > 0).all() or np.median(deltas) < min_growth:
                continue
            # What accumulates: blocks made during the steps and still live after the last one.
            made = bs + np.flatnonzero((a_k >= starts[0]) & (a_k < ends[-1]) & (f_k >= s + i_end[-1] + 1))
            sub = blocks.take(pa.array(made, pa.int64()))
            sub = sub.append_column("step", pa.array(np.searchsorted(starts, _i64(sub["alloc_ns"]), "right") - 1))
            g = _group(sub, SITE, ["bytes"], [("step", "count_distinct")], {"step_count_distinct": "steps"})
            surv_tabs.append(g)
            leaks.append({"device": device_label(dtype[s], dev[s]), "rank": r, "steps": len(starts), "source": source,
                          "growth_bytes_per_step": int(np.median(deltas)),
                          "total_growth_bytes": int(at_end[-1] - at_start[0]),
                          "allocated_at_step_end": [int(x) for x in at_end], "sites": g.slice(0, 3).to_pylist()})
        return step_rows, surv_tabs, leaks

    def _driver(self) -> pa.Table:
        parts = []
        for kind in ("alloc", "free"):
            x = self.table(kind)
            parts.append(pa.table({"kind": pa.array([kind] * x.num_rows, pa.string()), "rank": x["rank"],
                                   "device": x["device"], "memory_kind": x["memory_kind"].cast(pa.string()),
                                   "bytes": x["bytes"]}))
        allx = pa.concat_tables(parts)
        return _group(allx, ["kind", "rank", "device", "memory_kind"], ["bytes"], count="events")

    def _ooms(self, blocks: pa.Table) -> list[Finding]:
        """One critical finding per out-of-memory event (a memory snapshot's ``oom`` entries
        arrive as ranges of domain ``oom``): what was allocated then, and the largest site."""
        rng = self.table("range")
        if not rng.num_rows or "domain" not in rng.column_names:
            return []
        out = []
        for r in rng.filter(pc.fill_null(pc.equal(rng["domain"].cast(pa.string()), "oom"), False)).to_pylist():
            t = r["start_ns"]
            live = blocks.filter(pc.and_(pc.and_(pc.equal(blocks["rank"], r["rank"]), pc.equal(blocks["device"], r["device"] or 0)),
                                         pc.and_(pc.fill_null(pc.less_equal(blocks["alloc_ns"], t), True),
                                                 pc.fill_null(pc.greater(blocks["free_ns"], t), True))))
            sites = _group(live, ["op_name", "call_site"], ["bytes"]).slice(0, 1).to_pylist()
            top = sites[0] if sites else {}
            total = int(pc.sum(live["bytes"]).as_py() or 0)
            out.append(Finding("critical", f"{r['name']}; {_fmt(total)} was allocated then, in {live.num_rows} blocks",
                               {"rank": r["rank"], "time_ns": t, "allocated_bytes": total, "blocks": live.num_rows,
                                "top_site_bytes": top.get("bytes")},
                               location=" @ ".join(x for x in (top.get("op_name"), top.get("call_site")) if x) or None))
        return out

    def _findings(self, dev_rows: list[dict], never: pa.Table, leaks: list[dict]) -> list[Finding]:
        out: list[Finding] = []
        keys = zip(*(never[c].to_pylist() for c in ("rank", "device", "device_type")), strict=True)
        first_site: dict[tuple, int] = {}
        for i, key in enumerate(keys):  # never_freed is sorted by bytes: a device's first row is its top site
            first_site.setdefault(key, i)
        for lk in leaks:
            top = lk["sites"][0] if lk["sites"] else {}
            where = " @ ".join(x for x in (top.get("op_name"), top.get("call_site")) if x) or None
            sev = "critical" if lk["total_growth_bytes"] >= CRITICAL_BYTES else "warning"
            out.append(Finding(sev, f"{lk['device']}: memory grows {_fmt(lk['growth_bytes_per_step'])} per step "
                                    f"over {lk['steps']} steps", dict(lk), location=where))
        for d in dev_rows:
            nb = d["never_freed_bytes"]
            name = device_label(d['device_type'], d['device'])
            if nb > 0:
                top = never.slice(first_site[(d["rank"], d["device"], d["device_type"])], 1).to_pylist()[0]
                sev = "critical" if nb >= CRITICAL_BYTES else "warning" if nb >= WARN_BYTES else "info"
                out.append(Finding(sev, f"{name}: {_fmt(nb)} in {d['never_freed_blocks']} blocks allocated during the "
                                        "trace still live at its end",
                                   {"rank": d["rank"], "bytes": nb, "blocks": d["never_freed_blocks"],
                                    "top_site_bytes": top["bytes"], "top_site_blocks": top["blocks"]},
                                   location=" @ ".join(x for x in (top["op_name"], top["call_site"]) if x) or None))
            cap = d["device_memory_bytes"]
            if cap and d["max_reserved_bytes"] >= CAPACITY_SHARE * cap:
                out.append(Finding("warning", f"{name}: allocator reserved {d['max_reserved_bytes'] / cap:.0%} of device memory",
                                   {"max_reserved_bytes": d["max_reserved_bytes"], "device_memory_bytes": cap,
                                    "peak_bytes": d["peak_bytes"]}))
            unalloc = d["reserved_at_peak"] - d["peak_bytes"]
            if d["reserved_at_peak"] > 0 and unalloc >= FRAG_MIN_BYTES and unalloc >= FRAG_SHARE * d["reserved_at_peak"]:
                out.append(Finding("warning", f"{name}: {_fmt(unalloc)} reserved but not allocated at the peak "
                                              f"({unalloc / d['reserved_at_peak']:.0%} of reserved): fragmentation",
                                   {"rank": d["rank"], "reserved_at_peak": d["reserved_at_peak"],
                                    "peak_bytes": d["peak_bytes"], "bytes_saveable": unalloc},
                                   location="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True may return it"))
            if d["mismatched_events"]:
                out.append(Finding("info", f"{name}: {d['mismatched_events']} events disagree with the allocator's total "
                                           "(events missing or out of order)", {"rank": d["rank"]}))
        return out

    @staticmethod
    def _summary(dev_rows: list[dict], leaks: list[dict], step_rows: list[dict]) -> dict:
        gpu = [d for d in dev_rows if d["device_type"] in GPU_TYPES] or dev_rows
        main = max(gpu, key=lambda d: d["peak_bytes"]) if gpu else defaultdict(lambda: None)
        return {
            "devices": len(dev_rows),
            "alloc_events": sum(d["alloc_events"] for d in dev_rows),
            "free_events": sum(d["free_events"] for d in dev_rows),
            "peak_device": device_label(main['device_type'], main['device']), "peak_rank": main["rank"],
            "peak_bytes": main["peak_bytes"], "peak_ns": main["peak_ns"],
            "peak_replayed_bytes": main["peak_replayed_bytes"], "pretrace_offset_bytes": main["pretrace_offset_bytes"],
            "live_at_peak_bytes": main["live_at_peak_bytes"], "max_reserved_bytes": main["max_reserved_bytes"],
            "never_freed_bytes": sum(d["never_freed_bytes"] for d in dev_rows),
            "never_freed_blocks": sum(d["never_freed_blocks"] for d in dev_rows),
            "steps": len({(r["rank"], r["step"]) for r in step_rows}),
            "leak_bytes_per_step": max((lk["growth_bytes_per_step"] for lk in leaks), default=0),
        }

