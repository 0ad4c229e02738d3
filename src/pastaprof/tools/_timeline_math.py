"""Vectorized interval arithmetic for the timeline tool.

Everything here works on whole NumPy arrays of int64 nanoseconds; the only
Python loops are over distinct kernel *names* (to classify them) -- never over
events.  The core is a *segmented* sweep: rows sorted by (segment, start), where
a segment is a stream, a device or a rank, and for each row the running maximum
end of the earlier rows of its segment ("previous end").  From it:

* gap_i = start_i - prev_end_i (positive part) is the idle time just before row i;
* union length of a segment = span - sum of its positive gaps, where span = last end
  - first start.  This is exactly HTA's ``merge_kernel_intervals`` (sort by start,
  new group where start > running max end, so touching intervals merge).

The running maximum is done for all segments at once with one
``np.maximum.accumulate``: each segment's ends are shifted into its own disjoint,
increasing value range (offset by the spans of the segments before it), so a
segment never sees a larger end of an earlier one.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# HTA's kernel classification (hta/utils/utils.py, 0.5.0), applied in this order.
COMM_RE = re.compile(r"^nccl.*Kernel")                                   # NCCL_KERNEL_RE
MEMORY_RE = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")                    # MEMORY_KERNEL_RE
NON_COMPUTE_RE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")  # NCCL_COMPUTE_KERNEL_RE

# Class codes, in priority order for the non-compute split (lower wins).
COMPUTATION, COMMUNICATION, MEMORY, OTHER = 0, 1, 2, 3
CLASS_NAMES = ("COMPUTATION", "COMMUNICATION", "MEMORY", "OTHER")


def hta_kernel_class(name: str | None) -> int:
    """HTA's ``get_kernel_type`` for one name, as a class code."""
    name = name or ""
    if COMM_RE.match(name):
        return COMMUNICATION
    if MEMORY_RE.match(name):
        return MEMORY
    return OTHER if NON_COMPUTE_RE.match(name) else COMPUTATION


def to_int(col: pa.ChunkedArray | pa.Array, fill: int = -1) -> np.ndarray:
    """An integer Arrow column as int64 NumPy, nulls replaced by ``fill``."""
    if len(col) == 0:
        return np.zeros(0, dtype=np.int64)
    if col.null_count:
        col = pc.fill_null(col, fill)
    return np.asarray(col.to_numpy(), dtype=np.int64)


def name_codes(col: pa.ChunkedArray) -> tuple[np.ndarray, list[str]]:
    """(code per row, distinct names) of a dictionary-encoded name column; null -> '<unknown>'.

    Works on the dictionaries (one Python step per distinct name), never per row."""
    if len(col) == 0:
        return np.zeros(0, dtype=np.int64), []
    if not pa.types.is_dictionary(col.type):
        col = pc.dictionary_encode(col)
    col = col.unify_dictionaries()  # every chunk now shares one dictionary
    values = col.chunk(0).dictionary.to_pylist() + [None]
    null_code = len(values) - 1
    idx = np.concatenate([to_int(c.indices, null_code) if c.null_count == 0 else
                          to_int(pc.if_else(c.is_valid(), c.indices, null_code), null_code) for c in col.chunks])
    # a dictionary may repeat a value: map to distinct names
    names = np.array(["<unknown>" if v is None else v for v in values], dtype=object)
    distinct, remap = np.unique(names, return_inverse=True)
    return remap.reshape(-1)[idx].astype(np.int64), [str(x) for x in distinct]


def pack(*cols: np.ndarray) -> np.ndarray:
    """One int64 key per row, equal iff all columns are equal (mixed radix over value ranges)."""
    n = len(cols[0])
    code = np.zeros(n, dtype=np.int64)
    if n == 0:
        return code
    size = 1
    for c in cols:
        lo, hi = int(c.min()), int(c.max())
        part, card = c - lo, hi - lo + 1
        if card >= 1 << 62:
            uniq, part = np.unique(c, return_inverse=True)
            part, card = part.reshape(-1), len(uniq)
        if size * card >= 1 << 62:  # re-densify before the product overflows
            uniq, code = np.unique(code, return_inverse=True)
            code, size = code.reshape(-1), len(uniq)
        code = code * card + part
        size *= card
    return code


def dense_codes(*cols: np.ndarray) -> tuple[np.ndarray, int]:
    """Dense group ids 0..G-1 for the row-wise combination of integer columns, numbered
    in lexicographic order of the values; O(n) when the packed key range is small."""
    code = pack(*cols)
    n = len(code)
    if n == 0:
        return code, 0
    size = int(code.max()) + 1
    if size <= max(4 * n, 1 << 20):
        present = np.bincount(code, minlength=size) > 0
        remap = np.cumsum(present) - 1
        return remap[code], int(present.sum())
    uniq, inv = np.unique(code, return_inverse=True)
    return inv.reshape(-1).astype(np.int64), len(uniq)


def group_sort(codes: np.ndarray, by_start: np.ndarray) -> np.ndarray:
    """Row order sorted by (code, start), given ``by_start`` = rows sorted by start (stable)."""
    small = codes[by_start]
    small = small.astype(np.uint16) if len(small) and small.max() < (1 << 16) else small
    return by_start[np.argsort(small, kind="stable")]


