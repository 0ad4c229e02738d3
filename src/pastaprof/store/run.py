"""A Run: the events of one profiled program, as Arrow tables and DuckDB views.

``pastaprof.load(path)`` returns one.  It is backed either by a run directory
(Parquet files, read lazily) or by in-memory tables from an importer.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa

from pastaprof.errors import InputError
from pastaprof.events.limits import check_span
from pastaprof.events.schema import KINDS, schema
from pastaprof.store.manifest_check import read_manifest
from pastaprof.store.safe_read import check_inside, os_problem, part_rows, read_part
from pastaprof.store.writer import MANIFEST

if TYPE_CHECKING:
    import pandas


class Run:
    """Events of a run: ``table(kind)``, ``sql(query)``, ``to_pandas(kind)``."""

    def __init__(self, manifest: dict[str, Any], path: Path | None = None,
                 tables: dict[str, pa.Table] | None = None, ranks: list[int] | None = None) -> None:
        self.manifest = manifest
        self.path = path
        self._tables: dict[str, pa.Table] = dict(tables or {})
        self._ranks = ranks
        self._con: duckdb.DuckDBPyConnection | None = None
        self._checked: dict[str, list[Path]] = {}

    def __repr__(self) -> str:
        where = str(self.path) if self.path else self.manifest.get("source", "memory")
        return f"<pastaprof.Run {where} ranks={self.ranks}>"

    @property
    def ranks(self) -> list[int]:
        ranks = self.manifest.get("ranks", [0])
        return [r for r in ranks if self._ranks is None or r in self._ranks]

    def _files(self, kind: str) -> list[Path]:
        """The selected ranks' parts of ``kind``, checked once per kind: each a regular Parquet
        file of that kind inside the run directory, together holding the rows run.json counts."""
        if self.path is None:
            return []
        if kind not in self._checked:
            self._checked[kind] = _check_parts(self.path, kind, self.manifest)
        files = self._checked[kind]
        if self._ranks is not None:
            files = [f for f in files if _rank_of(f) in self._ranks]
        return files

    def table(self, kind: str) -> pa.Table:
        """All events of ``kind`` (all selected ranks) with the kind's schema."""
        schema(kind)  # validates the name
        if kind not in self._tables:
            files = self._files(kind)
            if files:
                assert self.path is not None
                t = pa.concat_tables([read_part(f, kind, self.path) for f in files])
                self._tables[kind] = t
            else:
                self._tables[kind] = schema(kind).empty_table()
        t = self._tables[kind]
        if self._ranks is not None and self.path is None and t.num_rows:
            import pyarrow.compute as pc

            t = t.filter(pc.is_in(t["rank"], pa.array(self._ranks, pa.int32())))
        return t

    def select_ranks(self, ranks: list[int]) -> Run:
        """The same run, restricted to ``ranks``."""
        return Run(self.manifest, path=self.path, tables=self._tables if self.path is None else None, ranks=ranks)

    def to_pandas(self, kind: str) -> pandas.DataFrame:
        return self.table(kind).to_pandas()

    @property
    def connection(self) -> duckdb.DuckDBPyConnection:
        """A DuckDB connection in which every kind is a view named after it."""
        if self._con is None:
            con = duckdb.connect()
            for kind in KINDS:
                files = self._files(kind)
                if files and self._ranks is None:
                    paths = ", ".join("'" + str(f).replace("'", "''") + "'" for f in files)
                    con.execute(f'CREATE VIEW "{kind}" AS SELECT * FROM read_parquet([{paths}])')
                    # what read_part checks of each part's times, over the view (read_parquet skips it)
                    lo, hi, total = con.execute(f'SELECT min(start_ns), max(end_ns), sum(abs(end_ns::DOUBLE - '
                                                f'start_ns::DOUBLE)) FROM "{kind}"').fetchall()[0]
                    check_span(lo, hi, self.path / kind, total)
                else:
                    con.register(kind, self.table(kind))
            self._con = con
        return self._con

    def sql(self, query: str) -> duckdb.DuckDBPyRelation:
        """Run a DuckDB query over the run; each kind is a view (``select ... from kernel``)."""
        return self.connection.sql(query)

    def iter_tables(self):
        for kind in KINDS:
            yield kind, self.table(kind)


_PART_NAME = re.compile(r"^rank-(\d{1,9})(?:-pid-\d+-part-\d+)?\.parquet$")


def _rank_of(path: Path) -> int:
    """rank-3.parquet (and live parts rank-3-pid-..) -> 3."""
    m = _PART_NAME.match(path.name)
    assert m is not None  # _check_parts admits only such names
    return int(m.group(1))


def _check_parts(run_dir: Path, kind: str, manifest: dict[str, Any]) -> list[Path]:
    """The parts of ``kind`` in ``run_dir``, each checked by its footer (safe_read.part_rows),
    and their row total checked against the manifest's count: a part that went missing, or
    one that is not this table's, is one error rather than a silently smaller run."""
    d = run_dir / kind
    files: list[Path] = []
    if os.path.lexists(d):
        check_inside(d, run_dir)
        if not d.is_dir():
            raise InputError(d, "is not a directory of Parquet parts")
        try:  # a listing that fails (permission denied) is that error, not "no parts"
            names = sorted(e.name for e in os.scandir(d) if e.name.startswith("rank-") and e.name.endswith(".parquet"))
        except OSError as e:
            raise InputError(d, os_problem(e)) from None
        files = [d / n for n in names]
    ranks = manifest.get("ranks")
    for f in files:
        m = _PART_NAME.match(f.name)
        if not m:
            raise InputError(f, "is not a part name pastaprof writes (rank-<N>.parquet)")
        if ranks is not None and int(m.group(1)) not in ranks:
            raise InputError(f, f"a part of rank {int(m.group(1))}, but run.json lists ranks {_short(ranks)}")
    rows = sum(part_rows(f, kind, run_dir) for f in files)
    counted = (manifest.get("rows") or {}).get(kind)
    if counted is not None and counted != rows:
        held = f"its parts hold {rows:,}" if files else f"{d.name}/ has no parts"
        raise InputError(d, f"run.json counts {counted:,} {kind} rows but {held}: a part is missing or damaged")
    return files


def _short(ranks: list[int]) -> str:
    return str(ranks) if len(ranks) <= 8 else f"[{', '.join(map(str, ranks[:8]))}, ...]"


def open_run_dir(path: Path, ranks: list[int] | None = None) -> Run:
    """A run directory as a Run, after checking its manifest and its parts (safe_read)."""
    if not path.is_dir():
        raise InputError(path, "not a directory")
    run = Run(read_manifest(path, MANIFEST), path=path, ranks=ranks)
    if ranks is not None and not run.ranks:  # as a trace with no file of those ranks
        have = run.manifest.get("ranks", [0])
        shown = ", ".join(map(str, have[:8])) + (" ..." if len(have) > 8 else "")
        raise InputError(path, f"no rank of the run matches the selected ranks (its ranks: {shown})")
    for kind in KINDS:  # every part's footer now (~0.2 ms each): a damaged store fails every command alike
        run._files(kind)
    return run
