"""Vectorized interval arithmetic for the timeline tool.

Everything here works on whole NumPy arrays of int64 nanoseconds; the only
Python loops are over distinct kernel *names* (to classify them) and over the
key columns of a group -- never over events.  The core is a *segmented sweep*:
rows sorted by (segment, start), where a segment is a stream, a device or a
rank, and for each row the running maximum end of the earlier rows of its
segment (the "previous end").  From it:

* gap_i = start_i - prev_end_i is the idle time just before row i (when positive);
* union length of a segment = span - sum of its positive gaps, with span = last end
  - first start.  This is exactly HTA's ``merge_kernel_intervals`` (sort by start,
  new group where start > running max end: touching intervals merge).

The running maximum is one ``np.maximum.accumulate`` for all segments at once:
each segment's times are shifted into their own disjoint, increasing value range
(offset by the spans of the segments before it), so no segment sees a larger
end of an earlier one.  Arrays are reused in place where possible: on a fresh
process, first-touching memory is a large part of the cost at millions of rows.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# HTA's kernel classification (hta/utils/utils.py, 0.5.0), tested in this order.
COMM_RE = re.compile(r"^nccl.*Kernel")                                          # NCCL_KERNEL_RE
MEMORY_RE = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")                           # MEMORY_KERNEL_RE
NON_COMPUTE_RE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")  # NCCL_COMPUTE_KERNEL_RE

# Class codes, also the priority order of the non-compute split (lower wins).
COMPUTATION, COMMUNICATION, MEMORY, OTHER = 0, 1, 2, 3


def hta_kernel_class(name: str | None) -> int:
    """HTA's ``get_kernel_type`` of one name, as a class code."""
    name = name or ""
    if COMM_RE.match(name):
        return COMMUNICATION
    if MEMORY_RE.match(name):
        return MEMORY
    return OTHER if NON_COMPUTE_RE.match(name) else COMPUTATION


def to_np(col: pa.ChunkedArray | pa.Array, fill: int = -1, dtype: type = np.int64) -> np.ndarray:
    """An integer Arrow column as NumPy ``dtype``, nulls replaced by ``fill``."""
    if len(col) == 0:
        return np.zeros(0, dtype=dtype)
    if col.null_count:
        col = pc.fill_null(col, fill)
    return np.asarray(col.to_numpy(), dtype=dtype)


def name_codes(col: pa.ChunkedArray) -> tuple[np.ndarray, list[str]]:
    """(code per row, distinct names) of a dictionary-encoded name column; null -> '<unknown>'.

    Works on the dictionaries (one Python step per distinct name), never per row."""
    if len(col) == 0:
        return np.zeros(0, dtype=np.int32), []
    if not pa.types.is_dictionary(col.type):
        col = pc.dictionary_encode(col)
    col = col.unify_dictionaries()  # every chunk now shares one dictionary
    values = col.chunk(0).dictionary.to_pylist() + [None]
    null_code = len(values) - 1
    idx = np.concatenate([to_np(c.indices, null_code, np.int32) if c.null_count == 0 else
                          to_np(pc.if_else(c.is_valid(), c.indices, null_code), null_code, np.int32)
                          for c in col.chunks])
    # a dictionary may repeat a value: map to distinct names
    names = np.array(["<unknown>" if v is None else v for v in values], dtype=object)
    distinct, remap = np.unique(names, return_inverse=True)
    return remap.reshape(-1).astype(np.int32)[idx], [str(x) for x in distinct]


def _ranges(cols: Sequence[np.ndarray]) -> list[tuple[int, int]]:
    return [(int(c.min()), int(c.max())) for c in cols]


def _pack(cols: Sequence[np.ndarray], ranges: list[tuple[int, int]]) -> np.ndarray:
    """Mixed-radix int64 key of the columns over the given (lo, hi) ranges (caller checks the size);
    constant columns add nothing."""
    code = None
    for c, (lo, hi) in zip(cols, ranges, strict=True):
        if hi == lo:
            continue
        if code is None:
            code = np.subtract(c, lo, dtype=np.int64)
        else:
            code *= hi - lo + 1
            code += c
            code -= lo
    return np.zeros(len(cols[0]), dtype=np.int64) if code is None else code


