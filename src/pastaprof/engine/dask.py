"""``analyze --engine dask``: the per-rank map on the workers of a Dask distributed cluster.

The job's ranks are cut into contiguous chunks, a few per worker.  Each task reads its
chunk's ranks with the same importer loop as the local engine (``iter_ranks`` with the
chunk as its rank selection) and runs :func:`~pastaprof.engine.mapcombine.map_rank` on
each: what comes back is each rank's PerRankTool summaries plus the tables the plain
tools consume.  The client combines the results in rank order with the same
:class:`~pastaprof.engine.mapcombine.Combiner` as the local engine, so both engines give
the same findings and tables.

Workers read the shards themselves: the trace folder (or run directory) must be at the
same path on every worker (a shared filesystem), see docs/scale.md.  Without
``scheduler`` a ``distributed.LocalCluster`` of worker processes is started and closed.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pastaprof.engine.local import consecutive, rank_tables
from pastaprof.engine.mapcombine import Combiner, MapSpec, RankResult, map_rank, plan
from pastaprof.errors import InputError, OutputError, PastaprofError, UsageError
from pastaprof.events.schema import KINDS
from pastaprof.importers import iter_ranks, manifest_for
from pastaprof.tools.base import Report, Tool

#: Tasks per worker: enough that a slow chunk does not idle the others, few enough that
#: every task's scan of the folder (reading each file's first bytes) stays cheap.
CHUNKS_PER_WORKER = 4
LOCAL_WORKERS_MAX = 8


@dataclass
class _Failure:
    """A PastaprofError raised on a worker, carried back as data (its class does not
    unpickle from ``args``), re-raised on the client as the same one line."""

    cls: str
    path: str | None
    problem: str

    @classmethod
    def of(cls, e: PastaprofError) -> _Failure:
        return cls(type(e).__name__, getattr(e, "path", None), getattr(e, "problem", str(e)))

    def reraise(self) -> None:
        if self.cls == "InputError" and self.path is not None:
            raise InputError(self.path, self.problem)
        if self.cls == "OutputError" and self.path is not None:
            raise OutputError(self.path, self.problem)
        raise UsageError(self.problem)


def _map_trace_chunk(src: str, name: str, ranks: list[int] | None, spec: MapSpec) -> Any:
    """Worker task: the ranks ``ranks`` of the trace at ``src`` (None: all), mapped."""
    notes: list[str] = []
    try:
        kinds = None if spec.kinds_import is None else set(spec.kinds_import)
        out = []
        for rank, parts, metas in consecutive(iter_ranks(Path(src), ranks, None, kinds, note=notes.append)):
            out.append(map_rank(rank, parts, metas, spec, manifest_for(Path(name), metas)))
        return out, notes
    except PastaprofError as e:
        return _Failure.of(e)


def _map_run_chunk(path: str, ranks: list[int], spec: MapSpec) -> Any:
    """Worker task: the ranks ``ranks`` of the run directory at ``path``, mapped."""
    from pastaprof.store.run import open_run_dir

    try:
        run = open_run_dir(Path(path), ranks)
        wanted = [k for k in KINDS if spec.kinds_import is None or k in spec.kinds_import]
        return [map_rank(rank, [tables], [], spec, run.manifest, linked=True)
                for rank, tables in rank_tables(run, wanted)], []
    except PastaprofError as e:
        return _Failure.of(e)


@contextmanager
def client_for(scheduler: str | None) -> Iterator[Any]:
    """A distributed Client: of the cluster at ``scheduler``, else of a LocalCluster of worker
    processes (at least 2, one thread each: the map is CPU-bound Python and Arrow)."""
    import logging

    from distributed import Client, LocalCluster

    if scheduler is not None:
        try:
            client = Client(scheduler, timeout="5s")
        except (OSError, TimeoutError, ValueError) as e:
            raise UsageError(f"cannot reach the Dask scheduler at {scheduler}: {e}") from None
        with client:
            yield client
        return
    n = max(2, min(os.cpu_count() or 2, LOCAL_WORKERS_MAX))
    try:
        cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None,
                               silence_logs=logging.CRITICAL)
    except (RuntimeError, OSError) as e:  # e.g. a script without a __main__ guard (workers re-import it)
        raise UsageError(f"cannot start a local Dask cluster ({e}); from a Python script, call analyze() "
                         "under `if __name__ == \"__main__\":`, or pass --scheduler") from None
    with cluster, Client(cluster) as client:
        yield client


def _chunks(ranks: list[int], n: int) -> list[list[int]]:
    """``ranks`` in ``n`` contiguous chunks of near-equal size (none empty)."""
    n = max(1, min(n, len(ranks)))
    size, extra = divmod(len(ranks), n)
    out, i = [], 0
    for c in range(n):
        j = i + size + (c < extra)
        out.append(ranks[i:j])
        i = j
    return out


def _planned_ranks(src: Path, ranks: list[int] | None) -> list[int] | None:
    """The ranks a folder of Kineto traces holds, from each file's first bytes (the plan the
    importer makes itself); None when that cannot be told up front (one file, another
    format, ranks known only once a file is read): then one task reads everything."""
    if not src.is_dir():
        return None
    from pastaprof.importers import scan
    from pastaprof.importers.ranks import plan_ranks

    try:
        files, sniffs, _skipped = scan(src)
        entries, _notes = plan_ranks(files, sniffs)
    except PastaprofError:
        return None  # the task's import says what is wrong, or another importer reads it
    if not all(s.decided for s in sniffs):
        return None
    found = sorted({e.rank for e in entries})
    return [r for r in found if ranks is None or r in ranks]


def _gather(client: Any, futures: list[Any], comb: Combiner, first: Callable[[RankResult], None]) -> list[str]:
    """Results in task order (tasks are in rank order) into ``comb``; the notes, each once."""
    notes: list[str] = []
    for fut in futures:
        got = fut.result()
        fut.release()
        if isinstance(got, _Failure):
            for f in futures:
                f.cancel()
            got.reraise()
        results, task_notes = got
        notes.extend(n for n in task_notes if n not in notes)
        for r in results:
            first(r)
            comb.add(r)
    return notes


def analyze_trace(path: Path, src: Path, tools: list[Tool], sink: Any = None, ranks: list[int] | None = None,
                  progress: Callable[[int], None] | None = None,
                  scheduler: str | None = None) -> tuple[list[Report], dict[str, Any]]:
    """engine/local.analyze_trace, with the map on a Dask cluster."""
    spec = plan(tools, store=sink is not None)
    comb = Combiner(tools, spec, sink)
    planned = _planned_ranks(src, ranks)
    with client_for(scheduler) as client:
        workers = max(1, len(client.scheduler_info().get("workers", {})))
        chunks: list[list[int] | None] = [ranks] if planned is None else _chunks(planned, CHUNKS_PER_WORKER * workers)
        futures = [client.submit(_map_trace_chunk, str(src.resolve()), str(path), c, spec, pure=False)
                   for c in chunks if c is None or c]
        notes = _gather(client, futures, comb, lambda r: comb.start(manifest_for(path, r.metas)))
    if not comb.metas:
        raise InputError(path, "no trace matches the selected ranks")
    plan_of = next((m.get("plan") for m in comb.metas if isinstance(m.get("plan"), dict)), None)
    if plan_of is not None:  # every task's notes, as the one importer loop of the local engine keeps them
        plan_of["notes"] = notes
    for line in notes:
        _note(line)
    manifest = manifest_for(path, comb.metas)
    return comb.finish(manifest), manifest


def analyze_run(run: Any, tools: list[Tool], scheduler: str | None = None) -> list[Report]:
    """engine/local.analyze_run, with the map on a Dask cluster (a run directory only)."""
    if run.path is None:
        raise UsageError("--engine dask reads a trace or a run directory, not a Run in memory")
    spec = plan(tools, store=False)
    comb = Combiner(tools, spec)
    comb.start(run.manifest)
    with client_for(scheduler) as client:
        workers = max(1, len(client.scheduler_info().get("workers", {})))
        futures = [client.submit(_map_run_chunk, str(Path(run.path).resolve()), c, spec, pure=False)
                   for c in _chunks(list(run.ranks), CHUNKS_PER_WORKER * workers) if c]
        _gather(client, futures, comb, lambda r: None)
    return comb.finish(run.manifest)


def _note(msg: str) -> None:
    try:
        sys.stderr.write(f"pastaprof: note: {msg}\n")
    except (AttributeError, OSError, ValueError):
        pass
