"""Reading an Nsight Systems SQLite export into Arrow columns, safely and without a Python object per row.

The file is opened read-only and immutable (``file:...?mode=ro&immutable=1``):
SQLite then never writes, locks or creates a journal beside it, whatever the
file holds.  The stdlib ``sqlite3`` module yields one tuple per row; instead,
each chunk of rows is turned into CSV text by SQLite itself (``group_concat`` of
one ``printf('%s,%s,...')`` per row, in C; ``%s`` writes NULL as an empty
field) and parsed by Arrow's CSV reader (C++, typed), so the Python side handles
one string per 256k rows.  Text columns are never put in
the CSV: names are ids into ``StringIds`` (or into a temporary table of distinct
inline texts), resolved as dictionary arrays.

Columns are probed with ``PRAGMA table_info``: a column an export lacks reads as
null (schema versions add columns; ``greenContextId`` is recent).
"""

from __future__ import annotations

import os
import re
import sqlite3
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from pastaprof.errors import InputError
from pastaprof.store.safe_read import native_buffer

CHUNK_ROWS = 1 << 18
FETCH_THREADS = max(2, min(4, os.cpu_count() or 2))  # connections reading chunks at once
SQLITE_MAGIC = b"SQLite format 3\x00"
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def connect(path: Path) -> sqlite3.Connection:
    """``path`` opened read-only, immutable, with no writes anywhere but SQLite's own temp store."""
    uri = Path(path).resolve().as_uri() + "?mode=ro&immutable=1"
    try:
        con = sqlite3.connect(uri, uri=True, check_same_thread=False)
        con.execute("PRAGMA temp_store = MEMORY")  # temp tables (distinct NVTX texts) live in memory
        con.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.Error as e:
        raise InputError(path, damaged(e)) from None
    return con


def damaged(e: BaseException) -> str:
    """One line for an SQLite failure on the user's file."""
    msg = " ".join(str(e).split())[:200] or type(e).__name__
    return f"corrupt or truncated SQLite database ({msg})"


