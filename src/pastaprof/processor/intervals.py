"""Vectorized interval algebra used to link events.

Host-side events (framework ops, Python frames, annotations) nest: on one
thread they form a *laminar* family (any two intervals are disjoint or one
contains the other).  Linking an API call to its op, or an op to its module
and call site, is then "the innermost interval of a family that contains time
t" -- which this module answers for millions of queries with sorting and
``searchsorted`` instead of a per-event stack walk.

Why it works: give each interval a *level* (how many family intervals are open
just after it starts).  If D(t) intervals are open at time t, the innermost one
is the most recently started interval of level D(t): any later-started interval
of that level would have been nested inside it and so be of a deeper level.
"""

from __future__ import annotations

import numpy as np


def dense_rank(values: np.ndarray) -> np.ndarray:
    """``np.unique(values, return_inverse=True)[1]`` (each value's rank among the distinct
    values) by hashing, not sorting: a trace's pids, tids and their pairs are few distinct
    values over millions of rows, so only the distinct values are sorted."""
    import pyarrow as pa
    import pyarrow.compute as pc

    values = np.asarray(values, dtype=np.int64).reshape(-1)
    if len(values) == 0:
        return np.zeros(0, dtype=np.int64)
    enc = pc.dictionary_encode(pa.array(values))
    uniq = enc.dictionary.to_numpy()
    rank = np.empty(len(uniq), dtype=np.int64)
    rank[np.argsort(uniq)] = np.arange(len(uniq), dtype=np.int64)
    return rank[enc.indices.to_numpy()]


def group_codes(*keys: np.ndarray) -> np.ndarray:
    """Dense int64 codes for the row-wise combination of ``keys`` (e.g. pid, tid): the
    lexicographic ranks that ``np.unique(axis=0)`` would give."""
    if len(keys) == 1:
        return dense_rank(keys[0])
    # Combine the columns' own dense codes (order-preserving) instead of sorting rows.
    code = np.zeros(len(keys[0]), dtype=np.int64)
    for i, k in enumerate(keys):
        inv = dense_rank(k)
        code = code * (int(inv.max(initial=-1)) + 1) + inv
        if i < len(keys) - 1 and int(code.max(initial=0)) >= 1 << 31:  # renumber before it could overflow
            code = dense_rank(code)
    return dense_rank(code)


def stable_group_order(codes: np.ndarray) -> np.ndarray:
    """``np.argsort(codes, kind="stable")`` for non-negative group codes; when they fit 16 bits
    NumPy's stable sort of them is a radix sort (linear), and the order is the same."""
    codes = np.asarray(codes)
    if len(codes) and codes.min() >= 0 and codes.max() < 1 << 15:
        return np.argsort(codes.astype(np.int16), kind="stable")
    return np.argsort(codes, kind="stable")


