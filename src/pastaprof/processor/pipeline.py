"""The event processor: normalized batches in, fan-out to tools and to the store.

Sources (live handlers, the run store, importers) hand the processor per-rank
tables or batches.  It links them (processor/link.py), tags rank and device,
and delivers each batch to every tool that consumes its kind and to an
optional sink (the run-store writer).  Instruction-level handlers that reduce
accesses on the GPU hand their fixed-size ``access_summary`` batches to
``submit_access_summary`` -- the same fan-out path, no special casing in tools.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import pyarrow as pa

from pastaprof.events.schema import KINDS, conform
from pastaprof.processor.link import RankLinker
from pastaprof.tools.base import Report, RunInfo, Tool

BATCH_ROWS = 1 << 17


class Sink(Protocol):
    def write(self, kind: str, rank: int, table: pa.Table) -> None: ...


class Processor:
    """Fans normalized event batches out to tools and a sink."""

    def __init__(self, tools: Iterable[Tool] = (), sink: Sink | None = None, info: RunInfo | None = None) -> None:
        self.tools = list(tools)
        self.sink = sink
        self.info = info or RunInfo()
        self._subscribers: dict[str, list[Tool]] = {k: [] for k in KINDS}
        for tool in self.tools:
            for kind in tool.consumes:
                self._subscribers.setdefault(kind, []).append(tool)
        self._started = False
        self._link = RankLinker()  # ingest_rank: a rank's files, numbered one after another

    def _start(self) -> None:
        if not self._started:
            for tool in self.tools:
                tool.begin(self.info)
            self._started = True

    def wants(self, kind: str) -> bool:
        """Whether anyone (tool or sink) needs events of ``kind``."""
        return self.sink is not None or bool(self._subscribers.get(kind))

    def ingest_rank(self, rank: int, tables: dict[str, pa.Table], linked: bool = False) -> None:
        """Offline path: a whole rank's tables (raw importer output unless ``linked``), or one
        capture file of it: a rank's files come one after another, each later file's op ids
        following the earlier files' (processor/link.py ``RankLinker``)."""
        if not linked:
            tables = self._link(rank, tables)
        for kind in KINDS:
            if kind in tables and self.wants(kind):
                self.submit(kind, conform(kind, tables[kind]), rank)

    def submit(self, kind: str, table: pa.Table | pa.RecordBatch, rank: int = 0) -> None:
        """Deliver already-normalized events of ``kind`` to tools and the sink."""
        self._start()
        if isinstance(table, pa.RecordBatch):
            table = pa.Table.from_batches([table])
        if self.sink is not None:
            self.sink.write(kind, rank, table)
        subs = self._subscribers.get(kind, [])
        if subs:
            for batch in table.to_batches(max_chunksize=BATCH_ROWS):
                for tool in subs:
                    tool.on_batch(kind, batch)

    def submit_access_summary(self, batch: pa.RecordBatch | pa.Table, rank: int = 0) -> None:
        """Entry point for GPU-side reducers (instruction-level handlers): fixed-size
        per-launch summaries, already reduced on the device."""
        self.submit("access_summary", conform("access_summary", pa.table(batch) if isinstance(batch, pa.RecordBatch) else batch), rank)

    def finish(self) -> list[Report]:
        """Reports of all tools, in the order the tools were given."""
        self._start()
        return [tool.report() for tool in self.tools]
