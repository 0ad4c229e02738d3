"""Dense group codes for the tools' hot paths, without sorting the rows.

``dense_codes(*cols)`` returns what :func:`pastaprof.processor.intervals.group_codes` returns
(the lexicographic rank of each row's key among the distinct keys) but costs a hash pass per column
(Arrow's dictionary encoding) instead of a full ``argsort`` per column: the keys tools group by
(rank, device, pid, tid, stream) have a handful of distinct values among millions of rows, and
only the distinct values are sorted.  Why the same codes matter: the
tools order their output rows (devices, threads) by these codes.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def _column_codes(col: np.ndarray) -> tuple[np.ndarray, int]:
    """(rank of each value among the column's distinct values, number of distinct values):
    Arrow's hash dictionary encoding, then the dictionary's order."""
    col = np.ascontiguousarray(col, dtype=np.int64).reshape(-1)
    if len(col) == 0:
        return np.zeros(0, np.int64), 0
    enc = pc.dictionary_encode(pa.array(col, pa.int64()))
    distinct = enc.dictionary.to_numpy()
    rank = np.empty(len(distinct), np.int64)
    rank[np.argsort(distinct, kind="stable")] = np.arange(len(distinct), dtype=np.int64)
    return rank[enc.indices.to_numpy()], len(distinct)


def dense_codes(*cols: np.ndarray) -> np.ndarray:
    """Dense int64 codes (0..k-1, in lexicographic order of the keys) for the row-wise
    combination of ``cols``; equal to ``processor.intervals.group_codes(*cols)``."""
    code, n = _column_codes(cols[0])
    for col in cols[1:]:
        inv, m = _column_codes(col)
        if n * m >= 1 << 62:  # the combined code could overflow: renumber the prefix first
            code, n = _column_codes(code)
        code = code * m + inv
        n *= m
    if len(cols) > 1:
        code, _ = _column_codes(code)
    return code
