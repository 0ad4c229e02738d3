"""The allocator replay and block lifetimes of the memory tool (the definitions are in the
package docstring), and what each device's replay says: its peak, what was live at it,
the blocks never freed and the footprint curve's points.

Everything is NumPy columns over the events in (device key, time) order; a block is one
row of ``Replay.rows`` (an alloc, or the free of a block allocated before the trace).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pastaprof.tools._codes import dense_codes
from pastaprof.tools.memory.common import GPU_TYPES, NEVER, as_str, downsample, i64, str_codes


class Replay:
    """Caching-allocator events (``tensor`` rows with ``bytes`` != 0) replayed per
    (rank, device, device_type): the levels, the segments of each device key, and the
    block rows with their alloc and free positions."""

    def __init__(self, ev: pa.Table) -> None:
        self._replay(ev)
        self._lifetimes()

    def _replay(self, ev: pa.Table) -> None:
        """Per device key, in time order (original order breaks ties): ``cs`` the replayed
        running sum, ``offset`` what the allocator held before the first event, ``level`` the
        absolute level, ``mismatched`` events per key that disagree with ``total_allocated``."""
        dtype_all = as_str(ev["device_type"])
        dcode = str_codes(ev["device_type"])
        rank0, dev0 = i64(ev["rank"], 0), i64(ev["device"])
        key0 = dense_codes(rank0, dev0, dcode)
        order = np.lexsort((np.arange(ev.num_rows), i64(ev["start_ns"]), key0))
        # only the columns read below travel through the reordering take
        self.ev = ev = ev.select(["start_ns", "bytes", "address", "total_allocated", "total_reserved", "pid",
                                  "tid"]).take(pa.array(order))
        self.n = n = ev.num_rows
        self.key, self.rank, self.dev, self.dtype = key0[order], rank0[order], dev0[order], dtype_all[order]
        key = self.key
        self.t = i64(ev["start_ns"])
        self.nbytes = nbytes = i64(ev["bytes"], 0)
        self.addr = np.asarray(pc.fill_null(ev["address"], 0).to_numpy(zero_copy_only=False), dtype=np.uint64)
        self.ta_ok = ta_ok = pc.is_valid(ev["total_allocated"]).to_numpy(zero_copy_only=False)
        ta = i64(ev["total_allocated"], 0)
        self.ta, self.tr = ta, i64(ev["total_reserved"], 0)
        self.seg = seg = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
        self.seg_end = np.r_[seg[1:], n]
        seg_len = self.seg_end - seg
        csg = np.cumsum(nbytes)
        self.cs = cs = csg - np.repeat(csg[seg] - nbytes[seg], seg_len)
        self.offset = offset = np.where(ta_ok[seg], ta[seg] - nbytes[seg], 0)
        self.level = level = cs + np.repeat(offset, seg_len)
        self.mismatched = np.add.reduceat((ta_ok & (ta != level)).astype(np.int64), seg)

    def _lifetimes(self) -> None:
        """Pair each alloc with the next event at its address if that is a free; a free with no
        alloc before it is a pre-trace block.  ``rows``: one event row per block; ``fpos`` / ``apos``:
        the block's free / alloc position (NEVER / -1 where there is none)."""
        n, key, addr, nbytes = self.n, self.key, self.addr, self.nbytes
        pos = np.arange(n)
        o2 = np.lexsort((pos, addr, key))
        a, b = o2[:-1], o2[1:]
        m = (key[a] == key[b]) & (addr[a] == addr[b]) & (nbytes[a] > 0) & (nbytes[b] < 0)
        free_of = np.full(n, -1)
        free_of[a[m]] = b[m]
        paired_free = np.zeros(n, bool)
        paired_free[b[m]] = True
        self.is_alloc, self.is_free = is_alloc, is_free = nbytes > 0, nbytes < 0
        pre = is_free & ~paired_free                  # frees of blocks allocated before the trace
        self.rows = rows = np.flatnonzero(is_alloc | pre)        # one row per block
        self.r_alloc = r_alloc = is_alloc[rows]
        fpos = np.where(r_alloc, free_of[rows], rows)
        self.fpos = fpos = np.where(fpos < 0, NEVER, fpos)
        self.apos = np.where(r_alloc, rows, -1)
        self.pid, self.tid = i64(self.ev["pid"]), i64(self.ev["tid"])
        self.freed = freed = fpos != NEVER
        self.fidx = np.clip(fpos, 0, n - 1)[freed]


def device_rows(r: Replay, bseg: np.ndarray, caps: dict[int, Any], max_points: int,
                top_live: int) -> tuple[list[dict], list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """Per device key (``bseg``: its blocks' range in ``r.rows``): the ``devices`` row, the
    footprint curve's event positions, the largest ``top_live`` blocks live at the peak and
    every block live at it (block indices)."""
    nbytes, rows, r_alloc, apos, fpos = r.nbytes, r.rows, r.r_alloc, r.apos, r.fpos
    cs, level, t, ta, ta_ok, tr = r.cs, r.level, r.t, r.ta, r.ta_ok, r.tr
    dev_rows, curve, live_idx, by_site_idx = [], [], [], []
    for k, (s, e) in enumerate(zip(r.seg, r.seg_end, strict=True)):
        p = s + int(np.argmax(cs[s:e]))           # first time the replay reaches its maximum
        bs, be = bseg[k], bseg[k + 1]
        live = bs + np.flatnonzero((apos[bs:be] <= p) & (p < fpos[bs:be]))
        traced_live = live[r_alloc[live]]
        by_site_idx.append(live)
        live_idx.append(live[np.argsort(-np.abs(nbytes[rows[live]]), kind="stable")[:top_live]])
        never = bs + np.flatnonzero(r_alloc[bs:be] & (fpos[bs:be] == NEVER))
        pre_freed = int(-nbytes[rows[bs:be][~r_alloc[bs:be]]].sum())
        curve.append(s + downsample(t[s:e], cs[s:e], max_points))
        ta_max = int(ta[s:e][ta_ok[s:e]].max()) if ta_ok[s:e].any() else None
        row = {
            "rank": int(r.rank[s]), "device": int(r.dev[s]), "device_type": str(r.dtype[s]),
            "alloc_events": int(r.is_alloc[s:e].sum()), "free_events": int(r.is_free[s:e].sum()),
            "first_ns": int(t[s]), "last_ns": int(t[e - 1]),
            "pretrace_offset_bytes": int(r.offset[k]), "peak_bytes": int(level[p]), "peak_ns": int(t[p]),
            "peak_replayed_bytes": int(cs[p]), "max_total_allocated": ta_max,
            "replay_consistent": ta_max is None or ta_max == int(level[p]),
            "mismatched_events": int(r.mismatched[k]),
            "reserved_at_peak": int(tr[p]), "max_reserved_bytes": int(tr[s:e].max()),
            "live_at_peak_blocks": len(traced_live), "live_at_peak_bytes": int(nbytes[rows[traced_live]].sum()),
            "pretrace_at_peak_bytes": int(level[p] - nbytes[rows[traced_live]].sum()),
            "pretrace_freed_bytes": pre_freed, "pretrace_unfreed_bytes": int(r.offset[k]) - pre_freed,
            "never_freed_blocks": len(never), "never_freed_bytes": int(nbytes[rows[never]].sum()),
            "end_bytes": int(level[e - 1]),
        }
        cap = caps.get(row["device"]) if row["device_type"] in GPU_TYPES else None
        row["device_memory_bytes"] = int(cap) if isinstance(cap, (int, float)) else None
        dev_rows.append(row)
    return dev_rows, curve, live_idx, by_site_idx
