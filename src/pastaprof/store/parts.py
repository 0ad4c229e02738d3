"""Writing a live session's Parquet parts.

A flush writes one part per event kind (ops, kernels, API calls, tensors, ...), in the
flush's own thread.  Writing them side by side from daemon threads (started with the
session: Python starts no threads at exit, where the final flush runs) was tried and
measured: no faster on the H200 (ResNet-50's final flush 21 -> 24 ms, GPT-2's 28 -> 32 ms)
and slower on a 2-core machine (19-24 -> 30-66 ms), the GIL being held for much of a write.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pastaprof.store.writer import dictionary_columns


def _write(table: pa.Table, where) -> None:
    pq.write_table(table, where, compression="none", use_dictionary=dictionary_columns(table.schema),
                   write_statistics=False, data_page_version="1.0")


def warm_up() -> None:
    """Pay Arrow's and Parquet's first-call costs (each column type's encoder, the compute
    kernels behind take) once, early and off the program's path (the session's flush thread
    calls this as it starts): paid by the final flush at exit they were ~25 ms of a short
    run's store write (dev VM: a 7,000-row part's take 6 ms -> 0.1 ms; an op part's write
    27 ms -> 5 ms)."""
    from pastaprof.events.schema import SCHEMAS, conform, merge

    try:
        for sch in SCHEMAS.values():  # every kind's column types
            t = pa.Table.from_arrays([pa.nulls(2, f.type) for f in sch], names=sch.names)
            _write(t.take(pa.array([1, 0])).filter(pa.array([True, False])), pa.BufferOutputStream())
        # the flush's other first calls (dev VM: ~1.3 ms at the first flush, often the final one):
        # text cast to dictionaries (conform of the session's range rows: 0.8 ms), merge, the
        # null filling of times and ids, a filter of the gate
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
    buf = pa.BufferOutputStream()  # encoded in memory, then one plain write: Arrow's file output
    _write(table, buf)             # path costs ~0.1 ms more per part (dev VM; 8 parts at exit)
    with open(tmp, "wb") as f:
        f.write(buf.getvalue())
    os.replace(tmp, path)
