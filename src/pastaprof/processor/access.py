"""The CPU processor path of instruction-level analysis (issue D): raw warp-level memory
requests -> the same fixed-size per-launch summaries the GPU path produces.

A *request* is one warp-level memory instruction as the sanitizer patch records it in
raw mode: the launch it belongs to, its PC, flags (read / write / atomic), the access size
per lane, the active-lane mask and 32 lane addresses.  ``reduce_requests`` turns a batch
of them, plus the objects (allocations / tensors) live at each launch, into

* ``access_summary`` rows, one per (launch, object): lane reads and writes, bytes, and
  ``sectors`` = the sum over requests of the distinct 32-byte sectors the request touched
  in that object (what the memory system moves), with a per-page access histogram;
* ``access_pc`` rows, one per (launch, PC): requests, active lanes, distinct sectors --
  sectors per request is the coalescing measure;
* a row with a null object per launch for lane accesses that fall in **no** live object
  (never credited to a neighbour: both ends of each range are checked).

Everything is vectorized NumPy (sort + searchsorted + bincount / unique on packed keys),
no per-access Python, so that comparing it with the GPU path says something true about
*where* to reduce, not about Python loops.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from pastaprof.events.schema import conform
from pastaprof.processor.link import map_keys

LANES = 32
SECTOR = 32
READ, WRITE, ATOMIC = 1, 2, 4
DEFAULT_PAGE = 4096


@dataclass
class Requests:
    """A batch of raw warp-level requests (columns; ``addresses`` is (n, 32))."""

    launch: np.ndarray      # int64 per request: the launch (correlation id)
    pc: np.ndarray          # uint64 per request: PC offset in the kernel
    flags: np.ndarray       # int64 bitmask READ / WRITE / ATOMIC
    size: np.ndarray        # int64 bytes per lane access
    active: np.ndarray      # uint32 active-lane mask
    addresses: np.ndarray   # uint64 (n, 32); inactive lanes ignored
    cta: np.ndarray | None = None    # int64 flattened block index per request (heatmap)
    warp: np.ndarray | None = None   # int64 warp index within the block (heatmap)

    def __len__(self) -> int:
        return len(self.launch)


@dataclass
class Objects:
    """Objects live at each launch: (launch, base, bytes) rows, any order.

    ``level`` (optional) nests two kinds of object, as the GPU path does: level 0
    (tensors, the allocator's blocks) is searched first, and an address in no level-0
    object is then looked up among level 1 (driver allocations, e.g. the allocator's
    segments).  Objects of one level must not overlap."""

    launch: np.ndarray
    base: np.ndarray
    nbytes: np.ndarray
    level: np.ndarray | None = None

OBJECT_KINDS = ("tensor", "allocation")


def _lane_mask(active: np.ndarray) -> np.ndarray:
    bits = np.arange(LANES, dtype=np.uint32)
    return ((active.astype(np.uint32)[:, None] >> bits) & 1).astype(bool)


def _distinct_pairs(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (a, b) pairs, as two arrays (lexsort, then keep changes)."""
    if len(a) == 0:
        return a, b
    o = np.lexsort((b, a))
    a, b = a[o], b[o]
    keep = np.r_[True, (a[1:] != a[:-1]) | (b[1:] != b[:-1])]
    return a[keep], b[keep]


def _live_bytes(o_launch: np.ndarray, o_bytes: np.ndarray, launches: np.ndarray) -> np.ndarray:
    """Bytes of all objects live at each of ``launches`` (the launch's footprint)."""
    ul, inv = np.unique(o_launch, return_inverse=True)
    tot = np.bincount(inv.reshape(-1), weights=o_bytes, minlength=len(ul)).astype(np.int64)
    return np.maximum(map_keys(np.asarray(launches, np.int64), ul, tot), 0)


def heatmap(req: Requests, objs: Objects, launch: int, cta: int) -> pa.Table:
    """Per 32-byte sector touched by one CTA of one launch (PASTA's heatmap_analysis,
    cuThermo-style): lane accesses, reads, writes, distinct warps, and accesses per 4-byte
    word of the sector (``word_counts``, 8 per sector).  ``object_address`` is the object the
    sector lies in (null: in none)."""
    if req.cta is None:
        raise ValueError("the requests carry no CTA ids (raw mode records them for the heatmap)")
    sel = (np.asarray(req.launch) == launch) & (np.asarray(req.cta) == cta)
    mask = _lane_mask(np.asarray(req.active)[sel])
    r, lane = np.nonzero(mask)
    addr = np.asarray(req.addresses, np.uint64)[sel][r, lane]
    flags = np.asarray(req.flags, np.int64)[sel][r]
    warp = (np.asarray(req.warp, np.int64)[sel][r] if req.warp is not None else np.zeros(len(r), np.int64))
    sector = (addr // np.uint64(SECTOR)).astype(np.int64)
    us, sinv = np.unique(sector, return_inverse=True)
    sinv = sinv.reshape(-1)
    word = ((addr % np.uint64(SECTOR)) // np.uint64(4)).astype(np.int64)
    words = np.bincount(sinv * 8 + word, minlength=len(us) * 8).reshape(len(us), 8)
    wpairs, _ = _distinct_pairs(sinv.astype(np.int64), warp)
    here = np.asarray(objs.launch) == launch
    level = np.zeros(int(here.sum()), np.int64) if objs.level is None else np.asarray(objs.level, np.int64)[here]
    sec_addr = us.astype(np.uint64) * np.uint64(SECTOR)
    owner = np.zeros(len(us), np.uint64)
    inside = np.zeros(len(us), bool)
    for lv in np.unique(level):  # tensors first, then allocations (as the summaries do)
        base = np.asarray(objs.base, np.uint64)[here][level == lv]
        size = np.asarray(objs.nbytes, np.int64)[here][level == lv]
        o = np.argsort(base)
        base, size = base[o], size[o]
        cand = np.searchsorted(base, sec_addr, side="right") - 1
        c = np.clip(cand, 0, len(base) - 1)
        hit = ~inside & (cand >= 0) & (sec_addr - base[c] < size[c].astype(np.uint64))
        owner = np.where(hit, base[c], owner)
        inside |= hit
    return conform("access_heatmap", pa.table({
        "start_ns": np.zeros(len(us), np.int64), "end_ns": np.zeros(len(us), np.int64),
        "rank": np.zeros(len(us), np.int32),
        "correlation": np.full(len(us), launch, np.int64), "cta": np.full(len(us), cta, np.int64),
        "object_address": pa.array(owner, mask=~inside),
        "sector_address": pa.array(sec_addr),
        "accesses": np.bincount(sinv, minlength=len(us)).astype(np.int64),
        "reads": np.bincount(sinv, weights=(flags & (READ | ATOMIC)) != 0, minlength=len(us)).astype(np.int64),
        "writes": np.bincount(sinv, weights=(flags & (WRITE | ATOMIC)) != 0, minlength=len(us)).astype(np.int64),
        "warps": np.bincount(wpairs, minlength=len(us)).astype(np.int64),
        "word_counts": pa.FixedSizeListArray.from_arrays(pa.array(words.reshape(-1).astype(np.int64)), 8),
    }))


def _attribute(addr: np.ndarray, lidx: np.ndarray, ul_req: np.ndarray, o_launch: np.ndarray, o_base: np.ndarray,
               o_bytes: np.ndarray, o_level: np.ndarray) -> np.ndarray:
    """The object index of every (request, lane) address, -1 for none: per launch, its objects'
    sorted bases searched once (level 0 first, then level 1), both ends checked."""
    n, n_obj = len(addr), len(o_base)
    obj = np.full((n, LANES), -1, np.int64)
    if not (n_obj and n):
        return obj
    by_l = np.argsort(lidx, kind="stable")
    rb = np.searchsorted(lidx[by_l], np.arange(len(ul_req) + 1))
    ol, ofirst = np.unique(o_launch, return_index=True)
    obounds = np.r_[ofirst, n_obj]
    for i, lv in enumerate(ul_req):                  # one search per launch, not per access
        j = np.searchsorted(ol, lv)
        if j >= len(ol) or ol[j] != lv:
            continue
        rows = by_l[rb[i]:rb[i + 1]]
        a = addr[rows]
        hit = np.full(a.shape, -1, np.int64)
        lo, hi = obounds[j], obounds[j + 1]
        cuts = lo + np.searchsorted(o_level[lo:hi], np.unique(o_level[lo:hi]), side="right")
        s0 = lo
        for e0 in cuts:
            miss = hit < 0
            cand = s0 + np.searchsorted(o_base[s0:e0], a, side="right") - 1
            c = np.clip(cand, s0, e0 - 1)
            ok = miss & (cand >= s0) & (a >= o_base[c]) & (a - o_base[c] < o_bytes[c].astype(np.uint64))
            hit = np.where(ok, c, hit)
            s0 = e0
        obj[rows] = hit
    return obj


def _group_index(g_lane: np.ndarray, bins: int) -> tuple[np.ndarray, np.ndarray]:
    """Distinct groups and each lane's dense index into them."""
    if bins <= (1 << 25):  # dense: count per bin, no sort
        ug = np.flatnonzero(np.bincount(g_lane, minlength=bins))
        lut = np.full(bins, -1, np.int64)
        lut[ug] = np.arange(len(ug))
        return ug, lut[g_lane]
    ug, ginv = np.unique(g_lane, return_inverse=True)
    return ug, ginv.reshape(-1)


def _distinct_sectors(addr: np.ndarray, obj: np.ndarray, mask: np.ndarray, r_idx: np.ndarray, lane: np.ndarray,
                      n_obj: int, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct (object, sector) pairs per request: (request, object) of each, sectors per request."""
    sector = addr // np.uint64(SECTOR)
    if n_obj < (1 << 19):  # sort each 32-lane row of packed (object, sector) keys
        packed = ((obj + 1).astype(np.uint64) << np.uint64(44)) | (sector & np.uint64((1 << 44) - 1))
        none = np.uint64(np.iinfo(np.uint64).max)
        packed = np.sort(np.where(mask, packed, none), axis=1)
        start = np.ones_like(mask)
        start[:, 1:] = packed[:, 1:] != packed[:, :-1]
        start &= packed != none
        sr, sl = np.nonzero(start)
        s_obj = (packed[sr, sl] >> np.uint64(44)).astype(np.int64) - 1
        return sr, s_obj, start.sum(axis=1).astype(np.int64)
    # too many objects to pack: sort (request, object, sector) triples instead
    key = r_idx.astype(np.int64) * width + obj[r_idx, lane] + 1
    kk, _ = _distinct_pairs(key, sector[r_idx, lane].astype(np.int64))
    sr, s_obj = kk // width, kk % width - 1
    return sr, s_obj, np.bincount(sr, minlength=len(addr)).astype(np.int64)


def _page_counts(addr: np.ndarray, obj: np.ndarray, r_idx: np.ndarray, lane: np.ndarray, ginv: np.ndarray,
                 g_obj: np.ndarray, o_base: np.ndarray, o_bytes: np.ndarray, page_bytes: int) -> pa.ListArray:
    """Per group, a histogram of its lane accesses over the pages of its object."""
    att = obj[r_idx, lane] >= 0
    n_groups = len(g_obj)
    if not att.any():
        return pa.ListArray.from_arrays(pa.array(np.zeros(n_groups + 1, np.int32)), pa.array([], pa.int64()))
    shift = np.uint64(int(np.log2(page_bytes)))
    oi = obj[r_idx[att], lane[att]]
    page = ((addr[r_idx[att], lane[att]] - o_base[oi]) >> shift).astype(np.int64)
    n_pages = ((o_bytes + page_bytes - 1) // page_bytes).astype(np.int64)
    offsets = np.zeros(n_groups + 1, np.int64)
    offsets[1:] = np.cumsum(np.where(g_obj >= 0, n_pages[np.clip(g_obj, 0, None)], 0))
    flat = np.bincount(offsets[ginv[att]] + page, minlength=int(offsets[-1])).astype(np.int64)
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(flat))


def _pc_table(req: Requests, mask: np.ndarray, sec_per_req: np.ndarray, names: dict[int, str] | None) -> pa.Table:
    """Per (launch, PC): requests, lanes, bytes, distinct sectors, reads and writes."""
    lanes_per_req = mask.sum(axis=1).astype(np.int64)
    pkey = np.stack([req.launch.astype(np.int64), req.pc.astype(np.int64)], axis=1)
    up, pinv = np.unique(pkey, axis=0, return_inverse=True)
    pinv = pinv.reshape(-1)

    def per_pc(weights: np.ndarray | None = None) -> np.ndarray:
        return np.bincount(pinv, weights=weights, minlength=len(up)).astype(np.int64)

    return pa.table({
        "start_ns": np.zeros(len(up), np.int64), "end_ns": np.zeros(len(up), np.int64),
        "rank": np.zeros(len(up), np.int32), "correlation": up[:, 0],
        "name": pa.array([(names or {}).get(int(x), "") for x in up[:, 0]], pa.string()),
        "pc": pa.array(up[:, 1].astype(np.uint64)),
        "requests": per_pc(), "lanes": per_pc(lanes_per_req), "bytes": per_pc(lanes_per_req * req.size),
        "sectors": per_pc(sec_per_req),
        "reads": per_pc(((req.flags & (READ | ATOMIC)) != 0) * lanes_per_req),
        "writes": per_pc(((req.flags & (WRITE | ATOMIC)) != 0) * lanes_per_req),
    })


def reduce_requests(req: Requests, objs: Objects, page_bytes: int = DEFAULT_PAGE,
                    names: dict[int, str] | None = None) -> dict[str, pa.Table]:
    """Reduce raw requests to ``access_summary`` and ``access_pc`` tables (see module doc).

    Works on the (requests x 32 lanes) matrix: attribution by one ``searchsorted`` per
    launch, distinct sectors per request by sorting each 32-lane row of packed
    (object, sector) keys, and every count by ``bincount`` over dense group indices."""
    if page_bytes <= 0 or page_bytes & (page_bytes - 1):
        raise ValueError(f"page size {page_bytes}: must be a power of two")
    mask = _lane_mask(req.active)
    addr = np.asarray(req.addresses, np.uint64)
    launch_r = np.asarray(req.launch, np.int64)
    o_launch, o_base, o_bytes = (np.asarray(objs.launch, np.int64), np.asarray(objs.base, np.uint64),
                                 np.asarray(objs.nbytes, np.int64))
    o_level = np.zeros(len(o_base), np.int64) if objs.level is None else np.asarray(objs.level, np.int64)
    order = np.lexsort((o_base, o_level, o_launch))
    o_launch, o_base, o_bytes, o_level = o_launch[order], o_base[order], o_bytes[order], o_level[order]
    n_obj = len(o_base)
    ul_req, lidx = np.unique(launch_r, return_inverse=True)
    lidx = lidx.reshape(-1)
    obj = _attribute(addr, lidx, ul_req, o_launch, o_base, o_bytes, o_level)
    # ---- dense group index per lane: (launch, object), object -1 = none
    width = n_obj + 1
    r_idx, lane = np.nonzero(mask)
    ug, ginv = _group_index((lidx[:, None] * width + (obj + 1))[r_idx, lane], len(ul_req) * width)
    flags_r = np.asarray(req.flags, np.int64)
    size_r = np.asarray(req.size, np.int64)
    rd_r = (flags_r & (READ | ATOMIC)) != 0
    wr_r = (flags_r & (WRITE | ATOMIC)) != 0

    def per_group(weights: np.ndarray) -> np.ndarray:
        return np.bincount(ginv, weights=weights[r_idx], minlength=len(ug)).astype(np.int64)

    sr, s_obj, sec_per_req = _distinct_sectors(addr, obj, mask, r_idx, lane, n_obj, width)
    sectors = np.bincount(np.searchsorted(ug, lidx[sr] * width + s_obj + 1), minlength=len(ug)).astype(np.int64)
    g_launch = ul_req[ug // width]
    g_obj = ug % width - 1
    some = np.clip(g_obj, 0, None)

    def of_object(values: np.ndarray) -> np.ndarray:  # a group's object's value (0 where it has none)
        return values[some] if len(values) else np.zeros(len(some), values.dtype)

    summary = pa.table({
        "start_ns": np.zeros(len(ug), np.int64), "end_ns": np.zeros(len(ug), np.int64),
        "rank": np.zeros(len(ug), np.int32), "correlation": g_launch,
        "name": pa.array([(names or {}).get(int(x), "") for x in g_launch], pa.string()),
        "object_address": pa.array(np.where(g_obj >= 0, of_object(o_base), 0), pa.uint64(), mask=g_obj < 0),
        "object_bytes": pa.array(np.where(g_obj >= 0, of_object(o_bytes), 0), pa.int64(), mask=g_obj < 0),
        "object_kind": pa.DictionaryArray.from_arrays(
            pa.array(np.where(g_obj >= 0, np.clip(of_object(o_level), 0, 1), 0), pa.int32(), mask=g_obj < 0),
            pa.array(OBJECT_KINDS)),
        "reads": per_group(rd_r), "writes": per_group(wr_r), "bytes_read": per_group(size_r * rd_r),
        "bytes_written": per_group(size_r * wr_r), "sectors": sectors,
        "page_bytes": pa.array(np.full(len(ug), page_bytes, np.int64)),
        "page_counts": _page_counts(addr, obj, r_idx, lane, ginv, g_obj, o_base, o_bytes, page_bytes),
        "live_bytes": _live_bytes(o_launch, o_bytes, g_launch),
    })
    pcs = _pc_table(req, mask, sec_per_req, names)
    return {"access_summary": conform("access_summary", summary), "access_pc": conform("access_pc", pcs)}