def in_windows(t: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Which times fall in one of the windows [starts[i], ends[i]) (sorted by start, not
    overlapping): the recording windows of --ranges/--steps, live and for native programs."""
    i = np.searchsorted(starts, t, side="right") - 1
    return (i >= 0) & (t < ends[np.clip(i, 0, None)])


def _outer_first_order(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """``np.lexsort((-end, start))``.  Events come sorted by start (the importer fetches
    them so): then only the runs of equal starts are sorted, the other rows keep their
    place (a stable sort moves neither)."""
    n = len(start)
    if n < 2 or not (start[1:] >= start[:-1]).all():
        return np.lexsort((-end, start))
    order = np.arange(n)
    tie = start[1:] == start[:-1]
    if tie.any():
        in_run = np.zeros(n, dtype=bool)
        in_run[1:] |= tie
        in_run[:-1] |= tie
        idx = np.flatnonzero(in_run)  # runs of equal starts, each contiguous and in start order
        order[idx] = idx[np.lexsort((-end[idx], start[idx]))]
    return order


def _laminar_index(start: np.ndarray, end: np.ndarray):
    """Sort one group's intervals (outer first on ties) and compute their levels."""
    order = _outer_first_order(start, end)
    s = start[order]
    e = end[order]
    e_sorted = np.sort(e)
    n = len(s)
    level = np.arange(1, n + 1) - np.searchsorted(e_sorted, s, side="right")
    by_level = stable_group_order(level) if n and level.min() >= 0 else np.lexsort((np.arange(n), level))
    keys = level[by_level].astype(np.int64) * (n + 1) + by_level
    return order, s, e, e_sorted, level, by_level, keys


def innermost_enclosing(
    fam_group: np.ndarray, fam_start: np.ndarray, fam_end: np.ndarray,
    q_group: np.ndarray, q_time: np.ndarray,
) -> np.ndarray:
    """For each query (group, time): index of the innermost family interval of the
    same group with ``start <= time < end``, or -1.

    Zero-length family intervals contain nothing and are ignored.  Overlapping
    (non-laminar) intervals cannot make the answer wrong -- every answer is checked
    to really contain its query -- only missing (-1).
    """
    fam_group = np.asarray(fam_group, dtype=np.int64)
    fam_start = np.asarray(fam_start, dtype=np.int64)
    fam_end = np.asarray(fam_end, dtype=np.int64)
    q_group = np.asarray(q_group, dtype=np.int64)
    q_time = np.asarray(q_time, dtype=np.int64)
    out = np.full(len(q_time), -1, dtype=np.int64)
    if len(fam_start) == 0 or len(q_time) == 0:
        return out
    valid = fam_end > fam_start
    fam_idx_all = np.nonzero(valid)[0]
    fg = fam_group[fam_idx_all]
    f_order = stable_group_order(fg)
    fg_sorted = fg[f_order]
    q_order = stable_group_order(q_group)
    qg_sorted = q_group[q_order]
    for g in np.unique(qg_sorted):
        lo, hi = np.searchsorted(fg_sorted, [g, g + 1])
        if lo == hi:
            continue
        qlo, qhi = np.searchsorted(qg_sorted, [g, g + 1])
        members = fam_idx_all[f_order[lo:hi]]
        order, s, e, e_sorted, level, by_level, keys = _laminar_index(fam_start[members], fam_end[members])
        n = len(s)
        qi = q_order[qlo:qhi]
        t = q_time[qi]
        started = np.searchsorted(s, t, side="right")
        depth = started - np.searchsorted(e_sorted, t, side="right")
        qkey = depth.astype(np.int64) * (n + 1) + (started - 1)
        pos = np.searchsorted(keys, qkey, side="right") - 1
        posc = np.clip(pos, 0, n - 1)
        cand = by_level[posc]
        ok = (depth > 0) & (pos >= 0) & (level[cand] == depth) & (s[cand] <= t) & (t < e[cand])
        out[qi[ok]] = members[order[cand[ok]]]
    return out


def parents(group: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Parent index (or -1) and depth (0 for roots) of each interval in a family
    that nests within each group.  Ties on start put the longer interval outside."""
    group = np.asarray(group, dtype=np.int64)
    start = np.asarray(start, dtype=np.int64)
    end = np.maximum(np.asarray(end, dtype=np.int64), start)
    n_all = len(start)
    parent = np.full(n_all, -1, dtype=np.int64)
    depth = np.zeros(n_all, dtype=np.int32)
    if n_all == 0:
        return parent, depth
    g_order = stable_group_order(group)
    g_sorted = group[g_order]
    bounds = np.flatnonzero(np.diff(g_sorted)) + 1
    for chunk in np.split(g_order, bounds):
        # Zero-length intervals get a parent but are nobody's parent: they are
        # treated as ending 1 ns after they start only for the level count.
        s0 = start[chunk]
        e0 = np.maximum(end[chunk], s0 + 1)
        order, s, e, e_sorted, level, by_level, keys = _laminar_index(s0, e0)
        n = len(s)
        own_pos = np.arange(n)
        qkey = (level.astype(np.int64) - 1) * (n + 1) + (own_pos - 1)
        pos = np.searchsorted(keys, qkey, side="right") - 1
        posc = np.clip(pos, 0, n - 1)
        cand = by_level[posc]
        ok = (level > 1) & (pos >= 0) & (level[cand] == level - 1) & (s[cand] <= s) & (e <= e[cand]) & (cand != own_pos)
        ok &= (end[chunk][order][cand] > s0[order][cand])  # a zero-length interval parents nothing
        par_sorted = np.where(ok, cand, -1)
        parent[chunk[order]] = np.where(par_sorted >= 0, chunk[order][np.clip(par_sorted, 0, None)], -1)
        depth[chunk[order]] = np.where(ok, level - 1, 0)
    return parent, depth
