"""Laminar slice nesting: the begin/end event order that draws intervals as nested slices.

Why this module exists: Perfetto draws the slices of a track from
``SLICE_BEGIN`` / ``SLICE_END`` pairs, an end closing the innermost open slice,
so the slices of one track must be laminar (a slice that starts inside another
ends inside it) and their events must come in a matching order.  Recorded
intervals are not always laminar, and turning millions of them into that order
is interval geometry, independent of how the events are then encoded -- so it
lives here, apart from the wire format (``protowire.py``) and the trace layout
(``perfetto.py``).

Per track the intervals are sorted by (start, longest first, then the caller's
tie-breakers: recorded depth and id for ops), and a child that outlives the
slice enclosing it is clamped to end with it (counted as ``clamped``).  The
begin/end sequence is then derived with vectorized ranks: the end of interval
*i* goes just before the begin of the first interval that starts at or after its
end, innermost first.  Ties at one timestamp thus come out as Perfetto must see
them (ends before the next begin, inner before outer), and the trace processor
keeps file order among equal timestamps.  Only tracks that do not nest already
(a vectorized check) go through the clamping pass, a plain loop.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def _clamp(starts: list[int], ends: list[int]) -> int:
    """Clamp, in place, each interval's end to the end of the interval enclosing it
    (intervals sorted by start, longest first); returns how many were clamped."""
    stack: list[int] = []
    pop, push = stack.pop, stack.append
    clamped = 0
    for k, s in enumerate(starts):
        while stack and stack[-1] <= s:
            pop()
        e = ends[k]
        if stack and e > stack[-1]:
            e = ends[k] = stack[-1]
            clamped += 1
        push(e)
    return clamped


def _codes(keys: list[np.ndarray], n: int) -> tuple[np.ndarray, int]:
    """Dense codes 0..g-1 of the distinct key tuples (hash-based, in order of first appearance)."""
    code, m = np.zeros(n, np.int64), 1
    for k in keys:
        enc = pc.dictionary_encode(pa.array(k))
        code = code * len(enc.dictionary) + enc.indices.to_numpy().astype(np.int64)
        enc = pc.dictionary_encode(pa.array(code))
        code, m = enc.indices.to_numpy().astype(np.int64), len(enc.dictionary)
    return code, m


def _sort_rows(keys: list[np.ndarray], start: np.ndarray, end: np.ndarray, tie: list[np.ndarray]) -> np.ndarray:
    """Row order by (keys, start, end descending, *tie).  One stable sort on a packed
    (group, start) key, then a lexsort of only the rows that tie on it."""
    n = len(start)
    code, groups = _codes(keys, n)
    lo = int(start.min()) if n else 0
    span_bits = (int(start.max()) - lo).bit_length() if n else 0
    if span_bits + max(groups - 1, 1).bit_length() > 62:
        return np.lexsort((*tie[::-1], -end, start, code))
    packed = (code << span_bits) | (start - lo)
    order = np.argsort(packed, kind="stable")
    k = packed[order]
    eq = k[1:] == k[:-1]
    if eq.any():
        first = np.ones(n, bool)
        first[1:] = ~eq
        in_run = np.zeros(n, bool)
        in_run[1:] |= eq
        in_run[:-1] |= eq
        at = np.flatnonzero(in_run)
        run = np.cumsum(first)[at]
        rows = order[at]
        order[at] = rows[np.lexsort((*(t[rows] for t in tie[::-1]), -end[rows], run))]
    return order


def _next_outside(s: np.ndarray, e: np.ndarray, bounds: np.ndarray, groups, nxt: np.ndarray | None = None) -> np.ndarray:
    """Per position (of ``groups``), the first position of its group that starts at or after its end."""
    nxt = np.empty(len(s), np.int64) if nxt is None else nxt
    for g in groups:
        a, b = int(bounds[g]), int(bounds[g + 1])
        nxt[a:b] = np.maximum(a + np.searchsorted(s[a:b], e[a:b], "left"), np.arange(a + 1, b + 1))
    return nxt


def _depths(nxt: np.ndarray) -> np.ndarray:
    """Per position j, how many earlier intervals contain it (i < j < nxt[i])."""
    n = len(nxt)
    diff = np.zeros(n + 1, np.int64)
    diff[1:] = 1
    diff -= np.bincount(nxt, minlength=n + 1)
    return np.cumsum(diff)[:n]


def _not_laminar(e: np.ndarray, depth: np.ndarray, group: np.ndarray) -> np.ndarray:
    """The groups where some interval outlives its parent.  The parent of j (depth d > 0)
    is the last interval before it at depth d - 1; while the intervals before j nest,
    that is exactly the innermost one open when j starts, so the first interval the
    clamping pass would shorten is always caught."""
    n = len(e)
    j = np.flatnonzero(depth > 0)
    if len(j) == 0:
        return np.zeros(0, np.int64)
    key = np.sort(depth * (n + 1) + np.arange(n))
    want = (depth[j] - 1) * (n + 1) + j
    cand = key[np.maximum(np.searchsorted(key, want) - 1, 0)]
    parent = cand % (n + 1)
    ok = (cand // (n + 1) == depth[j] - 1) & (group[parent] == group[j]) & (e[j] <= e[parent])
    return np.unique(group[j[~ok]])


class Nested:
    """Intervals grouped by ``keys`` (one track per group), made laminar per track,
    and the begin/end event sequence that draws them.  Arrays indexed by *position*
    (rank in the sorted order): ``start``, ``end`` (clamped), ``group``; ``order``
    maps positions to input rows; ``ev_pos`` / ``ev_end`` is the event sequence."""

    def __init__(self, keys: list[np.ndarray], start: np.ndarray, end: np.ndarray, tie: list[np.ndarray]) -> None:
        n = len(start)
        end = np.maximum(end, start)
        self.order = order = _sort_rows(keys, start, end, tie)
        self.start = s = start[order]
        self.end = e = end[order]
        change = np.zeros(n, bool)
        if n:
            change[0] = True
            for k in keys:
                ks = k[order]
                change[1:] |= ks[1:] != ks[:-1]
        self.bounds = bounds = np.append(np.flatnonzero(change), n)
        self.group = group = np.cumsum(change) - 1
        self.group_rows = order[bounds[:-1]]          # an input row of each group (to read its keys)
        nxt = _next_outside(s, e, bounds, range(len(bounds) - 1))
        depth = _depths(nxt)
        self.clamped = 0
        bad = _not_laminar(e, depth, group).tolist()
        for g in bad:
            a, b = int(bounds[g]), int(bounds[g + 1])
            ends = e[a:b].tolist()
            self.clamped += _clamp(s[a:b].tolist(), ends)
            e[a:b] = ends
        if bad:
            _next_outside(s, e, bounds, bad, nxt)
            depth = _depths(nxt)
        # Begin of i at slot i; end of i at slot nxt[i], before that slot's begin, innermost first.
        top = int(depth.max()) + 1 if n else 1
        key = np.concatenate([np.arange(n) * (top + 1) + top, nxt * (top + 1) + (top - 1 - depth)])
        ev = np.argsort(key, kind="stable")
        self.ev_end = ev >= n
        self.ev_pos = np.where(self.ev_end, ev - n, ev)

    def positions(self) -> np.ndarray:
        """Position of each input row."""
        inv = np.empty(len(self.order), np.int64)
        inv[self.order] = np.arange(len(self.order))
        return inv
