"""One rank's rows of a table, without scanning the whole table once per rank.

Why: tools that loop over ranks and filter ``rank == r`` each time cost ranks x rows: on a job
of 1,024 ranks that, not the events, was most of ``analyze``'s time.  The engines hand tools
their batches rank by rank (engine/mapcombine.py), so a tool's table is sorted by rank: one
pass finds each rank's run of rows, and every rank's rows are then a zero-copy slice.  A table
that is not sorted by rank is filtered as before; either way the rows and their order are those
of ``t.filter(t["rank"] == rank)``.  :func:`rank_rows` is the same for NumPy columns: every
rank's ``np.flatnonzero(ranks == r)`` from one sort.
"""

from __future__ import annotations

import weakref

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: id(table) -> (weak reference to it, {rank: (offset, length)} or None when not sorted by rank
#: or when a rank is null); an entry goes when its table does (tables are not hashable, hence
#: id + weakref).  The null check is cached too: it walks every chunk, and a job's table has
#: a chunk per batch.
_RUNS: dict[int, tuple[weakref.ref, dict[int, tuple[int, int]] | None]] = {}

_NONE = np.zeros(0, np.int64)


def _runs(t: pa.Table) -> dict[int, tuple[int, int]] | None:
    hit = _RUNS.get(id(t))
    if hit is not None and hit[0]() is t:
        return hit[1]
    runs: dict[int, tuple[int, int]] | None = None
    if not t["rank"].null_count:
        r = t["rank"].to_numpy()
        if not np.any(r[1:] < r[:-1]):
            cuts = np.flatnonzero(np.diff(r)) + 1
            starts, ends = np.r_[0, cuts], np.r_[cuts, len(r)]
            runs = {int(r[s]): (int(s), int(e - s)) for s, e in zip(starts, ends)}
    key = id(t)
    _RUNS[key] = (weakref.ref(t, lambda _ref, key=key: _RUNS.pop(key, None)), runs)
    return runs


def rows_of_rank(t: pa.Table, rank: int) -> pa.Table:
    """``t.filter(pc.equal(t["rank"], rank))``, in O(1) per rank once ``t`` is indexed."""
    if t.num_rows == 0:
        return t.filter(pc.equal(t["rank"], rank))
    runs = _runs(t)
    if runs is None:
        return t.filter(pc.equal(t["rank"], rank))
    at = runs.get(int(rank))
    return t.slice(*at) if at is not None else t.slice(0, 0)


class RankRows:
    """``rows[r]`` is ``np.flatnonzero(ranks == r)`` (ascending; empty for a rank not there),
    for every rank at the cost of one stable sort instead of one scan of ``ranks`` per rank."""

    def __init__(self, ranks: np.ndarray) -> None:
        ranks = np.asarray(ranks)
        order = np.argsort(ranks, kind="stable")
        s = ranks[order]
        cuts = np.flatnonzero(s[1:] != s[:-1]) + 1
        starts, ends = np.r_[0, cuts], np.r_[cuts, len(s)]
        self._rows = {s[a].item(): order[a:b] for a, b in zip(starts, ends) if b > a}

    def __getitem__(self, rank: int) -> np.ndarray:
        hit = self._rows.get(rank.item() if isinstance(rank, np.generic) else rank)
        return hit if hit is not None else _NONE

    def ranks(self) -> list:
        """The distinct ranks, ascending (``np.unique(ranks).tolist()``)."""
        return sorted(self._rows)


def rank_rows(ranks: np.ndarray) -> RankRows:
    """Every rank's row indices in ``ranks`` (see :class:`RankRows`)."""
    return RankRows(ranks)


def take_rows(t: pa.Table, rows: np.ndarray) -> pa.Table:
    """``t.take(rows)``; a zero-copy slice when ``rows`` is a run of consecutive rows (one
    rank of a rank-sorted table): ``take`` on a table of thousands of chunks costs the whole
    table each time."""
    if len(rows) and bool(np.all(np.diff(rows) == 1)):
        return t.slice(int(rows[0]), len(rows))
    return t.take(rows)
