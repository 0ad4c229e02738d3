"""Use-based memory patterns for the memory tool, after DrGPUM (ASPLOS'23): early allocation,
late deallocation, allocated-but-unused.  DrGPUM counts kernels between an allocation and its
accesses; here the clock is time and an access ("use") comes from one of two sources.

Uses of a block (allocator block ``[address, address + bytes)``, live from its alloc to its free):

* op uses: an op on the same rank (and pid, where every event has one) with a tensor input
  whose data pointer (op column ``input_ptrs``) lies in the block, starting while the block is
  live (``alloc <= op start < free``).  Ops that read no data -- views and metadata
  (``NO_READ_OPS``) and factories -- are not uses.  The op that allocated the block (the
  innermost op around its alloc event) is its first use, at the alloc time: it wrote its
  output.  Except factories that only allocate (``FACTORY_OPS``: ``aten::empty`` ..., output
  uninitialised) with no other op above them (native nesting: ``aten::zeros > aten::empty``
  is made by ``aten::zeros``): their first use is the first later op taking the block as input.
* kernel uses: an ``access_summary`` row (launch x object) whose object range overlaps the
  block, at the launch's kernel start (joined on rank + correlation), else at the row's own
  ``start_ns`` when it has one.

Matching, vectorized: the block boundaries cut the address space into elementary intervals;
uses and blocks are expanded over the intervals the uses touch; per interval the block live at
a use is the last one allocated at or before it (blocks sharing addresses are never live at
once), if its free is after the use.

Use data must be complete to conclude anything from an absence of uses: op data counts for a
rank when some op there has ``input_ptrs`` and the manifest reports no dropped or filtered ops;
kernel data counts for a GPU when every kernel launch recorded on it has ``access_summary``
rows.  Blocks elsewhere get no pattern, never a guess.

Patterns (blocks of at least ``MIN_BYTES`` allocated in the trace, with a known allocating op
when only op data covers them), with ``idle = max(IDLE_SHARE x trace span, IDLE_MIN_NS)``:

* ``unused``: no use at all before the free (or the trace end): saves its bytes;
* ``early_allocation``: ``first use - alloc > idle``: saves bytes x (first use - alloc);
* ``late_deallocation``: ``free - last use > idle``, freed blocks only (the never-freed ones
  are the never_freed table's): saves bytes x (free - last use).

``peak_bytes_saved``: bytes of the blocks idle (in that pattern's window) at their device's
peak -- what the peak drops by if nothing else moves into it, an upper bound.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pastaprof.processor.link import map_keys
from pastaprof.tools._codes import dense_codes, find_keys, radix_key
from pastaprof.tools.base import MEMORY_ONLY, Finding


def device_label(dtype: object, device: object) -> str:
    """'cuda:0', or just 'cpu' for host memory (device -1)."""
    try:
        return str(dtype) if int(device) < 0 else f"{dtype}:{device}"
    except (TypeError, ValueError):
        return f"{dtype}:{device}"

MIN_BYTES = 1 << 20         # blocks smaller than this get use columns but no pattern
IDLE_SHARE = 0.05           # idle threshold: this share of the rank's trace span ...
IDLE_MIN_NS = 10_000_000    # ... and at least 10 ms
TOP_SITES = 10              # findings per pattern (the table has every site)
WARN_PEAK_BYTES = 16 << 20  # a site idle at the peak by this much is a warning, else info
PATTERNS = ("unused", "early_allocation", "late_deallocation")
#: ops whose output is uninitialised memory: allocating it is not a use
FACTORY_OPS = frozenset({"empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided"})
#: ops that read no tensor data (views, metadata; composites whose copies run as child ops)
NO_READ_OPS = FACTORY_OPS | frozenset({
    "alias", "as_strided", "chunk", "contiguous", "detach", "diagonal", "expand", "expand_as", "flatten",
    "lift_fresh", "movedim", "narrow", "numpy_T", "permute", "reshape", "select", "slice", "split",
    "split_with_sizes", "squeeze", "t", "to", "transpose", "unbind", "unflatten", "unfold", "unsqueeze",
    "view", "view_as", "_reshape_alias", "_unsafe_view"})
GPU_TYPES = ("cuda", "hip")
NEVER = np.iinfo(np.int64).max
BEFORE = np.iinfo(np.int64).min
EMPTY = pa.schema([("rank", pa.int32()), ("device", pa.int32()), ("device_type", pa.string()),
                   ("pattern", pa.string()), ("op", pa.string()), ("site", pa.string()), ("blocks", pa.int64()),
                   ("bytes", pa.int64()), ("idle_ns", pa.int64()), ("max_idle_ns", pa.int64()),
                   ("byte_seconds", pa.float64()), ("peak_bytes_saved", pa.int64())])


def base_name(name: str) -> str:
    """``aten::empty`` / ``aten.empty.memory_format`` (dispatch-mode names) -> ``empty``."""
    if "::" in name:
        return name.split("::", 1)[1]
    parts = name.split(".")
    return parts[1] if len(parts) >= 2 and parts[0] in ("aten", "prims", "prim") else name


def _i64(col, fill: int = -1) -> np.ndarray:
    return np.asarray(pc.fill_null(col, fill).to_numpy(zero_copy_only=False), dtype=np.int64)


def _name_flags(names, sets: tuple[frozenset, ...]) -> list[np.ndarray]:
    """Per row of a (dictionary) name column: membership of its base name in each set."""
    col = names.cast(pa.string())
    uniq = pc.unique(col).drop_null()
    idx = _i64(pc.index_in(col, value_set=uniq))
    out = []
    for s in sets:
        flag = np.array([base_name(n) in s for n in uniq.to_pylist()] + [False], bool)
        out.append(flag[idx])  # idx -1 (null name) -> the trailing False
    return out


def _expand(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row, value) pairs for every value in [lo, hi) of every row."""
    n = np.maximum(hi - lo, 0)
    row = np.repeat(np.arange(len(lo)), n)
    within = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
    return row, np.repeat(lo, n) + within


