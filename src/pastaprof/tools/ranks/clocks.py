"""Clock offsets between ranks, from collectives whose kernels end together.

Why: ranks on different hosts stamp events with different clocks (offsets of several ms are
common), so arrivals can only be compared after alignment.  The kernels of one synchronizing
collective (all-reduce, all-gather, reduce-scatter, all-to-all, barrier) end on every member
within a few microseconds of each other -- the last arrival releases them all -- whatever each
rank's arrival was.  So with ``end[r, m]`` the end of instance m on rank r (its own clock), the
model is ``end[r, m] = T[m] + offset[r] + noise``, solved by least squares (the lowest rank's
offset fixed at 0), refitted without the rows that do not end with the others (outliers).

Error bound of a rank: the largest residual of its ends plus the largest of the reference
rank's: the true offset lies within it as long as the members of a collective end within that
spread of each other.  A constant bias (one rank's kernels always ending later by the same
amount) cannot be told from an offset, by this or any method that only sees the trace.
Ranks that share no anchor collective with the reference, directly or through other ranks,
are not aligned (offset 0, bound null).
"""

from __future__ import annotations

import numpy as np

OUTLIER_PASSES = 2
OUTLIER_MADS = 5.0
OUTLIER_FLOOR_NS = 2_000


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


def _solve(rank: np.ndarray, inst: np.ndarray, end: np.ndarray, n: int, m: int) -> np.ndarray:
    """Least-squares offsets (offset[0] = 0) of ``end[row] = T[inst] + offset[rank] + noise``.

    T eliminated, the normal equations are a graph Laplacian system ``L o = b`` (ranks linked by
    shared instances), solved by conjugate gradients with matrix-free products (two bincounts
    per iteration: no n x n matrix, fine for thousands of ranks); the gauge o[0] = 0 is added
    as a penalty row, which makes the system positive definite on a connected component."""
    k = np.bincount(inst, minlength=m).astype(np.float64)
    k[k == 0] = 1.0
    cnt = np.bincount(rank, minlength=n).astype(np.float64)
    ebar = np.bincount(inst, weights=end, minlength=m) / k
    b = np.bincount(rank, weights=end - ebar[inst], minlength=n)

    def lap(o: np.ndarray) -> np.ndarray:
        s = np.bincount(inst, weights=o[rank], minlength=m) / k
        out = cnt * o - np.bincount(rank, weights=s[inst], minlength=n)
        out[0] += o[0]
        return out

    x = np.zeros(n)
    r = b - lap(x)
    p = r.copy()
    rr = float(r @ r)
    for _ in range(4 * n + 20):
        if rr <= 1e-6:
            break
        lp = lap(p)
        alpha = rr / float(p @ lp)
        x += alpha * p
        r -= alpha * lp
        new = float(r @ r)
        p = r + (new / rr) * p
        rr = new
    return x - x[0]


def estimate(rank: np.ndarray, inst: np.ndarray, end: np.ndarray, n_ranks: int) -> tuple[np.ndarray, np.ndarray,
                                                                                        np.ndarray, np.ndarray]:
    """(offset, error bound, aligned flag, anchors used) per rank index 0..n_ranks-1.

    ``rank``: rank index of each anchor row, ``inst``: its instance, ``end``: its end on the
    rank's own clock.  Instances with a single row are ignored; so are rows that do not end with
    the others (residual beyond ``OUTLIER_MADS`` robust deviations and ``OUTLIER_FLOOR_NS``),
    after a first fit."""
    offset = np.zeros(n_ranks)
    bound = np.full(n_ranks, np.nan)
    used = np.zeros(n_ranks, np.int64)
    keep = np.ones(len(inst), bool)
    for _ in range(OUTLIER_PASSES + 1):
        per = np.bincount(inst[keep], minlength=int(inst.max()) + 1 if len(inst) else 0)
        ok = keep & (per[inst] >= 2) if len(inst) else keep
        label = _components(rank[ok], inst[ok], n_ranks) if ok.any() else np.arange(n_ranks)
        aligned = label == 0
        ok &= aligned[rank] if len(rank) else ok
        if not ok.any():
            bound[0] = 0.0
            return offset, bound, np.arange(n_ranks) == 0, used
        r, e = rank[ok], end[ok].astype(np.float64)
        _, i = np.unique(inst[ok], return_inverse=True)
        i = i.reshape(-1)
        m = int(i.max()) + 1
        e = e - e.min()  # small numbers: float64 stays exact to the ns
        offset = _solve(r, i, e, n_ranks, m)
        t = np.bincount(i, weights=e - offset[r], minlength=m) / np.maximum(np.bincount(i, minlength=m), 1)
        res = e - offset[r] - t[i]
        mad = 1.4826 * float(np.median(np.abs(res)))
        bad = np.abs(res) > max(OUTLIER_MADS * mad, OUTLIER_FLOOR_NS)
        if not bad.any():
            break
        rows = np.flatnonzero(ok)
        keep[rows[bad]] = False
    worst = np.zeros(n_ranks)
    np.maximum.at(worst, r, np.abs(res))
    used = np.bincount(r, minlength=n_ranks)
    bound = np.where(aligned, worst + worst[0], np.nan)
    bound[0] = 0.0
    offset = np.where(aligned, offset, 0.0)
    return np.rint(offset), np.ceil(bound), aligned, used
