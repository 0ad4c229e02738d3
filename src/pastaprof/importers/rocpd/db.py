"""rocpd files: read-only connections, logical tables behind views or uuid tables, column
probing, and the SQL of each kind (ids only: names are looked up column-wise, events.py)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pyarrow as pa

from pastaprof.errors import InputError

SUFFIXES = (".db", ".sqlite", ".rpd")


MAGIC = b"SQLite format 3\x00"


MAJOR = "3"


BATCH = 1 << 16


RANK_ENV = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID", "MV2_COMM_WORLD_RANK")


DROPPED = ("rocpd_pmc_event", "rocpd_sample", "rocpd_pc_sample", "rocpd_graph_launch", "rocpd_hip_event")


META = "rocpd_metadata"


#: what SQLite may raise on a damaged file (a corrupt schema decodes as bad UTF-8: ValueError)
DB_ERRORS = (sqlite3.Error, ValueError, OverflowError, MemoryError)


def _connect(path: Path) -> sqlite3.Connection:
    """Read-only, immutable (no journal, no lock, nothing written beside the file)."""
    uri = path.resolve().as_uri() + "?mode=ro&immutable=1"
    con = sqlite3.connect(uri, uri=True, check_same_thread=False)
    con.text_factory = lambda b: b.decode("utf-8", "replace")
    return con


def _is_sqlite(path: Path) -> bool:
    try:
        with open(path, "rb", buffering=0) as f:
            return f.read(16) == MAGIC
    except OSError:
        return False


def _version(con: sqlite3.Connection) -> str | None:
    """``schema_version`` from rocpd_metadata, or None when the file is no rocpd database."""
    names = _names(con)
    meta = _source(names, "rocpd_metadata")
    if meta is None:
        return None
    try:
        row = con.execute(f"SELECT value FROM {meta} WHERE tag = 'schema_version' LIMIT 1").fetchone()
    except DB_ERRORS:
        return None
    return str(row[0])[:40] if row and row[0] is not None else ""


def _names(con: sqlite3.Connection) -> dict[str, str]:
    return {r[0]: r[1] for r in con.execute("SELECT name, type FROM sqlite_master WHERE type IN ('table', 'view')")}


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _source(names: dict[str, str], base: str) -> str | None:
    """SQL for the logical table ``base``: its view, else the union of its per-process tables
    (``base`` + each uuid that names a ``rocpd_metadata<uuid>`` table)."""
    if base in names:
        return _q(base)
    uuids = [n[len(META):] for n in names if n.startswith(META) and n != META]
    parts = [base + u for u in sorted(uuids) if base + u in names]
    if not parts:
        return None
    return "(" + " UNION ALL ".join(f"SELECT * FROM {_q(n)}" for n in parts) + ")"


def _columns(con: sqlite3.Connection, src: str) -> set[str]:
    try:
        cur = con.execute(f"SELECT * FROM {src} LIMIT 0")
    except DB_ERRORS:
        return set()
    return {d[0] for d in cur.description}


class _Db:
    """One open rocpd file: its logical tables and their columns."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.con = _connect(path)
            self.names = _names(self.con)
        except DB_ERRORS as e:
            raise InputError(path, f"is not a readable SQLite database ({_short(e)})") from None
        self.src: dict[str, str] = {}
        self.cols: dict[str, set[str]] = {}
        self.live: set[str] = set()
        self._strings: dict[tuple[str, str | None], pa.Table] = {}
        for base in ("rocpd_string", "rocpd_info_node", "rocpd_info_process", "rocpd_info_thread", "rocpd_info_agent",
                     "rocpd_info_kernel_symbol", "rocpd_event", "rocpd_region", "rocpd_kernel_dispatch",
                     "rocpd_memory_copy", "rocpd_memory_allocate", "rocpd_info_stream", "rocpd_info_queue") + DROPPED:
            s = _source(self.names, base)
            if s is not None:
                self.src[base] = s
                self.cols[base] = _columns(self.con, s)

    def start(self, alias: str) -> None:
        """A new query whose main table is ``alias``: joins made from now on are live."""
        self.live = {alias}

    def col(self, base: str, alias: str, name: str, *alts: str) -> str:
        """``alias.name`` (or the first alternative name the table has), else NULL (also
        when ``alias`` is a join that could not be made)."""
        if alias not in self.live:
            return "NULL"
        for n in (name, *alts):
            if n in self.cols.get(base, ()):
                return f"{alias}.{_q(n)}"
        return "NULL"

    def join(self, base: str, alias: str, key: str, owner: str, owner_base: str) -> str:
        """LEFT JOIN of ``base`` on id (and guid where both tables have one)."""
        if base not in self.src or key == "NULL":
            return ""
        self.live.add(alias)
        on = f"{alias}.id = {key}"
        if "guid" in self.cols.get(base, ()) and "guid" in self.cols.get(owner_base, ()):
            on += f" AND {alias}.guid = {owner}.guid"
        return f" LEFT JOIN {self.src[base]} {alias} ON {on}"

    def rows(self, sql: str, names: list[str], params: tuple = ()) -> pa.Table:
        """The query's rows as an Arrow table (built per batch of rows, column-wise)."""
        try:
            cur = self.con.execute(sql, params)
            batches = []
            while True:
                chunk = cur.fetchmany(BATCH)
                if not chunk:
                    break
                cols = list(zip(*chunk, strict=True))
                batches.append(pa.table({n: _arrow(c) for n, c in zip(names, cols, strict=True)}))
        except DB_ERRORS as e:
            raise InputError(self.path, f"cannot be read as a rocpd database ({_short(e)})") from None
        if not batches:
            return pa.table({n: pa.array([], pa.null()) for n in names})
        try:
            return pa.concat_tables(batches, promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError):  # one batch gave a column as text, another as numbers
            return pa.concat_tables([pa.table({n: _text(b[n]) for n in names}) for b in batches])

    def strings(self, base: str, guid: str | None) -> pa.Table:
        """(id, value) of the string table (or the kernel symbols' names) of one process,
        read once: names travel as ids and are looked up column-wise (no string per row)."""
        key = (base, guid)
        if key not in self._strings:
            value = {"rocpd_string": "string", "rocpd_info_kernel_symbol": "display_name"}[base]
            self.start("S")
            v = f"COALESCE({self.col(base, 'S', value)}, {self.col(base, 'S', 'kernel_name')})" \
                if base == "rocpd_info_kernel_symbol" else self.col(base, "S", value)
            where, params = ("", ())
            if guid is not None and "guid" in self.cols.get(base, ()):
                where, params = " WHERE S.guid = ?", (guid,)
            self._strings[key] = self.rows(f"SELECT S.id, {v} FROM {self.src[base]} S{where}", ["id", "value"], params) \
                if base in self.src else pa.table({"id": pa.array([], pa.int64()), "value": pa.array([], pa.string())})
        return self._strings[key]

    def count(self, base: str) -> int:
        try:
            return int(self.con.execute(f"SELECT count(*) FROM {self.src[base]}").fetchone()[0]) if base in self.src else 0
        except DB_ERRORS:
            return 0