def locate(b_lo, b_hi, b_t0, b_t1, u_lo, u_hi, u_t) -> tuple[np.ndarray, np.ndarray]:
    """Distinct (use, block) pairs: use range [u_lo, u_hi) overlaps block range [b_lo, b_hi)
    and ``b_t0 <= u_t < b_t1``.  Blocks that overlap in address must never be live together."""
    none = np.array([], np.int64)
    if len(b_lo) == 0 or len(u_lo) == 0:
        return none, none
    cuts = np.unique(np.concatenate([b_lo, b_hi]))
    e0 = np.maximum(np.searchsorted(cuts, u_lo, "right") - 1, 0)
    e1 = np.minimum(np.searchsorted(cuts, u_hi, "left"), len(cuts) - 1)
    ui, ue = _expand(e0, e1)                      # (use, elementary interval it touches)
    if len(ui) == 0:
        return none, none
    used = np.unique(ue)
    bi, bk = _expand(np.searchsorted(used, np.searchsorted(cuts, b_lo)),
                     np.searchsorted(used, np.searchsorted(cuts, b_hi)))
    be = used[bk]                                 # (block, used interval it covers)
    nb = len(bi)
    if nb == 0:
        return none, none
    e = np.concatenate([be, ue])
    t = np.concatenate([b_t0[bi], u_t[ui]])
    is_use = np.r_[np.zeros(nb, bool), np.ones(len(ui), bool)]
    o = np.lexsort((is_use, t, e))                # per interval, in time; allocs before uses on ties
    last = np.maximum.accumulate(np.where(is_use[o], -1, np.arange(len(o))))
    q = np.flatnonzero(is_use[o])
    cand = last[q]
    cand_row = o[np.maximum(cand, 0)]
    use_row = o[q] - nb
    blk = bi[np.minimum(cand_row, nb - 1)]
    use = ui[use_row]
    ok = (cand >= 0) & (e[cand_row] == ue[use_row]) & (u_t[use] < b_t1[blk])
    key = np.unique(use[ok] * len(b_lo) + blk[ok])
    return key // len(b_lo), key % len(b_lo)


