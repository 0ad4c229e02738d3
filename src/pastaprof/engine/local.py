"""The default engine: every rank mapped in this process, one rank at a time.

A foreign trace (a file or a folder of per-rank files) streams rank by rank out of the
importer; a run directory is read one rank's Parquet parts at a time.  Each rank goes
through :func:`~pastaprof.engine.mapcombine.map_rank` and is dropped once its summaries
(and the kinds plain tools keep) are handed to the combiner, so memory is bounded by the
largest rank plus what the tools keep, not by the job.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from pastaprof.engine.mapcombine import Combiner, map_rank, plan
from pastaprof.errors import InputError
from pastaprof.events.schema import KINDS
from pastaprof.importers import iter_ranks, manifest_for
from pastaprof.report.progress import phase
from pastaprof.tools.base import Report, Tool

Progress = Callable[[int], None]
RankParts = tuple[int, list[dict[str, pa.Table]], list[dict[str, Any]]]


def consecutive(items: Iterable[tuple[int, dict[str, pa.Table], dict[str, Any]]]) -> Iterator[RankParts]:
    """Group the importer's (rank, tables, meta) per file into one item per rank: the files of
    a rank come one after another (importers/ranks.py orders them by rank, then time)."""
    rank, parts, metas = None, [], []
    for r, tables, meta in items:
        if r != rank and parts:
            yield rank, parts, metas
            parts, metas = [], []
        rank = r
        parts.append(tables)
        metas.append(meta)
    if parts:
        yield rank, parts, metas


def analyze_trace(path: Path, src: Path, tools: list[Tool], sink: Any = None, ranks: list[int] | None = None,
                  progress: Progress | None = None, scheduler: None = None) -> tuple[list[Report], dict[str, Any]]:
    """Reports (and the run's manifest) of a foreign trace: ``src`` is read, ``path`` is what
    the manifest names.  ``sink``: a RunWriter that stores every kind, or None."""
    spec = plan(tools, store=sink is not None)
    comb = Combiner(tools, spec, sink)
    kinds = None if spec.kinds_import is None else set(spec.kinds_import)
    for rank, parts, metas in consecutive(iter_ranks(src, ranks, progress, kinds)):
        manifest = manifest_for(path, metas)
        comb.start(manifest)
        phase(progress, f"rank {rank} read, mapping it")
        comb.add(map_rank(rank, parts, metas, spec, manifest))
    if not comb.metas:
        raise InputError(path, "no trace matches the selected ranks")
    manifest = manifest_for(path, comb.metas)
    phase(progress, "running the tools")
    return comb.finish(manifest), manifest


def analyze_run(run: Any, tools: list[Tool], scheduler: None = None) -> list[Report]:
    """Reports of a loaded Run (a run directory, or tables in memory), one rank at a time."""
    spec = plan(tools, store=False)
    comb = Combiner(tools, spec)
    comb.start(run.manifest)
    wanted = [k for k in KINDS if k in spec.kinds_import] if spec.kinds_import is not None else list(KINDS)
    for rank, tables in rank_tables(run, wanted):
        comb.add(map_rank(rank, [tables], [], spec, run.manifest, linked=True))
    return comb.finish(run.manifest)


def rank_tables(run: Any, kinds: list[str]) -> Iterator[tuple[int, dict[str, pa.Table]]]:
    """Each selected rank's tables of ``kinds``, rank by rank.  A run directory reads only that
    rank's parts; a Run in memory is split once (stable: rows keep their order)."""
    if run.path is not None:
        from pastaprof.store.run import _rank_of
        from pastaprof.store.safe_read import read_part

        files = {k: run._files(k) for k in kinds}
        present = sorted({_rank_of(f) for fs in files.values() for f in fs})
        for rank in present:
            out = {}
            for k, fs in files.items():
                mine = [read_part(f, k, run.path) for f in fs if _rank_of(f) == rank]
                if mine:
                    out[k] = mine[0] if len(mine) == 1 else pa.concat_tables(mine)
            yield rank, out
        return
    split = {k: _split(run.table(k)) for k in kinds}
    for rank in sorted({r for s in split.values() for r in s}):
        yield rank, {k: s[rank] for k, s in split.items() if rank in s}


def _split(t: pa.Table) -> dict[int, pa.Table]:
    """``t`` per rank: one stable sort, then zero-copy slices."""
    if not t.num_rows:
        return {}
    r = t["rank"].to_numpy()
    order = np.argsort(r, kind="stable")
    t, r = t.take(pa.array(order)), r[order]
    cuts = np.flatnonzero(np.diff(r)) + 1
    starts, ends = np.r_[0, cuts], np.r_[cuts, len(r)]
    return {int(r[s]): t.slice(int(s), int(e - s)) for s, e in zip(starts, ends)}
