"""Writing a live session's Parquet parts, several at once.

A flush writes one part per event kind (ops, kernels, API calls, tensors, ...).  The
final flush runs on the program's exit path, where those writes were most of the time
the store cost a short run (ResNet-50, one step on the H200: ~21 ms for ~9 parts).
pyarrow encodes and writes without the GIL, so a few threads write the parts side by side.

The threads are started with the session, not at the flush: at interpreter exit (the
final flush runs from ``atexit``) Python refuses to start threads, and
``concurrent.futures`` refuses new work once its exit hook has run.  These are plain
daemon threads, alive until the interpreter finalizes, after every ``atexit`` hook.
Any write that cannot go to a thread is done in the caller's thread.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
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


class PartWriters:
    """A few daemon threads that write parts; ``write_all`` returns when all are written."""

    def __init__(self, threads: int = 4) -> None:
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = []
        for i in range(threads):
            t = threading.Thread(target=self._work, name=f"pastaprof-write-{i}", daemon=True)
            try:
                t.start()
            except RuntimeError:  # e.g. started at interpreter exit: write inline
                break
            self._threads.append(t)

    def _work(self) -> None:
        try:  # behind the program's threads, like the flush thread
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except (AttributeError, OSError):
            pass
        while True:
            job, done = self._tasks.get()
            try:
                job()
                done(None)
            except BaseException as e:  # noqa: BLE001 -- handed back to the flush
                done(e)

    def write_all(self, jobs: list[Callable[[], None]]) -> None:
        """Run every job (one part's write each), on the threads when there is more than one;
        raise the first failure after all have finished."""
        alive = [t for t in self._threads if t.is_alive()]
        if len(jobs) < 2 or not alive:
            for job in jobs:
                job()
            return
        results: queue.SimpleQueue = queue.SimpleQueue()
        for job in jobs:
            self._tasks.put((job, results.put))
        errors = [e for e in (results.get() for _ in jobs) if e is not None]
        if errors:
            raise errors[0]