class Db:
    """An open export with its tables' columns probed once."""

    def __init__(self, path: Path, con: sqlite3.Connection) -> None:
        self.path, self.con = path, con
        try:
            rows = con.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')").fetchall()
        except sqlite3.Error as e:
            raise InputError(path, damaged(e)) from None
        self.tables = {r[0] for r in rows if isinstance(r[0], str) and _IDENT.match(r[0])}
        self._cols: dict[str, set[str]] = {}
        self._plain: set[tuple[str, str]] = set()
        self._pool: ThreadPoolExecutor | None = None
        self._pending: dict[str, list[Future]] = {}

    def close(self) -> None:
        """Stop the chunk readers (queued chunks are dropped) and close the connection."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self._pending.clear()
        self.con.close()

    def has(self, table: str) -> bool:
        return table in self.tables

    def columns(self, table: str) -> set[str]:
        if table not in self._cols:
            if table not in self.tables:
                self._cols[table] = set()
            else:
                rows = self.query(f'PRAGMA table_info("{table}")')
                self._cols[table] = {r[1] for r in rows if isinstance(r[1], str)}
                # declared INTEGER: SQLite's type affinity keeps such values integers (text that
                # looks like one is converted on insert), so no CAST is needed; NULL prints as an
                # empty field, anything else (text, a fraction) fails the typed parse: an InputError
                self._plain.update((table, r[1]) for r in rows if isinstance(r[2], str)
                                   and r[2].upper() == "INTEGER")
        return self._cols[table]

    def query(self, sql: str, args: tuple = ()) -> list[tuple]:
        """Rows of a small query (metadata, strings, enums: never per-event tables)."""
        try:
            return self.con.execute(sql, args).fetchall()
        except sqlite3.Error as e:
            raise InputError(self.path, damaged(e)) from None

    def int_expr(self, table: str, column: str, default: str = "NULL") -> str:
        """SQL for an integer column of ``table`` (``default`` when the export lacks it)."""
        if column not in self.columns(table) or not _IDENT.match(column):
            return default
        return f'"{column}"' if (table, column) in self._plain else f'CAST("{column}" AS INTEGER)'

    def _chunk(self, sql: str, names: list[str], own: bool) -> pa.Table | None:
        """One chunk's CSV text, fetched on a connection of this thread (``own``) and parsed:
        sqlite3 and Arrow's parser release the GIL, so chunks run in parallel."""
        con = connect(self.path) if own else self.con
        try:
            text, count = con.execute(sql).fetchone()
        except sqlite3.Error as e:
            raise InputError(self.path, damaged(e)) from None
        finally:
            if own:
                con.close()
        if not text:
            return None
        t = _parse(text, names, self.path)
        if t.num_rows != count:  # a text value with a newline in an integer column made rows of its own
            raise InputError(self.path, f"an integer column holds text ({t.num_rows} rows parsed, {count} in the table)")
        return t

    def _sqls(self, table: str, exprs: dict[str, str], where: str) -> list[str]:
        """One ``group_concat`` query per CHUNK_ROWS rowids of ``table``: by rowid ranges where
        the rowids are dense (an export's), by every CHUNK_ROWS-th rowid where they are sparse
        (one rowid of 2**63-1 made 2**45 ranges), and one query for a view (no rowid)."""
        # one printf per row: half the work of joining the columns with || (a new string per column)
        args = ", ".join(e if _plain_col(e) else f"CAST(({e}) AS INTEGER)" for e in exprs.values())
        row = f"printf('{','.join(['%s'] * len(exprs))}', {args})"
        head = f'SELECT group_concat({row}, char(10)), count(*) FROM "{table}" '
        if self.query("SELECT type FROM sqlite_master WHERE name = ?", (table,)) == [("view",)]:
            return [head + (f"WHERE {where}" if where else "")]
        lo, hi, n = self.query(f'SELECT min(rowid), max(rowid), count(*) FROM "{table}"')[0]
        if not all(isinstance(x, int) for x in (lo, hi, n)) or not n:
            return []
        if hi - lo >= 4 * max(n, CHUNK_ROWS):
            firsts = [r for (r,) in self.query(f'SELECT rowid FROM (SELECT rowid, row_number() OVER (ORDER BY rowid) '
                                               f'- 1 AS k FROM "{table}") WHERE k % {CHUNK_ROWS} = 0')]
        else:
            firsts = list(range(lo, hi + 1, CHUNK_ROWS))
        cond = f"{where} AND " if where else ""
        return [head + f"WHERE {cond}rowid >= {a}" + (f" AND rowid < {b}" if b is not None else "")
                for a, b in zip(firsts, [*firsts[1:], None])]

    def prefetch(self, table: str, exprs: dict[str, str], where: str = "") -> None:
        """Start reading what ``fetch(table, exprs, where)`` will return, on the chunk readers,
        so that SQLite works while this thread maps an earlier table."""
        key = repr((table, exprs, where))
        if key not in self._pending:
            names = list(exprs)
            if self._pool is None:
                self._pool = ThreadPoolExecutor(FETCH_THREADS)
            self._pending[key] = [self._pool.submit(self._chunk, q, names, True)
                                  for q in self._sqls(table, exprs, where)]

    def fetch(self, table: str, exprs: dict[str, str], where: str = "", parallel: bool = True) -> pa.Table:
        """``SELECT exprs FROM table [WHERE where]`` as an int64 Arrow table, chunk by chunk
        (``parallel``: on FETCH_THREADS connections; not for SQL that reads temp tables).
        Every expression must yield an integer or NULL."""
        names = list(exprs)
        if parallel:
            self.prefetch(table, exprs, where)
            got = [f.result() for f in self._pending.pop(repr((table, exprs, where)))]
        else:
            got = [self._chunk(q, names, False) for q in self._sqls(table, exprs, where)]
        parts = [t for t in got if t is not None]
        return pa.concat_tables(parts) if parts else _empty(names)


def ints(col: pa.Array | pa.ChunkedArray, fill: int) -> np.ndarray:
    """An integer column as int64 NumPy values with nulls as ``fill``: read from the
    column's buffers and validity, without an Arrow ``fill_null`` copy per call."""
    a = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if a.type != pa.int64():
        a = a.cast(pa.int64())
    if a.null_count == 0:
        return np.asarray(a)
    values = np.frombuffer(a.buffers()[1], dtype=np.int64, count=len(a), offset=a.offset * 8)
    return np.where(np.asarray(a.is_null()), np.int64(fill), values)


def _plain_col(expr: str) -> bool:
    """A bare quoted column (an INTEGER NOT NULL one, see ``int_expr``)."""
    return expr.startswith('"') and expr.endswith('"') and expr.count('"') == 2


