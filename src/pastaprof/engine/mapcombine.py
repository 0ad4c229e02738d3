"""The two halves of an analysis that every engine runs: the map of one rank, and the combine.

Why one module: ``analyze`` in one process (engine/local.py) and on a Dask cluster
(engine/dask.py) must give the same findings and tables, so both call exactly these
functions and differ only in where :func:`map_rank` runs and how its files are read.

* :func:`map_rank` gets one rank's raw importer tables (one dict per trace file of the
  rank), links and normalizes them, runs ``map_rank`` of every
  :class:`~pastaprof.tools.base.PerRankTool`, and keeps only the kinds that the other
  (plain) tools or the run store need.  It returns a small :class:`RankResult`.
* :class:`Combiner` takes the results in rank order: it writes the kept tables to the
  store (when one is being written), hands them to the plain tools as batches, collects
  the per-rank summaries, and in :meth:`Combiner.finish` asks every tool for its Report.

Memory: a PerRankTool holds nothing of a rank once its map is done, so a job of 1,024
ranks costs the summaries plus what the plain tools keep.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from pastaprof.errors import InputError
from pastaprof.events.schema import KINDS, conform, schema
from pastaprof.processor.link import RankLinker
from pastaprof.processor.pipeline import BATCH_ROWS
from pastaprof.tools.base import PerRankTool, Report, RunInfo, Tool

if TYPE_CHECKING:
    from pastaprof.processor.pipeline import Sink

Summaries = dict[str, pa.Table]


@dataclass
class MapSpec:
    """What the map of a rank needs to know, picklable (sent to workers once per task):
    the PerRankTools (by position in the tool list) and which kinds travel back."""

    mapped: dict[int, PerRankTool]
    kinds_back: frozenset[str]
    kinds_import: frozenset[str] | None  # None: every kind (a run store is written)


def plan(tools: list[Tool], store: bool) -> MapSpec:
    """Split ``tools``: PerRankTools map on the rank; the others get the kinds they consume
    (every kind when the events are also ``store``d as a run directory)."""
    mapped = {i: t for i, t in enumerate(tools) if isinstance(t, PerRankTool)}
    plain = [t for t in tools if not isinstance(t, PerRankTool)]
    back = frozenset(KINDS) if store else frozenset(k for t in plain for k in t.consumes)
    wanted = None if store else frozenset(k for t in tools for k in t.consumes)
    return MapSpec(mapped, back, wanted)


@dataclass
class RankResult:
    """One rank, mapped: its import metadata, each PerRankTool's summaries, the kept tables."""

    rank: int
    metas: list[dict[str, Any]]
    summaries: dict[int, Summaries] = field(default_factory=dict)
    tables: dict[str, pa.Table] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tables.values()) + \
            sum(t.nbytes for s in self.summaries.values() for t in s.values())


def linked_tables(parts: list[dict[str, pa.Table]], linked: bool = False) -> dict[str, pa.Table]:
    """One rank's tables, normalized: each file's tables linked on its own (an op's parent and
    a kernel's op are of its own file), then concatenated per kind.  Each later file's op ids
    follow the earlier files' (processor/link.py ``RankLinker``): numbered from 0 each, the
    consecutive captures of one process (a profiler ``schedule``: one file per cycle) gave
    every id of the rank twice.  ``linked``: the tables are a stored rank's, already numbered."""
    per_kind: dict[str, list[pa.Table]] = {}
    link = RankLinker()
    for raw in parts:
        tables = raw if linked else link(0, raw)
        for kind in KINDS:
            if kind in tables:
                per_kind.setdefault(kind, []).append(conform(kind, tables[kind]))
    return {k: v[0] if len(v) == 1 else pa.concat_tables(v) for k, v in per_kind.items()}


def map_rank(rank: int, parts: list[dict[str, pa.Table]], metas: list[dict[str, Any]], spec: MapSpec,
             manifest: dict[str, Any], linked: bool = False) -> RankResult:
    """The map of one rank (see the module docstring).  ``manifest``: what the tools may
    know of the run (``RunInfo``) while they map this rank."""
    tables = linked_tables(parts, linked)
    result = RankResult(rank, metas)
    for i, tool in spec.mapped.items():
        tool.begin(RunInfo(manifest))
        mine = {k: tables.get(k, schema(k).empty_table()) for k in tool.consumes}
        try:
            result.summaries[i] = dict(tool.map_rank(rank, mine))
        except InputError:
            raise
        except Exception as e:  # a tool's bug names the tool, not just a traceback from a worker
            raise RuntimeError(f"tool {tool.name!r}: map_rank of rank {rank} failed: {e}") from e
    result.tables = {k: t for k, t in tables.items() if k in spec.kinds_back}
    return result


class Combiner:
    """Takes :class:`RankResult` objects in rank order and makes the Reports."""

    def __init__(self, tools: list[Tool], spec: MapSpec, sink: Sink | None = None) -> None:
        self.tools = tools
        self.spec = spec
        self.sink = sink
        self.info = RunInfo()
        self.summaries: dict[int, dict[int, Summaries]] = {i: {} for i in spec.mapped}
        self.metas: list[dict[str, Any]] = []
        self._started = False
        self._subscribers: dict[str, list[Tool]] = {}
        for i, tool in enumerate(tools):
            if i not in spec.mapped:
                for kind in tool.consumes:
                    self._subscribers.setdefault(kind, []).append(tool)

    def start(self, manifest: dict[str, Any]) -> None:
        """Begin every tool with what is known of the run so far (the first rank's manifest)."""
        if not self._started:
            self.info = RunInfo(manifest)
            for tool in self.tools:
                tool.begin(self.info)
            self._started = True

    def add(self, result: RankResult) -> None:
        """One rank's result: tables to the store and to the plain tools, summaries kept."""
        if any(result.rank in s for s in self.summaries.values()):
            raise InputError(f"rank {result.rank}", "was mapped twice: its files are not consecutive captures")
        self.metas.extend(result.metas)
        for kind in KINDS:
            t = result.tables.get(kind)
            if t is None:
                continue
            if self.sink is not None:
                self.sink.write(kind, result.rank, t)
            subs = self._subscribers.get(kind, [])
            if subs:
                for batch in t.to_batches(max_chunksize=BATCH_ROWS):
                    for tool in subs:
                        tool.on_batch(kind, batch)
        for i, s in result.summaries.items():
            self.summaries[i][result.rank] = s

    def finish(self, manifest: dict[str, Any]) -> list[Report]:
        """Every tool's Report, in the order the tools were given; ``manifest``: the whole run's."""
        self.start(manifest)
        self.info.manifest.update(manifest)
        reports = []
        for i, tool in enumerate(self.tools):
            if i in self.spec.mapped:
                assert isinstance(tool, PerRankTool)
                reports.append(tool.combine(dict(sorted(self.summaries[i].items()))))
            else:
                reports.append(tool.report())
        return reports
