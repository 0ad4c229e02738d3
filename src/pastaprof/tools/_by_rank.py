"""One rank's rows of a table, without scanning the whole table once per rank.

Why: tools that loop over ranks and filter ``rank == r`` each time cost ranks x rows: on a job
of 1,024 ranks that, not the events, was most of ``analyze``'s time.  The engines hand tools
their batches rank by rank (engine/mapcombine.py), so a tool's table is sorted by rank: one
pass finds each rank's run of rows, and every rank's rows are then a zero-copy slice.  A table
that is not sorted by rank is filtered as before; either way the rows and their order are those
of ``t.filter(t["rank"] == rank)``.
"""

from __future__ import annotations

import weakref

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: id(table) -> (weak reference to it, {rank: (offset, length)} or None when not sorted by rank);
#: an entry goes when its table does (tables are not hashable, hence id + weakref)
_RUNS: dict[int, tuple[weakref.ref, dict[int, tuple[int, int]] | None]] = {}


def _runs(t: pa.Table) -> dict[int, tuple[int, int]] | None:
    hit = _RUNS.get(id(t))
    if hit is not None and hit[0]() is t:
        return hit[1]
    r = t["rank"].to_numpy()
    runs: dict[int, tuple[int, int]] | None = None
    if not np.any(r[1:] < r[:-1]):
        cuts = np.flatnonzero(np.diff(r)) + 1
        starts, ends = np.r_[0, cuts], np.r_[cuts, len(r)]
        runs = {int(r[s]): (int(s), int(e - s)) for s, e in zip(starts, ends)}
    key = id(t)
    _RUNS[key] = (weakref.ref(t, lambda _ref, key=key: _RUNS.pop(key, None)), runs)
    return runs


def rows_of_rank(t: pa.Table, rank: int) -> pa.Table:
    """``t.filter(pc.equal(t["rank"], rank))``, in O(1) per rank once ``t`` is indexed."""
    if t.num_rows == 0 or t["rank"].null_count:
        return t.filter(pc.equal(t["rank"], rank))
    runs = _runs(t)
    if runs is None:
        return t.filter(pc.equal(t["rank"], rank))
    at = runs.get(int(rank))
    return t.slice(*at) if at is not None else t.slice(0, 0)