def _op_uses(ops: pa.Table):
    """(rank, pid, ptr, time) of every op input that may read data, and the ranks with op data."""
    if ops.num_rows == 0 or "input_ptrs" not in ops.column_names or ops["input_ptrs"].null_count == ops.num_rows:
        return None, np.array([], np.int64)
    lists = ops["input_ptrs"].combine_chunks()
    rank = _i64(ops["rank"], 0)
    with_data = np.unique(rank[lists.is_valid().to_numpy(zero_copy_only=False)])
    ptr = _i64(pc.list_flatten(lists), 0)
    parent = np.asarray(pc.list_parent_indices(lists), dtype=np.int64)
    (no_read,) = _name_flags(ops["name"], (NO_READ_OPS,))
    keep = (ptr > 0) & ~no_read[parent]
    parent = parent[keep]
    return (rank[parent], _i64(ops["pid"])[parent], ptr[keep], _i64(ops["start_ns"])[parent]), with_data


def _kernel_uses(acc: pa.Table, kernels: pa.Table):
    """(rank, pid, lo, hi, time) of access_summary objects, and the (rank, device) pairs whose
    every recorded kernel launch has access rows."""
    acc = acc.filter(pc.is_valid(acc["object_address"]))
    if acc.num_rows == 0:
        return None, set()
    a_rank, a_corr = _i64(acc["rank"], 0), _i64(acc["correlation"])
    k_rank, k_corr = _i64(kernels["rank"], 0), _i64(kernels["correlation"])
    codes = dense_codes(np.r_[a_rank, k_rank], np.r_[a_corr, k_corr])
    a_code, k_code = codes[:len(a_rank)], codes[len(a_rank):]
    a_code[a_corr < 0] = -1
    k_code[k_corr < 0] = -1
    row = map_keys(a_code, k_code, np.arange(len(k_code)))
    k_start, k_pid = _i64(kernels["start_ns"]), _i64(kernels["pid"])
    if len(k_start) == 0:  # access rows without kernel records (the sanitizer excludes CUPTI)
        k_start, k_pid = np.full(1, -1, np.int64), np.full(1, -1, np.int64)
    # Rows with their own launch time (the sanitizer handler's: its launch numbers are not
    # CUPTI correlation ids) keep it; rows without one take their kernel's start.
    own = _i64(acc["start_ns"], 0)
    t = np.where(own > 0, own, np.where(row >= 0, k_start[np.maximum(row, 0)], -1))
    pid = np.where((own <= 0) & (row >= 0), k_pid[np.maximum(row, 0)], _i64(acc["pid"]))
    lo = np.asarray(acc["object_address"].to_numpy(zero_copy_only=False), dtype=np.uint64).astype(np.int64)
    hi = lo + np.maximum(_i64(acc["object_bytes"], 1), 1)
    ok = t >= 0
    k_dev = _i64(kernels["device"])
    seen = np.isin(k_code, a_code[a_code >= 0])
    mine = k_corr >= 0
    pairs, inv = np.unique(np.stack([k_rank[mine], k_dev[mine]], axis=1), axis=0, return_inverse=True)
    missing = np.bincount(inv.reshape(-1), weights=~seen[mine], minlength=len(pairs))
    covered = {(int(r), int(d)) for (r, d), m in zip(pairs, missing, strict=True) if m == 0}
    return (a_rank[ok], pid[ok], lo[ok], hi[ok], t[ok]), covered


def _incomplete_ranks(manifest: dict) -> set[int]:
    """Ranks whose op capture dropped, filtered or sampled ops (their absence of uses proves
    nothing): `--shapes sample` keeps the input pointers of some ops only."""
    out = set()
    for p in manifest.get("processes", []) or []:
        if not isinstance(p, dict):
            continue
        torch_h = (p.get("handlers") or {}).get("torch") or {}
        shapes = torch_h.get("shapes") if isinstance(torch_h.get("shapes"), dict) else {}
        sampled = shapes.get("mode") == "sample" and (shapes.get("ops_with_shapes") or 0) < (shapes.get("ops") or 0)
        if (torch_h.get("dropped") or 0) > 0 or ((p.get("filtered_by_kind") or {}).get("op") or 0) > 0 or sampled:
            out.add(int(p.get("rank", 0)))
    return out


