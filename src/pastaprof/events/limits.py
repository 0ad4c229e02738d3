"""The bounds every event table is held to, wherever it enters: an importer's tables
(``importers.iter_ranks``, the Kineto import), a stored part (``store.safe_read.read_part``)
and a run's DuckDB views (``store.run``).

Times and byte counts that a file can hold but no tool's int64 arithmetic takes (-2**63 beside
today, durations or sizes whose sums pass int64) are refused in one line naming the input.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from pastaprof.errors import InputError

TIME_RANGE_LIMIT = 1 << 62  # ns (146 years): any span of real events is far below; int64 arithmetic stays exact


def check_time_range(tables: dict[str, pa.Table], path: Path) -> None:
    """Refuse events spread over more than ``TIME_RANGE_LIMIT``, or whose durations add up to
    more: their spans, gaps and sums would not fit int64 nanoseconds (the tools' arithmetic),
    so no number would be right."""
    import pyarrow.compute as pc

    lo, hi, total = None, None, 0.0
    for t in tables.values():
        if t.num_rows and "start_ns" in t.column_names:
            a, b = pc.min(t["start_ns"]).as_py(), pc.max(t["end_ns"]).as_py()
            lo = a if lo is None or (a is not None and a < lo) else lo
            hi = b if hi is None or (b is not None and b > hi) else hi
            d = pc.subtract(pc.cast(t["end_ns"], pa.float64(), safe=False), pc.cast(t["start_ns"], pa.float64(), safe=False))
            total += pc.sum(pc.abs(d)).as_py() or 0.0
    check_span(lo, hi, path, total)


def check_sizes(tables: dict[str, pa.Table], path: Path) -> None:
    """Refuse byte counts (copies, memsets, allocations) that add up to more than 2**62 per kind:
    the tools' totals would not fit int64."""
    import pyarrow.compute as pc

    for kind, t in tables.items():
        if t.num_rows and "bytes" in t.column_names and pa.types.is_integer(t.schema.field("bytes").type):
            total = pc.sum(pc.abs(pc.cast(t["bytes"], pa.float64(), safe=False))).as_py() or 0.0
            if total >= 1 << 62:
                raise InputError(path, f"{kind} sizes add up to {total / 2**60:.3g} EiB: not the sizes of one trace")


def check_span(lo: int | None, hi: int | None, path: Path, total: float | None = None) -> None:
    """Refuse a first start ``lo`` and last end ``hi`` further apart than ``TIME_RANGE_LIMIT``,
    or durations whose sum (``total``, ns) is that large."""
    if lo is not None and hi is not None and hi - lo >= TIME_RANGE_LIMIT:
        raise InputError(path, f"event times span {(hi - lo) / 86400e9:.3g} days ({lo} to {hi} ns): "
                               "not the timestamps of one trace")
    if total is not None and total >= TIME_RANGE_LIMIT:
        raise InputError(path, f"event durations add up to {total / 86400e9:.3g} days: not the timestamps of one "
                               "trace")
