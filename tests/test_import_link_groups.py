"""The (pid, tid) group codes the linker shares across tables (processor.link._thread_groups)
are those of ``group_codes`` over the concatenated columns, on a real trace and on ids too
wide to pack."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

import pastaprof
from pastaprof.processor.intervals import group_codes
from pastaprof.processor.link import _col, _thread_groups


def _reference(*tables: pa.Table) -> list[np.ndarray]:
    codes = group_codes(np.concatenate([_col(t, "pid") for t in tables]),
                        np.concatenate([_col(t, "tid") for t in tables]))
    bounds = np.cumsum([0, *[t.num_rows for t in tables]])
    return [codes[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def test_thread_groups_equal_group_codes_on_a_real_trace():
    run = pastaprof.load(pastaprof.example_path())
    op, api, frame = run.table("op"), run.table("api"), run.table("frame")
    assert op.num_rows > 1000 and api.num_rows > 1000 and frame.num_rows > 1000
    for tables in [(op,), (api, op), (frame, op), (api, frame, op)]:
        got, ref = _thread_groups(*tables), _reference(*tables)
        assert len(np.unique(np.concatenate(got))) > 1
        for g, r in zip(got, ref):
            assert g.dtype == np.int64 and np.array_equal(g, r)


def test_thread_groups_with_nulls_negative_and_wide_ids():
    a = pa.table({"pid": pa.array([5, None, -3, 5, 2**31 - 1], pa.int64()),
                  "tid": pa.array([7, 1, -(2**31), None, 0], pa.int64())})
    b = pa.table({"pid": pa.array([5, 5, -3], pa.int64()), "tid": pa.array([7, 8, 4], pa.int64())})
    wide = pa.table({"pid": pa.array([2**40, 5], pa.int64()), "tid": pa.array([1, 7], pa.int64())})
    empty = pa.table({"pid": pa.array([], pa.int64()), "tid": pa.array([], pa.int64())})
    for tables in [(a, b), (b, a, empty), (a, wide), (empty,), (a, pa.table({"x": [1, 2]}))]:
        for g, r in zip(_thread_groups(*tables), _reference(*tables)):
            assert np.array_equal(g, r), tables


def test_outer_first_order_is_lexsort_on_imported_and_unsorted_intervals():
    """The linker's interval order (processor.intervals._outer_first_order): that of
    ``np.lexsort((-end, start))``, on the imported ops and frames (sorted by start, with
    runs of equal starts) and on unsorted intervals."""
    from pastaprof.processor.intervals import _outer_first_order

    run = pastaprof.load(pastaprof.example_path())
    rng = np.random.default_rng(3)
    cases = []
    for kind in ("op", "frame"):
        t = run.table(kind)
        s, e = _col(t, "start_ns"), _col(t, "end_ns")
        assert (s[1:] >= s[:-1]).all()
        coarse = s // 100_000, e // 100_000  # still sorted, now with runs of equal starts
        assert (coarse[0][1:] == coarse[0][:-1]).sum() > 1000
        cases += [(s, e), coarse, (s[::-1].copy(), e[::-1].copy())]
    s = np.sort(rng.integers(0, 50, 2000))
    cases += [(s, rng.integers(0, 100, 2000)), (rng.integers(0, 50, 2000), rng.integers(0, 100, 2000)),
              (np.arange(5), np.arange(5)), (np.zeros(0, np.int64), np.zeros(0, np.int64))]
    for s, e in cases:
        assert np.array_equal(_outer_first_order(s, e), np.lexsort((-e, s)))
