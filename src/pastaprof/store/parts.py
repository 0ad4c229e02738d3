"""Writing a live session's Parquet parts.

A flush writes one part per event kind (ops, kernels, API calls, tensors, ...), in the
flush's own thread.  Writing them side by side from daemon threads (started with the
session: Python starts no threads at exit, where the final flush runs) was tried and
measured: no faster on the H200 (ResNet-50's final flush 21 -> 24 ms, GPT-2's 28 -> 32 ms)
and slower on a 2-core machine (19-24 -> 30-66 ms), the GIL being held for much of a write.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pastaprof.store.writer import dictionary_columns

# Parts are encoded with the C library's malloc, not Arrow's default pool (mimalloc in
# pyarrow 26): mimalloc's fresh pages are transparent huge pages where the kernel allows them
# (madvise mode), and a part's first encode after the pool grew spent ~70% of its time in the
# kernel zeroing 2 MB pages (perf, dev VM: a 6,130-op part 20-26 ms to encode instead of ~3).
POOL = pa.system_memory_pool()

#: A part's file name: its rank, its process and its number (one counter per process, across kinds).
PART_RE = re.compile(r"^rank-(\d+)-pid-(\d+)-part-(\d+)\.parquet$")


def next_part_numbers(run_dir: Path) -> dict[tuple[int, int], int]:
    """(rank, pid) -> the number after the highest part that process wrote, of any kind: a later
    image of the pid (it exec'd) numbers its parts on from there, and compaction tells the images
    apart by where each began (the shard's ``first_part``)."""
    out: dict[tuple[int, int], int] = {}
    for d in run_dir.iterdir():
        if d.is_dir() and not d.is_symlink() and d.name != "shards":
            for p in d.iterdir():
                m = PART_RE.match(p.name)
                if m:
                    key = (int(m[1]), int(m[2]))
                    out[key] = max(out.get(key, 0), int(m[3]) + 1)
    return out


def free_shard(run_dir: Path, rank: int, pid: int) -> Path:
    """Where a process's shard header goes: ``shards/rank-R-pid-P.json``, or, beside the shard of
    an earlier image of the same pid (it exec'd), the first free ``...-exec-N.json``."""
    path = run_dir / "shards" / f"rank-{rank}-pid-{pid}.json"
    n = 0
    while path.exists():
        n += 1
        path = path.with_name(f"rank-{rank}-pid-{pid}-exec-{n}.json")
    return path


@contextlib.contextmanager
def system_memory() -> Iterator[None]:
    """Arrow's default pool set to the system allocator for the block: the final flush, whose
    take, cast and concat allocate too.  At exit no program code runs then; from
    ``pastaprof.stop()`` the program's other threads allocate from the system pool for those
    milliseconds, which is harmless: buffers remember their pool and are freed to it."""
    previous = pa.default_memory_pool()
    pa.set_memory_pool(POOL)
    try:
        yield
    finally:
        pa.set_memory_pool(previous)


def _write(table: pa.Table, where) -> None:
    pq.write_table(table, where, compression="none", use_dictionary=dictionary_columns(table.schema),
                   write_statistics=False, data_page_version="1.0", memory_pool=POOL)


def _sample(typ: pa.DataType, n: int) -> pa.Array:
    """``n`` values of ``typ``, none null, a few distinct (as events have them)."""
    if pa.types.is_dictionary(typ):
        return pa.DictionaryArray.from_arrays(pa.array(np.arange(n, dtype=np.int32) % 64, typ.index_type),
                                              _sample(typ.value_type, 64))
    if pa.types.is_string(typ):
        return pa.array([f"aten::op_{i % 64}" for i in range(n)], typ)
    if pa.types.is_boolean(typ):
        return pa.array(np.arange(n) % 2 == 0)
    if pa.types.is_fixed_size_list(typ):
        return pa.FixedSizeListArray.from_arrays(_sample(typ.value_type, n * typ.list_size), typ.list_size)
    if pa.types.is_list(typ):
        return pa.ListArray.from_arrays(pa.array(np.arange(0, 2 * n + 1, 2, dtype=np.int32)),
                                        _sample(typ.value_type, 2 * n))
    return pa.array(np.arange(n) * 7919, pa.int64()).cast(typ, safe=False)


def warm_up(rows: int = 4096) -> None:
    """Pay Arrow's and Parquet's first-call costs once, early and off the program's path (the
    session's flush thread calls this as it starts): every column type's encoder, on values
    (all-null columns, the first version of this warm-up, skip the value encoders: the first
    real 6,000-op part then still took 20-26 ms to encode instead of ~2 ms, and a short
    program's stop 45-50 ms instead of ~10 ms; dev VM), and the compute kernels behind take,
    filter, the dictionary cast of text, merge and null filling."""
    from pastaprof.events.schema import SCHEMAS, conform, merge

    try:
        order, keep = pa.array(np.arange(rows)[::-1]), pa.array(np.arange(rows) % 3 > 0)
        for sch in SCHEMAS.values():  # every kind's column types, with values
            t = pa.Table.from_arrays([_sample(f.type, rows) for f in sch], schema=sch)
            for _ in range(2):  # twice: the second encode still paid for first touches of memory
                _write(t.take(order).filter(keep), pa.BufferOutputStream(memory_pool=POOL))
        # the flush's other first calls (dev VM: ~1.3 ms at the first flush, often the final one):
        # text cast to dictionaries (conform of the session's range rows: 0.8 ms), merge, the
        # null filling of times and ids
        raw = pa.table({"start_ns": pa.array([2, 1], pa.int64()), "name": pa.array(["a", "b"])})
        merge("range", [conform("range", raw), raw])
        raw["start_ns"].fill_null(-1).to_numpy(zero_copy_only=False)
    except Exception:  # noqa: BLE001 -- only a warm-up
        pass


def write_part(path: Path, table: pa.Table) -> None:
    """One part, written to a hidden name and renamed: readers never see half a file.
    The final flush writes on the program's exit path, so parts are written for speed:
    dictionaries for text only (zstd with dictionaries on every column took ~2x longer),
    uncompressed, data pages v1, no statistics -- on a 100,000-row op part 33 ms -> 21 ms
    with lz4 and v2 pages (dev VM).  Compaction rewrites merged parts with zstd and
    statistics; a run keeps a few parts as written (store/compact.py)."""
    path.parent.mkdir(exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp"
    buf = pa.BufferOutputStream(memory_pool=POOL)  # encoded in memory, then one plain write: Arrow's file output
    _write(table, buf)             # path costs ~0.1 ms more per part (dev VM; 8 parts at exit)
    with open(tmp, "wb") as f:
        f.write(buf.getvalue())
    os.replace(tmp, path)