def _producer_writes(ops: pa.Table, op_idx: np.ndarray) -> np.ndarray:
    """Per block: its allocating op wrote it -- the op, or an op above a factory, is no factory."""
    out = np.zeros(len(op_idx), bool)
    if ops.num_rows == 0:
        return out
    (factory,) = _name_flags(ops["name"], (FACTORY_OPS,))
    rank, ident, parent = _i64(ops["rank"], 0), _i64(ops["id"]), _i64(ops["parent_id"])
    if rank.min() == rank.max():   # one rank: ids are its row numbers, found by arithmetic
        up = find_keys(parent, ident, np.arange(len(rank)))
    else:   # a key per (rank, id): no codes needed, only equal keys match
        codes = radix_key(np.r_[rank, rank], np.r_[ident, parent])
        if codes is None:
            codes = dense_codes(np.r_[rank, rank], np.r_[ident, parent])
        p_code = codes[len(rank):]
        p_code[parent < 0] = -1
        o_code = codes[:len(rank)]
        o_code[ident < 0] = -1   # a null id names no parent
        up = map_keys(p_code, o_code, np.arange(len(rank)))   # op -> its parent op, or -1
    cur = op_idx.copy()
    for _ in range(16):                           # climb past factories (nesting is shallow)
        fac = (cur >= 0) & factory[np.maximum(cur, 0)]
        out |= (cur >= 0) & ~fac
        cur = np.where(fac, up[np.maximum(cur, 0)], -1)
        if not (cur >= 0).any():
            break
    return out


