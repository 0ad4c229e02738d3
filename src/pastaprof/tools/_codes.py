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


def radix_key(*cols: np.ndarray) -> np.ndarray | None:
    """One int64 per row that orders (and equals) like the row's tuple of ``cols``: each column
    offset by its minimum, in mixed radix of the columns' value spans; None when the spans'
    product does not fit in 62 bits.  Costs arithmetic only: no hashing, no sort."""
    cols = tuple(np.asarray(c, dtype=np.int64).reshape(-1) for c in cols)
    if len(cols[0]) == 0:
        return np.zeros(0, np.int64)
    lows = [int(c.min()) for c in cols]
    spans = [int(c.max()) - lo + 1 for c, lo in zip(cols, lows, strict=True)]
    if np.prod([float(x) for x in spans]) >= 2.0 ** 62 or any(x >= 1 << 62 for x in spans):
        return None
    key = cols[0] - lows[0]
    for c, lo, span in zip(cols[1:], lows[1:], spans[1:], strict=True):
        key = key * span + (c - lo)
    return key


def dense_codes(*cols: np.ndarray) -> np.ndarray:
    """Dense int64 codes (0..k-1, in lexicographic order of the keys) for the row-wise
    combination of ``cols``; equal to ``processor.intervals.group_codes(*cols)``."""
    key = radix_key(*cols) if len(cols) > 1 else None
    if key is not None:
        return _column_codes(key)[0]
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


def find_keys(keys: np.ndarray, table_keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``processor.link.map_keys(keys, table_keys, values)``: values[j] where table_keys[j] ==
    keys[i], else -1 (keys < 0 never match).  Op ids of an imported rank are its row numbers
    (0, 1, 2, ...): then the position is ``key - table_keys[0]``, found by arithmetic, not a
    binary search per key; other ids are searched."""
    n = len(table_keys)
    if n and int(table_keys[0]) >= 0 and int(table_keys[-1]) - int(table_keys[0]) == n - 1 \
            and bool((np.diff(table_keys) == 1).all()):
        pos = keys - table_keys[0]
        ok = (keys >= 0) & (pos >= 0) & (pos < n)
        out = np.full(len(keys), -1, dtype=np.int64)
        out[ok] = values[pos[ok]]
        return out
    from pastaprof.processor.link import map_keys

    return map_keys(keys, table_keys, values)
