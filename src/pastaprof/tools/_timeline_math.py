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
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# HTA's kernel classification (hta/utils/utils.py, 0.5.0), tested in this order.
COMM_RE = re.compile(r"^nccl.*Kernel")                                          # NCCL_KERNEL_RE
MEMORY_RE = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")                           # MEMORY_KERNEL_RE
NON_COMPUTE_RE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")  # NCCL_COMPUTE_KERNEL_RE

# Class codes, also the priority order of the non-compute split (lower wins).
COMPUTATION, COMMUNICATION, MEMORY, OTHER = 0, 1, 2, 3
CLASS_NAMES = ("COMPUTATION", "COMMUNICATION", "MEMORY", "OTHER")


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
    """Mixed-radix int64 key of the columns over the given (lo, hi) ranges (caller checks the size)."""
    code = np.zeros(len(cols[0]), dtype=np.int64)
    for c, (lo, hi) in zip(cols, ranges):
        code *= hi - lo + 1
        code += c
        code -= lo
    return code


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
        valid = np.logical_and.reduce([c >= 0 for c in cols]) if len(cols[0]) else np.zeros(0, dtype=bool)
        self.rows = np.flatnonzero(valid)
        self.empty = len(self.rows) == 0
        if self.empty:
            return
        cols = [c[self.rows] for c in cols] if len(self.rows) < len(valid) else list(cols)
        self.ranges = _ranges(cols)
        size = _radix_size(self.ranges)
        self.packed = size < 1 << 62
        self.cols = None if self.packed else cols
        if self.packed and size <= 4 * len(self.rows) + (1 << 20):
            self.slot = np.full(size, -1, dtype=np.int32 if len(valid) < 1 << 31 else np.int64)
            key = _pack(cols, self.ranges)
            self.slot[key[::-1]] = self.rows[::-1]  # reversed: the first row wins
            self.sorted_keys = None
        else:
            self.slot = None
            if self.packed:
                key = _pack(cols, self.ranges)
                order = np.argsort(key, kind="stable")
                self.sorted_keys, self.sorted_rows = key[order], self.rows[order]

    def find(self, *cols: np.ndarray) -> np.ndarray:
        n = len(cols[0])
        out = np.full(n, -1, dtype=np.int64)
        if self.empty or n == 0:
            return out
        if not self.packed:  # keys too wide to pack (rare): dense-code both sides together
            both, _ = dense_codes(*[np.concatenate([q, t]) for q, t in zip(cols, self.cols)])
            qk, tk = both[:n], both[n:]
            order = np.argsort(tk, kind="stable")
            tks = tk[order]
            pos = np.minimum(np.searchsorted(tks, qk), len(tks) - 1)
            ok = (tks[pos] == qk) & np.logical_and.reduce([c >= 0 for c in cols])
            return np.where(ok, self.rows[order[pos]], -1)
        inside = np.ones(n, dtype=bool)
        for c, (lo, hi) in zip(cols, self.ranges):
            inside &= (c >= lo) & (c <= hi)
        q = np.flatnonzero(inside)
        key = _pack([c[q] for c in cols], self.ranges)
        if self.slot is not None:
            out[q] = self.slot[key]
        else:
            pos = np.minimum(np.searchsorted(self.sorted_keys, key), len(self.sorted_keys) - 1)
            out[q] = np.where(self.sorted_keys[pos] == key, self.sorted_rows[pos], -1)
        return out


@dataclass
class Sweep:
    """A segmented sweep of rows sorted by (segment, start); see the module docstring."""

    first: np.ndarray        # per present segment: index of its first row
    seg_ids: np.ndarray      # per present segment: its id
    first_start: np.ndarray  # per present segment
    last_end: np.ndarray     # per present segment
    gap: np.ndarray          # per row: start - previous end (may be negative); 0 on first rows

    def per_segment(self, values: np.ndarray, n_segments: int) -> np.ndarray:
        """Sum of a per-row quantity (int or bool) per segment id; 0 for absent segments."""
        out = np.zeros(n_segments, dtype=np.int64)
        if len(self.first):
            out[self.seg_ids] = np.add.reduceat(values, self.first, dtype=np.int64)
        return out

    def spans(self, n_segments: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(first start, last end, span) per segment id; absent segments: 0, 0, 0."""
        fs = np.zeros(n_segments, dtype=np.int64)
        le = np.zeros(n_segments, dtype=np.int64)
        fs[self.seg_ids] = self.first_start
        le[self.seg_ids] = self.last_end
        return fs, le, le - fs

    def idle(self, n_segments: int) -> np.ndarray:
        """Sum of the positive gaps per segment: its span minus its union."""
        return self.per_segment(np.maximum(self.gap, 0), n_segments)

    def union(self, n_segments: int) -> np.ndarray:
        """Length of the union of each segment's intervals."""
        return self.spans(n_segments)[2] - self.idle(n_segments)


def sweep(seg: np.ndarray, start: np.ndarray, end: np.ndarray) -> Sweep:
    """Segmented sweep of rows already sorted by (seg, start), with end >= start."""
    n = len(start)
    if n == 0:
        z = np.zeros(0, dtype=np.int64)
        return Sweep(z, z, z, z, z)
    is_first = np.empty(n, dtype=bool)
    is_first[0] = True
    np.not_equal(seg[1:], seg[:-1], out=is_first[1:])
    first = np.flatnonzero(is_first)
    del is_first
    first_start = start[first]
    last_end = np.maximum.reduceat(end, first)
    offset = np.zeros(len(first), dtype=np.int64)
    np.cumsum(last_end[:-1] - first_start[:-1] + 1, out=offset[1:])
    # segment k's times t map to t - first_start_k + offset_k, inside [offset_k, offset_k + span_k]
    shift = np.repeat(offset - first_start, np.diff(np.append(first, n)))
    running = np.add(end, shift)
    np.maximum.accumulate(running, out=running)
    gap = np.add(start, shift, out=shift)  # shifted starts ...
    gap[1:] -= running[:-1]                 # ... minus the shifted previous end
    gap[first] = 0
    return Sweep(first, seg[first], first_start, last_end, gap)