def block_uses(blocks: pa.Table, op_idx: np.ndarray, pid: np.ndarray, ops: pa.Table, acc: pa.Table,
               kernels: pa.Table, manifest: dict) -> tuple[pa.Table, np.ndarray, dict]:
    """Append ``first_use_ns``, ``last_use_ns``, ``uses`` and ``use_data_complete`` to the
    lifetime table; returns it, the complete mask and what use data there was."""
    n = blocks.num_rows
    rank = _i64(blocks["rank"], 0)
    dev = _i64(blocks["device"])
    gpu = pc.is_in(blocks["device_type"].cast(pa.string()), pa.array(GPU_TYPES)).to_numpy(zero_copy_only=False)
    lo = np.asarray(blocks["address"].to_numpy(zero_copy_only=False), dtype=np.uint64).astype(np.int64)
    hi = lo + _i64(blocks["bytes"], 0)
    alloc = _i64(blocks["alloc_ns"], BEFORE)
    free = _i64(blocks["free_ns"], NEVER)
    op_u, op_ranks = _op_uses(ops)
    k_u, k_cov = _kernel_uses(acc, kernels) if acc.num_rows else (None, set())
    incomplete = _incomplete_ranks(manifest)
    by_ops = np.isin(rank, [r for r in op_ranks if int(r) not in incomplete])
    cov = np.array(sorted(k_cov), np.int64).reshape(-1, 2)
    codes = dense_codes(np.r_[rank, cov[:, 0]], np.r_[dev, cov[:, 1]])
    by_kernels = gpu & np.isin(codes[:n], codes[n:])
    # uses from both sources: (rank, pid, lo, hi, time)
    parts = []
    if op_u is not None:
        r, p, ptr, t = op_u
        parts.append((r, p, ptr, ptr + 1, t))
    if k_u is not None:
        parts.append(k_u)
    known = np.isin(rank, op_ranks) | (gpu & np.isin(rank, k_u[0] if k_u is not None else []))
    first, last, count = np.full(n, NEVER), np.full(n, BEFORE), np.zeros(n, np.int64)
    if parts:
        u_rank, u_pid, u_lo, u_hi, u_t = (np.concatenate([x[i] for x in parts]) for i in range(5))
        # pid joins only where every block and use of the rank has one
        unknown = np.unique(np.r_[rank[pid < 0], u_rank[u_pid < 0]])
        b_pid = np.where(np.isin(rank, unknown), -1, pid)
        u_pid = np.where(np.isin(u_rank, unknown), -1, u_pid)
        g = dense_codes(np.r_[rank, u_rank], np.r_[b_pid, u_pid])
        bg, ug = g[:n], g[n:]
        for k in np.unique(ug):
            bsel, usel = np.flatnonzero(bg == k), np.flatnonzero(ug == k)
            ui, bj = locate(lo[bsel], hi[bsel], alloc[bsel], free[bsel], u_lo[usel], u_hi[usel], u_t[usel])
            b, t = bsel[bj], u_t[usel[ui]]
            np.minimum.at(first, b, t)
            np.maximum.at(last, b, t)
            count += np.bincount(b, minlength=n)
    wrote = _producer_writes(ops, op_idx) & (alloc != BEFORE)
    first = np.where(wrote, np.minimum(first, alloc), first)
    last = np.where(wrote, np.maximum(last, alloc), last)
    count += wrote
    blocks = blocks.append_column("first_use_ns", pa.array(first, pa.int64(), mask=~known | (count == 0)))
    blocks = blocks.append_column("last_use_ns", pa.array(last, pa.int64(), mask=~known | (count == 0)))
    blocks = blocks.append_column("uses", pa.array(count, pa.int64(), mask=~known))
    # without kernel data, a block whose allocating op is unknown was maybe written unseen
    complete = by_kernels | (by_ops & (op_idx >= 0))
    blocks = blocks.append_column("use_data_complete", pa.array(complete & known))
    sources = [s for s, m in (("ops", by_ops.any()), ("kernels", by_kernels.any())) if m]
    info = {"use_data": "+".join(sources) or "none"}
    if not sources and (len(op_ranks) or k_u is not None):
        info["use_data_note"] = ("op input pointers present but ops were dropped, filtered or sampled "
                                 "(pastaprof run --shapes all keeps every op's) on ranks "
                                 f"{sorted(incomplete)}" if len(op_ranks) else
                                 "access_summary does not cover every recorded kernel launch")
    return blocks, complete & known, info


