"""Importers turn foreign traces into pastaprof events, one rank at a time.

Each format is one importer (importers/base.py), registered in the
``pastaprof.importers`` entry-point group (importers/registry.py).  A file or a
folder goes to the importer whose ``sniff`` claims its content; this module is
the one door the rest of pastaprof uses: :func:`iter_ranks` and
:func:`manifest_for`.  The raw tables an importer yields are checked here
against the contract of docs/events.md (known kinds, Arrow tables with
``start_ns``/``end_ns``), so a plugin's mistake names the plugin.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from pastaprof.errors import InputError, PastaprofError
from pastaprof.importers.kineto_importer import TRACE_SUFFIXES, scan
from pastaprof.importers.ranks import rank_from_name

__all__ = ["TRACE_SUFFIXES", "iter_ranks", "manifest_for", "rank_from_name", "scan", "trace_files"]

DEFAULT_IMPORTER = "kineto"


def trace_files(path: Path) -> list[Path]:
    """The Kineto trace files behind ``path`` (a file, or a folder of per-rank files)."""
    return scan(path)[0]


class ImporterBug(PastaprofError):
    """An importer broke the raw-table contract (docs/events.md): a plugin bug, named in one line."""


def _check_tables(importer: str, rank: Any, tables: Any) -> None:
    from pastaprof.events.schema import KINDS

    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < 2**31:
        raise ImporterBug(f"importer {importer!r} yielded rank {rank!r}: ranks are integers 0..2^31-1")
    if not isinstance(tables, dict):
        raise ImporterBug(f"importer {importer!r} yielded {type(tables).__name__}, not a dict of kind -> table")
    for kind, t in tables.items():
        if kind not in KINDS:
            raise ImporterBug(f"importer {importer!r} yielded unknown kind {kind!r} (known: {', '.join(KINDS)})")
        if not isinstance(t, pa.Table):
            raise ImporterBug(f"importer {importer!r}: {kind} is {type(t).__name__}, not a pyarrow.Table")
        if t.num_rows and not {"start_ns", "end_ns"} <= set(t.column_names):
            raise ImporterBug(f"importer {importer!r}: {kind} lacks start_ns/end_ns")


def _check_times(tables: dict[str, pa.Table], path: Path) -> None:
    """Every importer's events (not only Kineto's) must fit the tools' int64 arithmetic: times
    spread over more than 2**62 ns, or byte counts adding up to that, are one error line, not an
    overflow inside a tool."""
    from pastaprof.events.limits import check_sizes, check_time_range

    check_sizes(tables, path)
    timed = {k: t for k, t in tables.items() if t.num_rows and {"start_ns", "end_ns"} <= set(t.column_names)
             and pa.types.is_integer(t.schema.field("start_ns").type)
             and pa.types.is_integer(t.schema.field("end_ns").type)}
    check_time_range(timed, path)


def _with_rank(tables: dict[str, pa.Table], rank: int) -> dict[str, pa.Table]:
    """``rank`` filled in on tables that do not carry it (the contract makes it optional)."""
    return {k: t if "rank" in t.column_names else t.append_column("rank", pa.array([rank] * t.num_rows, pa.int32()))
            for k, t in tables.items()}


def iter_ranks(
    path: Path, ranks: list[int] | None = None, progress: Callable[[int], None] | None = None,
    kinds: set[str] | None = None, note: Callable[[str], None] | None = None,
) -> Iterator[tuple[int, dict[str, pa.Table], dict[str, Any]]]:
    """Yield (rank, raw tables, metadata) per rank of ``path`` (a file or a folder),
    read by the importer that claims it (see importers/registry.py).  ``kinds``:
    the kinds wanted (None: all); ``note``: where note lines go (default: stderr)."""
    from pastaprof.importers.registry import importer_for

    path = Path(path)
    if not path.exists():
        raise InputError(path, "no such file or directory")
    if not path.is_dir():
        from pastaprof.store.safe_read import check_trace_file

        check_trace_file(path)  # a FIFO, a device, ...: one line, before any importer opens it
    imp, claim = importer_for(path)
    for rank, tables, meta in imp.import_ranks(path, ranks, progress=progress, kinds=kinds, note=note):
        _check_tables(imp.name, rank, tables)
        _check_times(tables, path)
        tables = _with_rank(tables, rank)
        meta["importer"] = imp.name
        meta.setdefault("claim", {"format": claim.format, "version": claim.version})
        yield rank, tables, meta


def manifest_for(path: Path, metas: list[dict[str, Any]]) -> dict[str, Any]:
    """The run manifest of an import whose ranks yielded ``metas``: the fields of the
    importer that read them (``format``, ``format_version``, ...) and ``importer``."""
    from pastaprof.importers.registry import get

    name = metas[0].get("importer", DEFAULT_IMPORTER) if metas else DEFAULT_IMPORTER
    fields = get(name).manifest_fields(Path(path), metas)
    _check_manifest(name, fields)
    fields.setdefault("format_version", (metas[0].get("claim") or {}).get("version") if metas else None)
    fields["importer"] = name
    return fields


def _check_manifest(importer: str, fields: Any) -> None:
    """The manifest an importer wrote must be one pastaprof reads back (store/manifest_check.py)."""
    from pastaprof.store.manifest_check import MANIFEST_FIELDS, _type_error

    if not isinstance(fields, dict):
        raise ImporterBug(f"importer {importer!r}: manifest_fields returned {type(fields).__name__}, not a dict")
    if not isinstance(fields.get("format"), str):
        raise ImporterBug(f"importer {importer!r}: the manifest names no format")
    for name, spec in MANIFEST_FIELDS.items():
        problem = _type_error(spec, fields[name]) if name in fields else None
        if problem:
            raise ImporterBug(f"importer {importer!r}: manifest field {name!r} {problem}")