def _empty(names: list[str]) -> pa.Table:
    return pa.table({n: pa.array([], pa.int64()) for n in names})


def _parse(text: str, names: list[str], path: Path) -> pa.Table:
    try:
        return pacsv.read_csv(
            pa.BufferReader(native_buffer(text.encode())),
            read_options=pacsv.ReadOptions(column_names=names, block_size=1 << 24),
            parse_options=pacsv.ParseOptions(newlines_in_values=False),
            convert_options=pacsv.ConvertOptions(column_types={n: pa.int64() for n in names}),
        )
    except (pa.ArrowInvalid, ValueError) as e:
        raise InputError(path, f"an integer column holds a value that is no 64-bit integer ({_short(e)})") from None


def _short(e: BaseException) -> str:
    return " ".join(str(e).split())[:160]


class Strings:
    """Names as dictionary arrays: ``StringIds`` (id -> value) plus the distinct
    inline texts of one table column, appended after them."""

    def __init__(self, db: Db) -> None:
        rows = db.query("SELECT id, value FROM StringIds") if db.has("StringIds") else []
        rows = [(i, v) for i, v in rows if isinstance(i, int) and not isinstance(i, bool)]
        self.values: list[str] = [v if isinstance(v, str) else "" for _i, v in rows]
        ids = np.array([i for i, _v in rows], dtype=np.int64)
        # id -> position as a lookup table over [min id, max id] (ids are dense in exports):
        # one gather per event instead of a binary search; the first row of a repeated id wins
        uniq, first = np.unique(ids, return_index=True)
        self._lo = int(uniq[0]) if len(uniq) else 0
        span = int(uniq[-1]) - self._lo + 1 if len(uniq) else 0
        self._lut: np.ndarray | None = None
        if 0 < span <= 4 * len(uniq) + 4096:
            self._lut = np.full(span, -1, dtype=np.int64)
            self._lut[uniq - self._lo] = first
        self._ids, self._pos = uniq, first.astype(np.int64)
        self.inline_base: dict[str, int] = {}

    def add_inline(self, db: Db, table: str, column: str, key: str) -> str:
        """A temporary table of ``table.column``'s distinct texts, numbered after the
        StringIds values; returns the SQL expression of a row's index (NULL: none)."""
        if column not in db.columns(table):
            return "NULL"
        tmp = f"_pastaprof_{key}"
        base = len(self.values)
        try:
            db.con.execute(f"CREATE TEMP TABLE {tmp} AS SELECT DISTINCT CAST(\"{column}\" AS TEXT) AS t "
                           f"FROM \"{table}\" WHERE \"{column}\" IS NOT NULL")
            db.con.execute(f"CREATE INDEX temp.{tmp}_i ON {tmp}(t)")
        except sqlite3.Error as e:
            raise InputError(db.path, damaged(e)) from None
        texts = db.query(f"SELECT rowid, t FROM temp.{tmp} ORDER BY rowid")
        self.values.extend(t if isinstance(t, str) else "" for _r, t in texts)
        first = texts[0][0] if texts else 1
        self.inline_base[key] = base
        return (f"(SELECT rowid - {first} + {base} FROM temp.{tmp} "
                f"WHERE t = CAST(\"{column}\" AS TEXT))")

    def index(self, ids: pa.ChunkedArray | pa.Array) -> np.ndarray:
        """Dictionary positions of StringIds ``ids`` (-1: null or unknown id)."""
        a = ints(ids, -1)
        if len(self._ids) == 0:
            return np.full(len(a), -1, dtype=np.int64)
        if self._lut is not None:
            off = a - self._lo
            inside = (off >= 0) & (off < len(self._lut)) & (a >= 0)
            return np.where(inside, self._lut[np.where(inside, off, 0)], -1)
        pos = np.clip(np.searchsorted(self._ids, a), 0, len(self._ids) - 1)
        hit = self._ids[pos] == a
        return np.where(hit & (a >= 0), self._pos[pos], -1)

    def dictionary(self, idx: np.ndarray, values: list[str] | None = None) -> pa.DictionaryArray:
        """A dictionary array over ``values`` (default: all strings) for positions ``idx`` (-1: null)."""
        vals = pa.array(self.values if values is None else values, pa.string())
        return pa.DictionaryArray.from_arrays(pa.array(idx.astype(np.int32), pa.int32(), mask=idx < 0), vals)