def find_patterns(blocks: pa.Table, complete: np.ndarray, live_at_peak: np.ndarray, dev_index: np.ndarray,
                  dev_rows: list[dict], rank_span: dict[int, tuple[int, int]], options: dict
                  ) -> tuple[pa.Table, list[Finding], dict]:
    """The three patterns per block, aggregated by allocation site (table + top findings)."""
    min_bytes = int(options.get("pattern_min_bytes", MIN_BYTES))
    share = float(options.get("idle_share", IDLE_SHARE))
    floor = int(options.get("idle_min_ns", IDLE_MIN_NS))
    top = int(options.get("top_sites", TOP_SITES))
    rank = _i64(blocks["rank"], 0)
    nbytes = _i64(blocks["bytes"], 0)
    alloc, free = _i64(blocks["alloc_ns"], BEFORE), _i64(blocks["free_ns"], NEVER)
    first, last = _i64(blocks["first_use_ns"], NEVER), _i64(blocks["last_use_ns"], BEFORE)
    used = _i64(blocks["uses"], 0) > 0
    peak_ns = np.array([d["peak_ns"] for d in dev_rows], np.int64)[dev_index]
    ranks, inv = np.unique(rank, return_inverse=True)
    lo_hi = np.array([rank_span.get(int(r), (0, 0)) for r in ranks], np.int64).reshape(-1, 2)[inv]
    end = np.maximum(lo_hi[:, 1], np.where(free == NEVER, BEFORE, free))
    idle_thr = np.maximum((share * (lo_hi[:, 1] - lo_hi[:, 0])).astype(np.int64), floor)
    ok = complete & (alloc != BEFORE) & (nbytes >= min_bytes)
    stop = np.where(free == NEVER, end, free)
    hits = {
        "unused": (ok & ~used, stop - alloc, live_at_peak),
        "early_allocation": (ok & used & (first - alloc > idle_thr), first - alloc, live_at_peak & (peak_ns < first)),
        "late_deallocation": (ok & used & (free != NEVER) & (free - last > idle_thr), free - last,
                              live_at_peak & (peak_ns >= last)),
    }
    parts = []
    for name, (mask, idle, at_peak) in hits.items():
        sel = np.flatnonzero(mask)
        parts.append(pa.table({
            "rank": blocks["rank"].take(sel), "device": blocks["device"].take(sel),
            "device_type": blocks["device_type"].take(sel), "pattern": pa.array([name] * len(sel), pa.string()),
            "op": blocks["op_name"].take(sel), "site": blocks["call_site"].take(sel),
            "bytes": pa.array(nbytes[sel], pa.int64()), "idle_ns": pa.array(idle[sel], pa.int64()),
            "byte_seconds": pa.array(nbytes[sel] * (idle[sel] / 1e9), pa.float64()),
            "peak_bytes_saved": pa.array(np.where(at_peak[sel], nbytes[sel], 0), pa.int64())}))
    per_block = pa.concat_tables(parts)
    keys = ["rank", "device", "device_type", "pattern", "op", "site"]
    g = per_block.group_by(keys, use_threads=False).aggregate(
        [("bytes", "count"), ("bytes", "sum"), ("idle_ns", "sum"), ("idle_ns", "max"), ("byte_seconds", "sum"),
         ("peak_bytes_saved", "sum")])
    g = g.rename_columns([{"bytes_count": "blocks", "bytes_sum": "bytes", "idle_ns_sum": "idle_ns",
                           "idle_ns_max": "max_idle_ns", "byte_seconds_sum": "byte_seconds",
                           "peak_bytes_saved_sum": "peak_bytes_saved"}.get(c, c) for c in g.column_names])
    g = g.select(EMPTY.names).cast(EMPTY)
    g = g.sort_by([("pattern", "ascending"), ("peak_bytes_saved", "descending"), ("byte_seconds", "descending")])
    findings = []
    rows = g.to_pylist()
    for name in PATTERNS:
        for r in [x for x in rows if x["pattern"] == name][:top]:
            findings.append(_finding(r))
    summary = {"pattern_bytes": {p: sum(r["bytes"] for r in rows if r["pattern"] == p) for p in PATTERNS},
               "pattern_peak_bytes_saved": {p: sum(r["peak_bytes_saved"] for r in rows if r["pattern"] == p)
                                            for p in PATTERNS}}
    return g, findings, summary


def _fmt(b: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(b) >= size:
            return f"{b / size:.1f} {unit}"
    return f"{int(b)} B"


def _finding(r: dict) -> Finding:
    dev = device_label(r['device_type'], r['device'])
    blocks = f"{r['blocks']} block" + ("s" if r["blocks"] != 1 else "")
    idle = f"{r['max_idle_ns'] / 1e6:.1f} ms"
    what = {"unused": f"allocated and never used (live up to {idle})",
            "early_allocation": f"allocated up to {idle} before first use",
            "late_deallocation": f"freed up to {idle} after last use"}[r["pattern"]]
    peak = f"; {_fmt(r['peak_bytes_saved'])} of it idle at the peak" if r["peak_bytes_saved"] else ""
    sev = "warning" if r["peak_bytes_saved"] >= WARN_PEAK_BYTES else "info"
    where = " @ ".join(x for x in (r["op"], r["site"]) if x) or dev
    advice = {"unused": "Do not allocate these blocks, or allocate them only where they are used.",
              "early_allocation": "Allocate these blocks just before their first use.",
              "late_deallocation": "Drop the last reference right after the last use (del, or a narrower scope)."}
    return Finding(sev, f"{dev}: {_fmt(r['bytes'])} in {blocks} {what}{peak}", dict(r) | {"at_stake": MEMORY_ONLY},
                   location=where, suggestion=advice[r["pattern"]], impact_ns=0,
                   impact_bytes=int(r["peak_bytes_saved"]))
