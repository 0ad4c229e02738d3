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


def write_part(path: Path, table: pa.Table) -> None:
    """One part, written to a hidden name and renamed: readers never see half a file.
    lz4, and dictionaries for text only: about 2x faster than zstd with dictionaries on every
    column (compaction leaves it as is)."""
    path.parent.mkdir(exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp"
    pq.write_table(table, tmp, compression="lz4", use_dictionary=dictionary_columns(table.schema))
    os.replace(tmp, path)
