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

    def __len__(self) -> int:
        return len(self.launch)


@dataclass
class Objects:
    """Objects live at each launch: (launch, base, bytes) rows, any order."""

    launch: np.ndarray
    base: np.ndarray
    nbytes: np.ndarray


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
    tot = np.bincount(inv, weights=o_bytes, minlength=len(ul)).astype(np.int64)
    i = np.searchsorted(ul, launches)
    hit = (i < len(ul)) & (ul[np.clip(i, 0, max(len(ul) - 1, 0))] == launches) if len(ul) else np.zeros(len(launches), bool)
    return np.where(hit, tot[np.clip(i, 0, max(len(ul) - 1, 0))] if len(ul) else 0, 0)


def reduce_requests(req: Requests, objs: Objects, page_bytes: int = DEFAULT_PAGE,
                    names: dict[int, str] | None = None) -> dict[str, pa.Table]:
    """Reduce raw requests to ``access_summary`` and ``access_pc`` tables (see module doc)."""
    if page_bytes <= 0 or page_bytes & (page_bytes - 1):
        raise ValueError(f"page size {page_bytes}: must be a power of two")
    mask = _lane_mask(req.active)
    r_idx, lane = np.nonzero(mask)                       # one entry per active lane
    addr = req.addresses[r_idx, lane].astype(np.uint64)
    launch = req.launch[r_idx].astype(np.int64)
    flags = req.flags[r_idx].astype(np.int64)
    size = req.size[r_idx].astype(np.int64)
    # ---- attribution: objects sorted by (launch, base); search (launch, address)
    o_launch, o_base, o_bytes = (np.asarray(objs.launch, np.int64), np.asarray(objs.base, np.uint64),
                                 np.asarray(objs.nbytes, np.int64))
    order = np.lexsort((o_base, o_launch))
    o_launch, o_base, o_bytes = o_launch[order], o_base[order], o_bytes[order]
    obj = np.full(len(addr), -1, np.int64)
    if len(o_base) and len(addr):
        by_launch = np.argsort(launch, kind="stable")
        sl = launch[by_launch]
        ul, first = np.unique(o_launch, return_index=True)
        obounds = np.r_[first, len(o_launch)]
        for i, lv in enumerate(ul):                      # one search per launch, not per access
            a0, a1 = np.searchsorted(sl, lv, "left"), np.searchsorted(sl, lv, "right")
            if a0 == a1:
                continue
            idx = by_launch[a0:a1]
            s, e = obounds[i], obounds[i + 1]
            cand = s + np.searchsorted(o_base[s:e], addr[idx], side="right") - 1
            c = np.clip(cand, s, e - 1)
            ok = (cand >= s) & (addr[idx] >= o_base[c]) & (addr[idx] - o_base[c] < o_bytes[c].astype(np.uint64))
            obj[idx] = np.where(ok, c, -1)               # both ends checked: a gap is no object's
    is_read = (flags & (READ | ATOMIC)) != 0
    is_write = (flags & (WRITE | ATOMIC)) != 0
    sector = addr // np.uint64(SECTOR)
    # distinct sectors per (request, object): sort by (request, object, sector), count changes
    key_ro = r_idx.astype(np.int64) * (len(o_base) + 1) + (obj + 1)
    ro_sectors_key = _distinct_pairs(key_ro, sector.astype(np.int64))[0]
    # ---- per (launch, object)
    gkey = launch * (len(o_base) + 1) + (obj + 1)
    ug, ginv = np.unique(gkey, return_inverse=True)
    reads = np.bincount(ginv, weights=is_read, minlength=len(ug)).astype(np.int64)
    writes = np.bincount(ginv, weights=is_write, minlength=len(ug)).astype(np.int64)
    b_read = np.bincount(ginv, weights=size * is_read, minlength=len(ug)).astype(np.int64)
    b_write = np.bincount(ginv, weights=size * is_write, minlength=len(ug)).astype(np.int64)
    req_of_pair = ro_sectors_key // (len(o_base) + 1)
    obj_of_pair = ro_sectors_key % (len(o_base) + 1) - 1
    pair_g = req.launch[req_of_pair].astype(np.int64) * (len(o_base) + 1) + (obj_of_pair + 1)
    sectors = np.bincount(np.searchsorted(ug, pair_g), minlength=len(ug)).astype(np.int64)
    g_launch = ug // (len(o_base) + 1)
    g_obj = ug % (len(o_base) + 1) - 1
    # per-page histogram of lane accesses within each object
    attributed = obj >= 0
    if attributed.any():
        shift = int(np.log2(page_bytes))
        page = ((addr[attributed] - o_base[obj[attributed]]) >> np.uint64(shift)).astype(np.int64)
        gi = ginv[attributed]
        n_pages = ((o_bytes + page_bytes - 1) // page_bytes).astype(np.int64)
        offsets = np.zeros(len(ug) + 1, np.int64)
        gp = np.where(g_obj >= 0, n_pages[np.clip(g_obj, 0, None)], 0)
        offsets[1:] = np.cumsum(gp)
        flat = np.bincount(offsets[gi] + page, minlength=int(offsets[-1])).astype(np.int64)
        page_counts = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(flat))
    else:
        page_counts = pa.ListArray.from_arrays(pa.array(np.zeros(len(ug) + 1, np.int32)), pa.array([], pa.int64()))
    summary = pa.table({
        "start_ns": np.zeros(len(ug), np.int64), "end_ns": np.zeros(len(ug), np.int64),
        "rank": np.zeros(len(ug), np.int32), "correlation": g_launch,
        "name": pa.array([(names or {}).get(int(x), "") for x in g_launch], pa.string()),
        "object_address": pa.array(np.where(g_obj >= 0, o_base[np.clip(g_obj, 0, None)], 0), pa.uint64(),
                                   mask=g_obj < 0),
        "object_bytes": pa.array(np.where(g_obj >= 0, o_bytes[np.clip(g_obj, 0, None)], 0), pa.int64(),
                                 mask=g_obj < 0),
        "reads": reads, "writes": writes, "bytes_read": b_read, "bytes_written": b_write, "sectors": sectors,
        "page_bytes": pa.array(np.full(len(ug), page_bytes, np.int64)),
        "page_counts": page_counts,
        "live_bytes": _live_bytes(o_launch, o_bytes, g_launch),
    })
    # ---- per (launch, PC): requests, lanes, distinct sectors per request (all objects)
    rs_req, _ = _distinct_pairs(r_idx.astype(np.int64), sector.astype(np.int64))
    sec_per_req = np.bincount(rs_req, minlength=len(req)).astype(np.int64)
    lanes_per_req = mask.sum(axis=1).astype(np.int64)
    pkey = np.stack([req.launch.astype(np.int64), req.pc.astype(np.int64)], axis=1)
    up, pinv = np.unique(pkey, axis=0, return_inverse=True)
    pinv = pinv.reshape(-1)
    pcs = pa.table({
        "start_ns": np.zeros(len(up), np.int64), "end_ns": np.zeros(len(up), np.int64),
        "rank": np.zeros(len(up), np.int32), "correlation": up[:, 0],
        "name": pa.array([(names or {}).get(int(x), "") for x in up[:, 0]], pa.string()),
        "pc": pa.array(up[:, 1].astype(np.uint64)),
        "requests": np.bincount(pinv, minlength=len(up)).astype(np.int64),
        "lanes": np.bincount(pinv, weights=lanes_per_req, minlength=len(up)).astype(np.int64),
        "bytes": np.bincount(pinv, weights=lanes_per_req * req.size, minlength=len(up)).astype(np.int64),
        "sectors": np.bincount(pinv, weights=sec_per_req, minlength=len(up)).astype(np.int64),
        "reads": np.bincount(pinv, weights=((req.flags & (READ | ATOMIC)) != 0) * lanes_per_req,
                             minlength=len(up)).astype(np.int64),
        "writes": np.bincount(pinv, weights=((req.flags & (WRITE | ATOMIC)) != 0) * lanes_per_req,
                              minlength=len(up)).astype(np.int64),
    })
    return {"access_summary": conform("access_summary", summary), "access_pc": conform("access_pc", pcs)}
