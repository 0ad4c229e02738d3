"""Group codes and key lookups for the tools' hot paths, without sorting the rows.

``dense_codes(*cols)`` returns what :func:`pastaprof.processor.intervals.group_codes` returns
(the lexicographic rank of each row's key among the distinct keys): where the columns' value
spans are small it packs them into one int64 by arithmetic (``radix_key``) and ranks that one
column by hashing (``dense_rank``), instead of ranking and combining column by column.  Why the
same codes matter: the tools order their output rows (devices, threads) by these codes.
"""

from __future__ import annotations

import numpy as np

from pastaprof.processor.intervals import dense_rank, group_codes


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
    return dense_rank(key) if key is not None else group_codes(*cols)


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