def _radix_size(ranges: list[tuple[int, int]]) -> int:
    size = 1
    for lo, hi in ranges:
        size *= hi - lo + 1
    return size


def dense_codes(*cols: np.ndarray) -> tuple[np.ndarray, int]:
    """Dense int32 group ids 0..G-1 for the row-wise combination of integer columns,
    numbered in lexicographic order of the values; O(n) when the value ranges are small."""
    n = len(cols[0])
    if n == 0:
        return np.zeros(0, dtype=np.int32), 0
    ranges = _ranges(cols)
    size = _radix_size(ranges)
    if size <= max(4 * n, 1 << 20):
        code = _pack(cols, ranges)
        present = np.bincount(code, minlength=size) > 0
        remap = (np.cumsum(present) - 1).astype(np.int32)
        return remap[code], int(present.sum())
    if len(cols) == 1:
        uniq, inv = np.unique(cols[0], return_inverse=True)
    else:
        uniq, inv = np.unique(np.stack(cols, axis=1), axis=0, return_inverse=True)
    return inv.reshape(-1).astype(np.int32), len(uniq)


def group_sort(codes: np.ndarray, by_start: np.ndarray) -> np.ndarray:
    """Row order sorted by (code, start), given ``by_start`` = rows sorted by start (stable)."""
    small = codes[by_start]
    if len(small) and small.max() < (1 << 16):
        small = small.astype(np.uint16)  # NumPy radix-sorts 16-bit keys
    return by_start[np.argsort(small, kind="stable")]


class KeyIndex:
    """Row lookup on a tuple of integer key columns (e.g. api rank + correlation).

    ``find`` returns the first row (input order) with equal keys, or -1; keys with a
    negative component never match.  Correlation ids are dense, so the index is
    usually a direct-address array (no sort); otherwise a sorted key array."""

    def __init__(self, *cols: np.ndarray) -> None:
        n = len(cols[0])
        self.empty = n == 0
        if self.empty:
            return
        if min(int(c.min()) for c in cols) >= 0:
            rows = None  # all rows valid: row i is i
        else:
            rows = np.flatnonzero(np.logical_and.reduce([c >= 0 for c in cols]))
            self.empty = len(rows) == 0
            if self.empty:
                return
            cols = tuple(c[rows] for c in cols)
        m = n if rows is None else len(rows)
        self.ranges = _ranges(cols)
        size = _radix_size(self.ranges)
        self.packed = size < 1 << 62
        self.cols = None if self.packed else cols
        self.dtype = np.int32 if n < 1 << 31 else np.int64
        self.rows = np.arange(n, dtype=self.dtype) if rows is None else rows.astype(self.dtype)
        self.slot = None
        if not self.packed:
            return
        key = _pack(cols, self.ranges)
        if size <= 4 * m + (1 << 20):  # direct addressing (correlation ids are dense): no sort
            self.slot = np.full(size, -1, dtype=self.dtype)
            self.slot[key[::-1]] = self.rows[::-1]  # reversed: the first row wins
            del self.rows
        else:
            order = np.argsort(key, kind="stable")
            self.sorted_keys, self.sorted_rows = key[order], self.rows[order]

    def find(self, *cols: np.ndarray) -> np.ndarray:
        """Row of each key (int32 when the table has fewer than 2**31 rows), or -1."""
        n = len(cols[0])
        if self.empty or n == 0:
            return np.full(n, -1, dtype=np.int32)
        if not self.packed:  # keys too wide to pack (rare): dense-code both sides together
            both, _ = dense_codes(*[np.concatenate([q, t]) for q, t in zip(cols, self.cols, strict=True)])
            qk, tk = both[:n], both[n:]
            order = np.argsort(tk, kind="stable")
            tks = tk[order]
            pos = np.minimum(np.searchsorted(tks, qk), len(tks) - 1)
            ok = (tks[pos] == qk) & np.logical_and.reduce([c >= 0 for c in cols])
            return np.where(ok, self.rows[order[pos]], -1)
        out = None
        if any(int(c.min()) < lo or int(c.max()) > hi for c, (lo, hi) in zip(cols, self.ranges, strict=True)):
            q = np.flatnonzero(np.logical_and.reduce(
                [(c >= lo) & (c <= hi) for c, (lo, hi) in zip(cols, self.ranges, strict=True)]))
            cols = tuple(c[q] for c in cols)
            out = np.full(n, -1, dtype=self.dtype)
        key = _pack(cols, self.ranges)
        if self.slot is not None:
            found = self.slot[key]
        else:
            pos = np.minimum(np.searchsorted(self.sorted_keys, key), len(self.sorted_keys) - 1)
            found = np.where(self.sorted_keys[pos] == key, self.sorted_rows[pos], -1)
        if out is None:
            return found
        out[q] = found
        return out


