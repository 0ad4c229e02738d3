"""The public verbs: load a run or trace, analyze it, import it into a run store."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path

from pastaprof.errors import InputError, UsageError
from pastaprof.events.schema import KINDS, conform
from pastaprof.importers import iter_ranks, manifest_for
from pastaprof.processor.link import RankLinker
from pastaprof.processor.pipeline import Processor
from pastaprof.store.run import Run, open_run_dir
from pastaprof.store.safe_read import readable_trace
from pastaprof.store.writer import MANIFEST, RunWriter
from pastaprof.tools.base import Finding, Report, Tool
from pastaprof.tools.registry import resolve

Progress = Callable[[int], None]


def example_path() -> Path:
    """The bundled example trace: GPT-2 small, 3 training steps, recorded on an H200."""
    return Path(str(resources.files("pastaprof") / "data" / "example_gpt2_train_3steps.pt.trace.json.gz"))


def is_run_dir(path: Path) -> bool:
    """A directory with an entry named run.json (of whatever type: opening it says what is wrong)."""
    return path.is_dir() and os.path.lexists(path / MANIFEST)


def load(path: str | Path, ranks: Sequence[int] | None = None, progress: Progress | None = None) -> Run:
    """Open a run directory, or import a foreign trace (file or folder of per-rank
    files) into memory.  Returns a :class:`Run`."""
    path = Path(path)
    rank_list = list(ranks) if ranks is not None else None
    if is_run_dir(path):
        return open_run_dir(path, rank_list)
    per_kind: dict[str, list] = {k: [] for k in KINDS}
    metas = []
    link = RankLinker()  # a rank's later capture files: op ids after the earlier files'
    with readable_trace(path) as src:
        for rank, tables, meta in iter_ranks(src, rank_list, progress):
            linked = link(rank, tables)
            for kind in KINDS:
                if kind in linked:
                    per_kind[kind].append(conform(kind, linked[kind]))
            metas.append(meta)
    import pyarrow as pa

    tables = {k: pa.concat_tables(v) for k, v in per_kind.items() if v}
    return Run(manifest_for(path, metas), tables=tables)


def import_trace(path: str | Path, out: str | Path, ranks: Sequence[int] | None = None,
                 force: bool = False, progress: Progress | None = None) -> Path:
    """Import a foreign trace into a run directory at ``out`` (written atomically)."""
    path = Path(path)
    if is_run_dir(path):
        open_run_dir(path)  # a damaged one: say what is wrong with it
        raise InputError(path, "is a pastaprof run directory already (analyze, info and export read it as it is)")
    from pastaprof.store.outputs import check_not_input

    check_not_input(out, (path,))  # --force must not replace the trace being read
    with readable_trace(path) as src, RunWriter(out, overwrite=force) as writer:
        proc = Processor(sink=writer)
        metas = []
        for rank, tables, meta in iter_ranks(src, list(ranks) if ranks is not None else None, progress):
            proc.ingest_rank(rank, tables)
            metas.append(meta)
        if not metas:
            raise InputError(path, "no trace matches the selected ranks")
        return writer.commit(manifest_for(path, metas))


def analyze(source: str | Path | Run, tools: Sequence[str | Tool] | None = None,
            ranks: Sequence[int] | None = None, progress: Progress | None = None,
            out: str | Path | None = None, engine: str = "local", scheduler: str | None = None) -> list[Report]:
    """Run tools over a run directory, a foreign trace or a loaded Run.

    ``tools``: names (see ``pastaprof tools``) or Tool instances; default: the
    built-in set.  ``out``: also store the imported events as a run directory.
    ``engine``: where the per-rank work runs, ``"local"`` (this process) or ``"dask"``
    (a Dask cluster: ``scheduler`` is its address, None starts a local one); see docs/scale.md.
    """
    from pastaprof.engine import check_engine

    check_engine(engine, scheduler)
    instances = _instances(tools)
    rank_list = list(ranks) if ranks is not None else None
    if isinstance(source, Run) or is_run_dir(Path(source)):
        if out is not None:  # nothing to store: the run is stored already
            raise UsageError(f"{out}: the input is a run directory already; -o stores a foreign trace's run")
        if isinstance(source, Run):
            run = source if rank_list is None else source.select_ranks(rank_list)
        else:
            run = open_run_dir(Path(source), rank_list)
        if engine == "dask":
            from pastaprof.engine.dask import analyze_run
        else:
            from pastaprof.engine.local import analyze_run
        reports = analyze_run(run, instances, scheduler=scheduler)  # rank by rank (engine/)
        from pastaprof.live.supervise import capture_losses

        lost = capture_losses(run.manifest)  # dropped / unflushed events: every report says so
        for r in reports if lost else []:
            r.findings.append(Finding(**lost, tool=r.tool))
        return reports
    path = Path(source)
    writer = RunWriter(out) if out is not None else None
    try:
        with readable_trace(path) as src:
            return _analyze_trace(path, src, instances, writer, rank_list, progress, engine, scheduler)
    except BaseException:
        if writer is not None:
            writer.abort()
        raise


def _analyze_trace(path: Path, src: Path, instances: list[Tool], writer: RunWriter | None,
                   rank_list: list[int] | None, progress: Progress | None, engine: str = "local",
                   scheduler: str | None = None) -> list[Report]:
    """analyze() of a foreign trace: ``src`` is read, ``path`` is what the manifest names.
    Only the kinds the tools consume are imported (every kind when storing the run)."""
    if engine == "dask":
        from pastaprof.engine.dask import analyze_trace
    else:
        from pastaprof.engine.local import analyze_trace
    reports, manifest = analyze_trace(path, src, instances, writer, rank_list, progress, scheduler=scheduler)
    if writer is not None:
        writer.commit(manifest)
    return reports


def _instances(tools: Sequence[str | Tool] | None) -> list[Tool]:
    """Tool objects for a mix of names and instances (None: the default set)."""
    if tools is None:
        return [cls() for cls in resolve(None)]
    out: list[Tool] = []
    for t in tools:
        out.extend([t] if isinstance(t, Tool) else [cls() for cls in resolve([t])])
    return out