@dataclass
class Sweep:
    """The segmented sweep of rows sorted by (segment, start); see the module docstring."""

    seg: np.ndarray        # segment id per sorted row
    first: np.ndarray      # per present segment: its index of the first row
    seg_ids: np.ndarray    # per present segment: its id
    first_start: np.ndarray
    last_end: np.ndarray
    is_first: np.ndarray   # per row: first row of its segment
    prev_end: np.ndarray   # per row: running max end of the earlier rows of its segment (own start if first)
    gap: np.ndarray        # per row: max(0, start - prev_end)

    def per_segment(self, values: np.ndarray, n_segments: int) -> np.ndarray:
        """Sum of a per-row int64 quantity per segment id (0 for absent segments)."""
        out = np.zeros(n_segments, dtype=np.int64)
        if len(self.first):
            out[self.seg_ids] = np.add.reduceat(values.astype(np.int64), self.first)
        return out

    def spans(self, n_segments: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(first start, last end, span) per segment id; absent segments: 0, 0, 0."""
        fs = np.zeros(n_segments, dtype=np.int64)
        le = np.zeros(n_segments, dtype=np.int64)
        fs[self.seg_ids] = self.first_start
        le[self.seg_ids] = self.last_end
        return fs, le, le - fs

    def union(self, n_segments: int) -> np.ndarray:
        """Length of the union of each segment's intervals."""
        return self.spans(n_segments)[2] - self.per_segment(self.gap, n_segments)


def sweep(seg: np.ndarray, start: np.ndarray, end: np.ndarray) -> Sweep:
    """Segmented sweep; ``seg``/``start``/``end`` already sorted by (seg, start)."""
    n = len(start)
    end = np.maximum(end, start)  # a negative duration occupies nothing
    if n == 0:
        z = np.zeros(0, dtype=np.int64)
        return Sweep(seg, z, z, z, z, np.zeros(0, dtype=bool), z, z)
    is_first = np.empty(n, dtype=bool)
    is_first[0] = True
    np.not_equal(seg[1:], seg[:-1], out=is_first[1:])
    first = np.flatnonzero(is_first)
    first_start = start[first]
    last_end = np.maximum.reduceat(end, first)
    span = last_end - first_start
    offset = np.zeros(len(first), dtype=np.int64)
    np.cumsum(span[:-1] + 1, out=offset[1:])
    row_seg = np.cumsum(is_first) - 1
    shift = offset[row_seg] - first_start[row_seg]   # maps segment k's times into [offset_k, offset_k + span_k]
    running = np.maximum.accumulate(end + shift) - shift
    prev_end = np.empty(n, dtype=np.int64)
    prev_end[1:] = running[:-1]
    prev_end[first] = start[first]
    gap = np.maximum(start - prev_end, 0)
    return Sweep(seg, first, seg[first], first_start, last_end, is_first, prev_end, gap)


def union_lengths(seg: np.ndarray, start: np.ndarray, end: np.ndarray, n_segments: int) -> np.ndarray:
    """Union length per segment of intervals sorted by (seg, start)."""
    return sweep(seg, start, end).union(n_segments)


def lookup(keys: Sequence[np.ndarray], table_keys: Sequence[np.ndarray], *values: np.ndarray,
           fill: int = -1) -> list[np.ndarray]:
    """For each row of ``keys`` (tuples of int columns), ``values`` at the first row (input
    order) of the table with equal keys, or ``fill``; a key containing -1 never matches."""
    nq = len(keys[0])
    out = [np.full(nq, fill, dtype=np.int64) for _ in values]
    valid_t = np.logical_and.reduce([t >= 0 for t in table_keys]) if len(table_keys[0]) else np.zeros(0, dtype=bool)
    t_idx = np.flatnonzero(valid_t)
    if nq == 0 or len(t_idx) == 0:
        return out
    tcols = [t[t_idx] for t in table_keys]
    # pack both sides with the table's value ranges; query keys outside them cannot match
    inside = np.ones(nq, dtype=bool)
    qk = np.zeros(nq, dtype=np.int64)
    tk = np.zeros(len(t_idx), dtype=np.int64)
    size = 1
    for q, t in zip(keys, tcols):
        lo, hi = int(t.min()), int(t.max())
        card = hi - lo + 1
        if size * card >= 1 << 62:  # too wide to pack: fall back to dense codes of both sides
            both, size = dense_codes(*[np.concatenate([qq, tt]) for qq, tt in zip(keys, tcols)])
            qk, tk, inside = both[:nq], both[nq:], np.ones(nq, dtype=bool)
            break
        inside &= (q >= lo) & (q <= hi)
        qk = qk * card + (q - lo)
        tk = tk * card + (t - lo)
        size *= card
    inside &= np.logical_and.reduce([q >= 0 for q in keys])
    if size <= 4 * (nq + len(tk)) + (1 << 16):
        # direct addressing (correlation ids are dense): no sort; reversed so the first row wins
        slot = np.full(size, -1, dtype=np.int64)
        slot[tk[::-1]] = t_idx[::-1]
        rows = np.full(nq, -1, dtype=np.int64)
        rows[inside] = slot[qk[inside]]
    else:
        order = np.argsort(tk, kind="stable")
        tks = tk[order]
        pos = np.minimum(np.searchsorted(tks, qk), len(tks) - 1)
        hit = inside & (tks[pos] == qk)
        rows = np.where(hit, t_idx[order[pos]], -1)
    hit = rows >= 0
    for o, v in zip(out, values):
        o[hit] = v[rows[hit]]
    return out
