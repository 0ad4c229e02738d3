"""A Run: the events of one profiled program, as Arrow tables and DuckDB views.

``pastaprof.load(path)`` returns one.  It is backed either by a run directory
(Parquet files, read lazily) or by in-memory tables from an importer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa

from pastaprof.errors import InputError
from pastaprof.events.schema import KINDS, SCHEMA_VERSION, conform, schema
from pastaprof.store.writer import MANIFEST
from pastaprof.store.writer import read_parquet as _read

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

    def __repr__(self) -> str:
        where = str(self.path) if self.path else self.manifest.get("source", "memory")
        return f"<pastaprof.Run {where} ranks={self.ranks}>"

    @property
    def ranks(self) -> list[int]:
        ranks = self.manifest.get("ranks", [0])
        return [r for r in ranks if self._ranks is None or r in self._ranks]

    def _files(self, kind: str) -> list[Path]:
        if self.path is None:
            return []
        files = sorted((self.path / kind).glob("rank-*.parquet"))
        if self._ranks is not None:
            files = [f for f in files if _rank_of(f) in self._ranks]
        return files

    def table(self, kind: str) -> pa.Table:
        """All events of ``kind`` (all selected ranks) with the kind's schema."""
        schema(kind)  # validates the name
        if kind not in self._tables:
            files = self._files(kind)
            if files:
                try:
                    t = pa.concat_tables([_read(f) for f in files])
                except (OSError, pa.ArrowInvalid) as e:
                    raise InputError(files[0].parent, f"unreadable Parquet ({e})") from None
                self._tables[kind] = conform(kind, t)
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


def _rank_of(path: Path) -> int:
    """rank-3.parquet (and live parts rank-3-pid-..) -> 3."""
    return int(path.stem.split("-")[1])


def open_run_dir(path: Path, ranks: list[int] | None = None) -> Run:
    mpath = path / MANIFEST
    try:
        manifest = json.loads(mpath.read_text())
    except FileNotFoundError:
        raise InputError(path, f"not a pastaprof run (no {MANIFEST})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(mpath, f"corrupt manifest ({e})") from None
    if not isinstance(manifest, dict):
        raise InputError(mpath, "corrupt manifest (not a JSON object)")
    v = manifest.get("schema_version")
    if v != SCHEMA_VERSION:
        raise InputError(mpath, f"schema version {v!r} is not supported (this pastaprof reads {SCHEMA_VERSION})")
    return Run(manifest, path=path, ranks=ranks)