def _text(col: pa.ChunkedArray) -> pa.Array:
    arr = col.combine_chunks()
    if pa.types.is_binary(arr.type):
        return pa.array([None if v is None else v.decode("utf-8", "replace") for v in arr.to_pylist()], pa.string())
    return arr.cast(pa.string())


def _arrow(values: tuple) -> pa.Array:
    """Ints stay int64 (out of range: null), text stays text; mixed junk becomes text."""
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return pa.array([None if v is None else str(v)[:1000] for v in values], pa.string())


def _short(e: Any, n: int = 120) -> str:
    text = "".join(ch if ch.isprintable() else "?" for ch in str(e))
    return text if len(text) <= n else text[: n - 3] + "..."


def _process_key(db: _Db, alias: str, base: str) -> str:
    guid = db.col(base, alias, "guid")
    return f"COALESCE({guid}, '') || ':' || COALESCE({db.col(base, alias, 'pid')}, '')"


def _kernel_sql(db: _Db) -> tuple[str, list[str]]:
    b, c = "rocpd_kernel_dispatch", db.col
    db.start("K")
    grid = [f"CASE WHEN {c(b, 'K', 'workgroup_size_' + a)} > 0 THEN ({c(b, 'K', 'grid_size_' + a)} + "
            f"{c(b, 'K', 'workgroup_size_' + a)} - 1) / {c(b, 'K', 'workgroup_size_' + a)} "
            f"ELSE {c(b, 'K', 'grid_size_' + a)} END" for a in "xyz"]
    frm = (f" FROM {db.src[b]} K" + _joins(db, "K", b) +
           db.join("rocpd_info_kernel_symbol", "S", c(b, "K", "kernel_id"), "K", b) +
           db.join("rocpd_info_agent", "A", c(b, "K", "agent_id"), "K", b))
    sel = [c(b, "K", "start"), c(b, "K", "end"), _process_key(db, "K", b), c("rocpd_info_process", "P", "pid"),
           c("rocpd_info_thread", "T", "tid"), c("rocpd_info_agent", "A", "type_index", "logical_index"),
           f"COALESCE({c(b, 'K', 'stream_id')}, {c(b, 'K', 'queue_id')})", c("rocpd_event", "E", "correlation_id"),
           c(b, "K", "kernel_id"), *grid,
           *(c(b, "K", "workgroup_size_" + a) for a in "xyz"),
           c("rocpd_info_kernel_symbol", "S", "arch_vgpr_count"), c(b, "K", "group_segment_size")]
    names = ["start_ns", "end_ns", "proc", "pid", "tid", "device", "stream", "correlation", "name",
             "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "registers", "shared_bytes"]
    return "SELECT " + ", ".join(sel) + frm, names


def _joins(db: _Db, alias: str, base: str) -> str:
    """Process, thread and event rows of ``alias``."""
    return (db.join("rocpd_info_process", "P", db.col(base, alias, "pid"), alias, base) +
            db.join("rocpd_info_thread", "T", db.col(base, alias, "tid"), alias, base) +
            db.join("rocpd_event", "E", db.col(base, alias, "event_id"), alias, base))


def _copy_sql(db: _Db) -> tuple[str, list[str]]:
    b, c, ag = "rocpd_memory_copy", db.col, "rocpd_info_agent"
    db.start("M")
    frm = (f" FROM {db.src[b]} M" + _joins(db, "M", b) +
           db.join(ag, "DA", c(b, "M", "dst_agent_id"), "M", b) + db.join(ag, "SA", c(b, "M", "src_agent_id"), "M", b))
    sel = [c(b, "M", "start"), c(b, "M", "end"), _process_key(db, "M", b), c("rocpd_info_process", "P", "pid"),
           c("rocpd_info_thread", "T", "tid"), f"COALESCE({c(b, 'M', 'stream_id')}, {c(b, 'M', 'queue_id')})",
           c("rocpd_event", "E", "correlation_id"), c(b, "M", "name_id"), c(b, "M", "size"),
           c(ag, "DA", "type"), c(ag, "DA", "type_index", "logical_index"), c(b, "M", "dst_agent_id"),
           c(ag, "SA", "type"), c(ag, "SA", "type_index", "logical_index"), c(b, "M", "src_agent_id"),
           c(b, "M", "dst_address"), c(b, "M", "src_address")]
    names = ["start_ns", "end_ns", "proc", "pid", "tid", "stream", "correlation", "name", "bytes",
             "dst_type", "dst_index", "dst_agent", "src_type", "src_index", "src_agent", "dst_address", "src_address"]
    return "SELECT " + ", ".join(sel) + frm, names


def _region_sql(db: _Db) -> tuple[str, list[str]]:
    b, c = "rocpd_region", db.col
    db.start("R")
    frm = f" FROM {db.src[b]} R" + _joins(db, "R", b)
    sel = [c(b, "R", "start"), c(b, "R", "end"), _process_key(db, "R", b), c("rocpd_info_process", "P", "pid"),
           c("rocpd_info_thread", "T", "tid"), c("rocpd_event", "E", "correlation_id"),
           c(b, "R", "name_id"), c("rocpd_event", "E", "category_id")]
    names = ["start_ns", "end_ns", "proc", "pid", "tid", "correlation", "name", "category"]
    return "SELECT " + ", ".join(sel) + frm, names


def _alloc_sql(db: _Db) -> tuple[str, list[str]]:
    b, c = "rocpd_memory_allocate", db.col
    db.start("M")
    frm = f" FROM {db.src[b]} M" + _joins(db, "M", b) + db.join("rocpd_info_agent", "A", c(b, "M", "agent_id"), "M", b)
    sel = [c(b, "M", "start"), c(b, "M", "end"), _process_key(db, "M", b), c("rocpd_info_process", "P", "pid"),
           c("rocpd_info_thread", "T", "tid"), c(b, "M", "type"), c(b, "M", "level"), c("rocpd_info_agent", "A", "type"),
           c("rocpd_info_agent", "A", "type_index", "logical_index"), c(b, "M", "address"), c(b, "M", "size"),
           c("rocpd_event", "E", "correlation_id")]
    names = ["start_ns", "end_ns", "proc", "pid", "tid", "op", "level", "agent_type", "device", "address", "bytes",
             "correlation"]
    return "SELECT " + ", ".join(sel) + frm, names
