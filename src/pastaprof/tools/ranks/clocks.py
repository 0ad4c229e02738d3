"""Clock offsets between ranks, from collectives whose kernels end together.

Why: ranks on different hosts stamp events with different clocks (offsets of several ms are
common), so arrivals can only be compared after alignment.  The kernels of one synchronizing
collective (all-reduce, all-gather, reduce-scatter, all-to-all, barrier) end on every member
within a few microseconds of each other -- the last arrival releases them all -- whatever each
rank's arrival was.  So with ``end[r, m]`` the end of instance m on rank r (its own clock), the
model is ``end[r, m] = T[m] + offset[r] + noise``: solved by alternating medians (robust to the
odd collective that does not end together), the lowest rank's offset fixed at 0.

Error bound of a rank: the largest residual of its ends plus the largest of the reference
rank's (the true offset lies within it as long as members end within the residual spread).
Ranks that share no anchor collective with the reference, directly or through other ranks,
are not aligned (offset 0, bound null).
"""

from __future__ import annotations

import numpy as np

ITERATIONS = 50


def group_median(codes: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """Exact median of ``values`` per code 0..n-1 (NaN where a code has none), vectorized."""
    out = np.full(n, np.nan)
    if len(codes) == 0:
        return out
    order = np.lexsort((values, codes))
    c, v = codes[order], values[order].astype(np.float64)
    counts = np.bincount(c, minlength=n)
    first = np.r_[0, np.cumsum(counts)[:-1]]
    has = counts > 0
    lo = first[has] + (counts[has] - 1) // 2
    hi = first[has] + counts[has] // 2
    out[has] = (v[lo] + v[hi]) / 2
    return out


def _components(rank: np.ndarray, inst: np.ndarray, n_ranks: int) -> np.ndarray:
    """Connected component label (smallest rank index) of each rank index, linked by shared instances."""
    label = np.arange(n_ranks)
    if len(inst) == 0:
        return label
    n_inst = int(inst.max()) + 1
    for _ in range(n_ranks + 1):
        low = np.full(n_inst, n_ranks)
        np.minimum.at(low, inst, label[rank])
        new = label.copy()
        np.minimum.at(new, rank, low[inst])
        if np.array_equal(new, label):
            break
        label = new
    return label


def estimate(rank: np.ndarray, inst: np.ndarray, end: np.ndarray, n_ranks: int) -> tuple[np.ndarray, np.ndarray,
                                                                                        np.ndarray, np.ndarray]:
    """(offset, error bound, aligned flag, anchors used) per rank index 0..n_ranks-1.

    ``rank``: rank index of each anchor row, ``inst``: its instance (dense), ``end``: its end
    on the rank's own clock.  Instances with a single row are ignored."""
    offset = np.zeros(n_ranks)
    bound = np.full(n_ranks, np.nan)
    used = np.zeros(n_ranks, np.int64)
    if len(inst):
        per = np.bincount(inst)
        keep = per[inst] >= 2
        rank, inst, end = rank[keep], inst[keep], end[keep].astype(np.float64)
    aligned = _components(rank, inst, n_ranks) == 0 if len(inst) else np.arange(n_ranks) == 0
    if not len(inst):
        bound[0] = 0.0
        return offset, bound, aligned, used
    _, inst = np.unique(inst, return_inverse=True)
    inst = inst.reshape(-1)
    m = int(inst.max()) + 1
    base = end - end.min()  # small numbers: medians stay exact in float64
    ref_end = np.full(m, np.nan)
    ref_end[inst[rank == 0]] = base[rank == 0]
    ok = ~np.isnan(base - ref_end[inst])
    direct = group_median(rank[ok], (base - ref_end[inst])[ok], n_ranks)
    offset = np.where(np.isnan(direct), 0.0, direct)
    for _ in range(ITERATIONS):
        t = group_median(inst, base - offset[rank], m)
        new = group_median(rank, base - t[inst], n_ranks)
        new = np.where(np.isnan(new), 0.0, new)
        new -= new[0]
        if np.allclose(new, offset, atol=0.5, rtol=0):
            offset = new
            break
        offset = new
    t = group_median(inst, base - offset[rank], m)
    res = np.abs(base - offset[rank] - t[inst])
    worst = np.zeros(n_ranks)
    np.maximum.at(worst, rank, res)
    used = np.bincount(rank, minlength=n_ranks)
    bound = np.where(aligned, worst + worst[0], np.nan)
    bound[0] = 0.0
    offset = np.where(aligned, offset, 0.0)
    return np.rint(offset), np.ceil(bound), aligned, used
