"""Constants and column helpers shared by the memory tool's modules."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

GPU_TYPES = ("cuda", "hip")
NEVER = np.iinfo(np.int64).max      # the free position of a block never freed in the trace
SITE = ["rank", "device", "device_type", "op_name", "call_site", "module"]


def i64(col, fill: int = -1) -> np.ndarray:
    """An integer column as int64 NumPy values, nulls as ``fill``."""
    return np.asarray(pc.fill_null(col, fill).to_numpy(zero_copy_only=False), dtype=np.int64)


def as_str(col) -> np.ndarray:
    """A column as a NumPy object array of strings, nulls as ``""``."""
    return np.asarray(pc.fill_null(col.cast(pa.string()), "").to_numpy(zero_copy_only=False), dtype=object)


def str_codes(col) -> np.ndarray:
    """``np.unique(as_str(col), return_inverse=True)[1]`` from a hash encoding: only the distinct
    strings are sorted (a sort of a Python object per row was most of the time on 0.5 M events)."""
    enc = pc.dictionary_encode(pc.fill_null(col.cast(pa.string()), "")).combine_chunks()
    distinct = enc.dictionary.to_pylist()
    rank = np.empty(len(distinct), np.int64)
    rank[sorted(range(len(distinct)), key=distinct.__getitem__)] = np.arange(len(distinct))
    return rank[np.asarray(enc.indices.to_numpy(zero_copy_only=False), dtype=np.int64)]


def matches(col: pa.ChunkedArray, pattern: str) -> pa.ChunkedArray:
    """``pc.match_substring_regex(col, pattern, ignore_case=True)`` on a (dictionary) name
    column: the regex runs on each chunk's distinct names, not on a string per row."""
    out = []
    for ch in col.chunks:
        if pa.types.is_dictionary(ch.type):
            hit = pc.match_substring_regex(ch.dictionary.cast(pa.string()), pattern, ignore_case=True)
            out.append(hit.take(ch.indices))
        else:
            out.append(pc.match_substring_regex(ch.cast(pa.string()), pattern, ignore_case=True))
    return pa.chunked_array(out, pa.bool_())


def take(values: pa.Array | pa.ChunkedArray, idx: np.ndarray, typ: pa.DataType | None = None) -> pa.Array:
    """``values[idx]`` (null where idx < 0) as one array of ``typ``: taken before the cast, so a
    dictionary-encoded op column casts the picked rows only, not a string per op."""
    out = values.take(pa.array(idx, pa.int64(), mask=idx < 0))
    out = out.cast(typ) if typ is not None else out
    return out.combine_chunks() if isinstance(out, pa.ChunkedArray) else out


def fmt(b: float) -> str:
    """Bytes for a finding's message: GiB, MiB, KiB or B."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(b) >= size:
            return f"{b / size:.1f} {unit}"
    return f"{int(b)} B"


def downsample(t: np.ndarray, v: np.ndarray, max_points: int) -> np.ndarray:
    """Indices of <= max_points rows: the max of ``v`` per time bucket, plus the last row."""
    n = len(t)
    if n <= max_points:
        return np.arange(n)
    nb = max(max_points - 1, 1)
    bucket = (t - t[0]) * nb // (t[-1] - t[0] + 1)
    o = np.lexsort((-v, bucket))
    _, first = np.unique(bucket[o], return_index=True)
    return np.union1d(o[first], [n - 1])


def group(t: pa.Table, keys: list[str], sums: list[str], extra: list | None = None,
           names: dict[str, str] | None = None, count: str = "blocks") -> pa.Table:
    """Group ``t`` by ``keys``: sums (same names), a row count and extra aggregations; largest first."""
    aggs = [(c, "sum") for c in sums] + [(keys[0], "count")] + (extra or [])
    g = t.group_by(keys, use_threads=False).aggregate(aggs)
    ren = {f"{c}_sum": c for c in sums} | {f"{keys[0]}_count": count} | (names or {})
    g = g.rename_columns([ren.get(c, c) for c in g.column_names])
    return g.sort_by([(sums[0], "descending")] + [(k, "ascending") for k in keys])