_OFFSET_LIMIT = 1 << 62


def _offsets(span1: np.ndarray, first: np.ndarray, n: int) -> tuple[np.ndarray, list[tuple[int, int]] | None]:
    """Per segment, the offset its shifted times start at: the running sum of the earlier
    segments' spans (+1).  When that sum would pass 2**62 (times spread over centuries:
    only hostile input), the offsets restart at 0 in batches of segments whose sum stays
    below it, and the running maximum is then taken per batch: the row ranges returned
    (None: one batch).  Each span must itself be below 2**62 (the importer checks)."""
    offset = np.zeros(len(span1), dtype=np.int64)
    if float(span1.astype(np.float64).sum()) < _OFFSET_LIMIT:
        np.cumsum(span1[:-1], out=offset[1:])
        return offset, None
    batches, lo, total = [], 0, 0
    for k, sp in enumerate(span1.tolist()):  # a loop over segments, never over events
        if total + sp >= _OFFSET_LIMIT and k > lo:
            batches.append((int(first[lo]), int(first[k])))
            lo, total = k, 0
        offset[k] = total
        total += sp
    batches.append((int(first[lo]), n))
    return offset, batches


class Sweep:
    """Rows sorted by (segment, start), prepared for repeated gap and union queries.

    ``seg``/``start``/``end`` must already be sorted by (seg, start), with end >= start.
    Times are stored shifted per segment (see the module docstring) so that one
    ``np.maximum.accumulate`` yields every segment's running end at once.
    """

    def __init__(self, seg: np.ndarray, start: np.ndarray, end: np.ndarray, n_segments: int) -> None:
        n = len(start)
        self.n, self.n_segments = n, n_segments
        if n == 0:
            z = np.zeros(0, dtype=np.int64)
            self.batches = None
            self.first = self.last = self.seg_ids = self.first_start = self.last_end = z
            self.start_sh = self.end_sh = self.shift_last = z
            return
        is_first = np.empty(n, dtype=bool)
        is_first[0] = True
        np.not_equal(seg[1:], seg[:-1], out=is_first[1:])
        self.first = np.flatnonzero(is_first)
        del is_first
        self.last = np.append(self.first[1:], n) - 1
        self.seg_ids = seg[self.first]
        self.first_start = start[self.first]
        self.last_end = np.maximum.reduceat(end, self.first)
        offset, self.batches = _offsets(self.last_end - self.first_start + 1, self.first, n)
        # segment k's time t maps to t - first_start_k + offset_k, inside [offset_k, offset_k + span_k]
        shift_seg = offset - self.first_start
        shift = np.repeat(shift_seg, np.diff(np.append(self.first, n)))
        self.start_sh = start + shift
        np.add(end, shift, out=shift)
        self.end_sh = shift
        self.shift_last = shift_seg

    def _scatter(self, per_present: np.ndarray) -> np.ndarray:
        out = np.zeros(self.n_segments, dtype=np.int64)
        out[self.seg_ids] = per_present
        return out

    def gaps(self, include: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(gap per row, last end per segment id) over the rows in ``include`` (all if None).

        gap = start - running max end of the earlier included rows of the segment (may be
        negative; 0 on a segment's first row).  An excluded row acts as a zero-length
        interval at its start: it changes no union, so the sort order is kept as is."""
        if self.n == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(self.n_segments, dtype=np.int64)
        running = self.end_sh.copy() if include is None else np.where(include, self.end_sh, self.start_sh)
        if self.batches is None:
            np.maximum.accumulate(running, out=running)
        else:  # shifted times restart per batch of segments (see _offsets)
            for lo, hi in self.batches:
                np.maximum.accumulate(running[lo:hi], out=running[lo:hi])
        last_end = running[self.last] - self.shift_last
        gap = np.empty(self.n, dtype=np.int64)
        gap[0] = 0
        np.subtract(self.start_sh[1:], running[:-1], out=gap[1:])
        gap[self.first] = 0
        return gap, self._scatter(last_end)

    def per_segment(self, values: np.ndarray) -> np.ndarray:
        """Sum of a per-row quantity (int or bool) per segment id; 0 for absent segments."""
        if self.n == 0:
            return np.zeros(self.n_segments, dtype=np.int64)
        return self._scatter(np.add.reduceat(values, self.first, dtype=np.int64))

    def spans(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(first start, last end, span) per segment id; absent segments: 0, 0, 0."""
        fs, le = self._scatter(self.first_start), self._scatter(self.last_end)
        return fs, le, le - fs

    def union(self, include: np.ndarray | None = None) -> np.ndarray:
        """Length of the union of each segment's (included) intervals: HTA's merged time."""
        gap, last_end = self.gaps(include)
        np.maximum(gap, 0, out=gap)
        # (a segment with no included row gets last start - first start - the gaps between starts = 0)
        return last_end - self.spans()[0] - self.per_segment(gap)


def fmt_ns(ns: float) -> str:
    """A duration for a finding's title, in the unit that keeps it readable."""
    ns = float(ns)
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if abs(ns) >= scale:
            return f"{ns / scale:.1f} {unit}"
    return f"{ns:.0f} ns"


def str_col(col: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    return pc.fill_null(col.cast(pa.string()), "")


def merged(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Disjoint sorted intervals [a, b) of the union of intervals sorted by start (touching ones merge,
    as the timeline tool's sweep), and the row that opens each one."""
    if len(start) == 0:
        z = np.zeros(0, np.int64)
        return z, z, z
    gap, last = Sweep(np.zeros(len(start), np.int32), start, end, 1).gaps()
    opens = np.flatnonzero(gap > 0)
    a = np.concatenate([start[:1], start[opens]])
    b = np.concatenate([start[opens] - gap[opens], last])
    return a, b, np.concatenate([[0], opens])


def overlap(a: np.ndarray, b: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Length of disjoint sorted intervals [a, b) inside each window [lo, hi), vectorized."""
    if len(a) == 0:
        return np.zeros(len(lo), np.int64)
    before = np.concatenate([[0], np.cumsum(b - a)[:-1]])

    def covered(t: np.ndarray) -> np.ndarray:  # union length in (-inf, t)
        j = np.searchsorted(a, t, side="right") - 1
        jc = np.maximum(j, 0)
        return np.where(j >= 0, before[jc] + np.clip(np.minimum(t, b[jc]) - a[jc], 0, None), 0)

    return covered(hi) - covered(lo)


def window_of(t: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Index of the window [lo, hi) containing each time, or -1 (windows sorted, disjoint)."""
    if len(lo) == 0:
        return np.full(len(t), -1, np.int64)
    k = np.searchsorted(lo, t, side="right") - 1
    kc = np.maximum(k, 0)
    return np.where((k >= 0) & (t < hi[kc]), k, -1)
