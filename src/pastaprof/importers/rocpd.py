"""ROCm rocpd databases (rocprofv3's default output: SQLite, one file per process) as events.

rocpd schema 3.0.x keeps each process's rows in tables named ``rocpd_<name><uuid>``
behind views ``rocpd_<name>``; rows join on ``(id, guid)``.  This importer reads the
``rocpd_<name>`` views (or, where a writer left none, the union of the uuid tables),
joins them itself with LEFT JOINs -- the data views (``kernels``, ``memory_copies``,
...) INNER JOIN and silently drop a dispatch whose region or queue row is missing,
and renamed their columns between versions -- and probes every column it reads, so
one column a version lacks is null, never an error.  Each file is opened read-only
(``immutable=1``) on its own connection: a job's many databases are never ATTACHed
(SQLite's limit of 10 does not apply), each process is one rank.

Mapped: ``rocpd_kernel_dispatch`` -> kernel (grid in workgroups: rocpd's grid size is
in work-items; registers = arch VGPRs; shared_bytes = LDS); ``rocpd_memory_copy`` ->
memcpy (direction from the agents' types); ``rocpd_region`` -> api (HIP: runtime,
HSA: driver; correlation from ``rocpd_event``) or range (roctx markers: domain user);
``rocpd_memory_allocate`` -> alloc / free (memory_kind device, host, virtual or
scratch).  Dropped (said in the manifest): counters (PMC/SPM), samples, PC sampling,
HIP graph launches, code objects, arguments.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pastaprof.errors import InputError
from pastaprof.importers.base import STRONG, Claim, Importer, Note, Progress, RankTables

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


def _lookup(ids: pa.ChunkedArray, table: pa.Table) -> pa.Array:
    """The names of ``ids`` in an (id, value) table, dictionary-encoded; unknown ids: null."""
    idx = pc.index_in(_ints(ids), value_set=_ints(table["id"]))
    return pa.DictionaryArray.from_arrays(idx.cast(pa.int32()), _strs(table["value"]))


def _arrow(values: tuple) -> pa.Array:
    """Ints stay int64 (out of range: null), text stays text; mixed junk becomes text."""
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return pa.array([None if v is None else str(v)[:1000] for v in values], pa.string())


def _short(e: Any, n: int = 120) -> str:
    text = "".join(ch if ch.isprintable() else "?" for ch in str(e))
    return text if len(text) <= n else text[: n - 3] + "..."


# ---------------------------------------------------------------- per-kind SQL
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


# ---------------------------------------------------------------- rows -> events
def _ints(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    """int64 (junk, fractions of huge values, out of range: null)."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if pa.types.is_integer(arr.type):
        return arr.cast(pa.int64())
    if pa.types.is_null(arr.type):
        return pa.nulls(len(arr), pa.int64())
    out = []
    for v in arr.to_pylist():  # rare: a column SQLite gave as REAL or text
        try:
            x = int(float(v)) if not isinstance(v, int) else v
        except (TypeError, ValueError, OverflowError):
            x = None
        out.append(x if x is not None and -(1 << 63) <= x < (1 << 63) else None)
    return pa.array(out, pa.int64())


def _strs(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    return arr if pa.types.is_string(arr.type) else arr.cast(pa.string()) if not pa.types.is_binary(arr.type) \
        else pa.array([None if v is None else v.decode("utf-8", "replace") for v in arr.to_pylist()], pa.string())


def _timed(t: pa.Table, dropped: dict[str, int], kind: str) -> pa.Table:
    """Integer times; rows without a start or end are dropped (counted), end < start is clamped."""
    s, e = _ints(t["start_ns"]), _ints(t["end_ns"])
    ok = pc.and_(pc.is_valid(s), pc.is_valid(e))
    bad = len(s) - pc.sum(ok.cast(pa.int64())).as_py() if len(s) else 0
    if bad:
        dropped[f"{kind} rows without a time"] = dropped.get(f"{kind} rows without a time", 0) + bad
    t = t.set_column(t.schema.get_field_index("start_ns"), "start_ns", s)
    t = t.set_column(t.schema.get_field_index("end_ns"), "end_ns", pc.max_element_wise(e, s))
    return t.filter(ok) if bad else t


def _common(t: pa.Table, rank: int, names: tuple[str, ...] = ("pid", "tid", "correlation")) -> dict[str, pa.Array]:
    n = t.num_rows
    out: dict[str, pa.Array] = {"start_ns": t["start_ns"], "end_ns": t["end_ns"], "rank": pa.array([rank] * n, pa.int32())}
    for k in names:
        out[k] = _ints(t[k])
    return out


def _kernels(t: pa.Table, rank: int) -> pa.Table:
    cols = _common(t, rank)
    cols["device"] = _ints(t["device"])
    cols["stream"] = _ints(t["stream"])
    cols["name"] = pc.fill_null(_strs(t["name"]), "<unnamed kernel>")
    for k in ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "registers"):
        cols[k] = _small(_ints(t[k]))
    cols["shared_bytes"] = _ints(t["shared_bytes"])
    return pa.table(cols)


def _small(a: pa.Array) -> pa.Array:
    """int32 columns: values out of range become null."""
    ok = pc.and_(pc.greater_equal(a, -(1 << 31)), pc.less(a, 1 << 31))
    return pc.if_else(ok, a, pa.scalar(None, pa.int64())).cast(pa.int32())


def _copies(t: pa.Table, rank: int) -> pa.Table:
    cols = _common(t, rank)
    dt, st = pc.fill_null(_strs(t["dst_type"]), ""), pc.fill_null(_strs(t["src_type"]), "")
    dg, sg = pc.equal(dt, "GPU"), pc.equal(st, "GPU")
    same = pc.fill_null(pc.equal(_ints(t["dst_agent"]), _ints(t["src_agent"])), False)
    dc, sc = pc.equal(dt, "CPU"), pc.equal(st, "CPU")
    direction = pc.case_when(pc.make_struct(pc.and_(sc, dg), pc.and_(sg, dc), pc.and_(pc.and_(sg, dg), same),
                                            pc.and_(sg, dg), pc.and_(sc, dc)),
                             "HtoD", "DtoH", "DtoD", "PtoP", "HtoH")
    cols["direction"] = pc.fill_null(direction, "unknown")
    cols["device"] = pc.if_else(dg, _ints(t["dst_index"]), _ints(t["src_index"]))
    cols["stream"] = _ints(t["stream"])
    cols["name"] = pc.fill_null(_strs(t["name"]), "memory copy")
    cols["bytes"] = _ints(t["bytes"])
    for k in ("dst_address", "src_address"):
        a = _ints(t[k])
        cols[k] = pc.if_else(pc.greater_equal(a, 0), a, pa.scalar(None, pa.int64())).cast(pa.uint64())
    return pa.table(cols)


def _regions(t: pa.Table, rank: int, counts: dict[str, int]) -> dict[str, pa.Table]:
    cat = pc.fill_null(_strs(t["category"]), "")
    for c, n in zip(*_value_counts(cat), strict=True):
        counts[c or "(none)"] = counts.get(c or "(none)", 0) + n
    upper = pc.utf8_upper(cat)
    marker = pc.starts_with(upper, "MARKER_CORE")
    other_marker = pc.and_(pc.starts_with(upper, "MARKER"), pc.invert(marker))
    api = pc.invert(pc.starts_with(upper, "MARKER"))
    cols = _common(t, rank)
    cols["name"] = pc.fill_null(_strs(t["name"]), "<unnamed>")
    base = pa.table(cols)
    out = {}
    a = base.filter(api)
    kind = pc.if_else(pc.starts_with(upper.filter(api), "HSA"), "driver", "runtime")
    out["api"] = a.append_column("api_kind", kind)
    r = base.filter(marker).drop_columns(["correlation"])
    out["range"] = r.append_column("domain", pa.array(["user"] * r.num_rows, pa.string()))
    counts["(marker control, not read)"] = pc.sum(other_marker.cast(pa.int64())).as_py() or 0
    return out


def _value_counts(a: pa.Array) -> tuple[list, list]:
    vc = pc.value_counts(a)
    return vc.field("values").to_pylist(), vc.field("counts").to_pylist()


def _allocs(t: pa.Table, rank: int) -> dict[str, pa.Table]:
    cols = _common(t, rank)
    op = pc.utf8_upper(pc.fill_null(_strs(t["op"]), ""))
    level = pc.utf8_upper(pc.fill_null(_strs(t["level"]), "REAL"))
    agent = pc.fill_null(_strs(t["agent_type"]), "")
    kind = pc.case_when(pc.make_struct(pc.equal(level, "SCRATCH"), pc.equal(level, "VIRTUAL"), pc.equal(agent, "CPU")),
                        "scratch", "virtual", "host")
    cols["memory_kind"] = pc.fill_null(kind, "device")
    cols["device"] = _ints(t["device"])
    a = _ints(t["address"])
    cols["address"] = pc.if_else(pc.greater_equal(a, 0), a, pa.scalar(None, pa.int64())).cast(pa.uint64())
    cols["bytes"] = _ints(t["bytes"])
    cols["name"] = pc.fill_null(_strs(t["op"]), "")
    base = pa.table(cols)
    is_alloc = pc.is_in(op, pa.array(["ALLOC", "REALLOC"]))
    is_free = pc.is_in(op, pa.array(["FREE", "RECLAIM"]))
    return {"alloc": base.filter(is_alloc), "free": base.filter(is_free)}


# ---------------------------------------------------------------- files, processes, ranks
def _files(path: Path) -> list[Path]:
    if not path.is_dir():
        return [path]
    try:
        cands = sorted(p for p in path.iterdir() if not p.name.startswith(".") and p.is_file())
    except OSError as e:
        raise InputError(path, f"cannot list the folder ({e.strerror})") from None
    return [p for p in cands if _is_sqlite(p)]


def _processes(db: _Db) -> list[dict[str, Any]]:
    """One entry per process of the file: key (guid:id), OS pid, host, rank from its environment."""
    b = "rocpd_info_process"
    if b not in db.src:
        return [{"key": None, "pid": None, "env_rank": None}]
    db.start("P")
    env, guid = db.col(b, "P", "environment"), db.col(b, "P", "guid")
    t = db.rows(f"SELECT COALESCE({guid}, '') || ':' || COALESCE(P.id, ''), {db.col(b, 'P', 'pid')}, "
                f"substr({env}, 1, 1000000) FROM {db.src[b]} P", ["key", "pid", "env"])
    out = []
    for key, pid, env_text in zip(*(t[c].to_pylist() for c in ("key", "pid", "env")), strict=True):
        out.append({"key": key, "pid": pid if isinstance(pid, int) else None, "env_rank": _env_rank(env_text)})
    if len(out) == 1:  # one process per file (rocprofv3's way): every row is its, no filter needed
        out[0]["key"] = None
    return out


def _env_rank(text: Any) -> int | None:
    if not isinstance(text, str) or not text.startswith("{"):
        return None
    try:
        env = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(env, dict):
        return None
    for k in RANK_ENV:
        v = env.get(k)
        if isinstance(v, (str, int)) and not isinstance(v, bool) and str(v).isdigit() and int(v) < 1 << 31:
            return int(v)
    return None


def _sniff_file(path: Path) -> str | None:
    if not _is_sqlite(path):
        return None
    try:
        con = _connect(path)
        try:
            return _version(con)
        finally:
            con.close()
    except (*DB_ERRORS, OSError):
        return None


READERS = (("kernel", "rocpd_kernel_dispatch", _kernel_sql, "K"), ("memcpy", "rocpd_memory_copy", _copy_sql, "M"),
           ("region", "rocpd_region", _region_sql, "R"), ("alloc", "rocpd_memory_allocate", _alloc_sql, "M"))


def _read(db: _Db, key: str | None, rank: int, meta: dict[str, Any]) -> dict[str, pa.Table]:
    """The raw tables of one process (``key``: guid:id; None: the whole file)."""
    out: dict[str, pa.Table] = {}
    for kind, base, make, alias in READERS:
        if base not in db.src:
            continue
        sql, names = make(db)
        params: tuple = ()
        if key is not None:
            sql += f" WHERE {_process_key(db, alias, base)} = ?"
            params = (key,)
        t = _timed(db.rows(sql, names, params), meta["dropped"], kind)
        guid = key.rpartition(":")[0] if key is not None else None
        for col, table in (("name", "rocpd_info_kernel_symbol" if kind == "kernel" else "rocpd_string"),
                           ("category", "rocpd_string")):
            if col in t.column_names:
                t = t.set_column(t.schema.get_field_index(col), col, _lookup(t[col], db.strings(table, guid)))
        if kind == "kernel":
            out["kernel"] = _kernels(t, rank)
        elif kind == "memcpy":
            out["memcpy"] = _copies(t, rank)
        elif kind == "region":
            out.update(_regions(t, rank, meta["category_counts"]))
        else:
            out.update(_allocs(t, rank))
    return out


def _devices(db: _Db) -> list[dict[str, Any]]:
    b = "rocpd_info_agent"
    if b not in db.src:
        return []
    c = db.col
    db.start("A")
    t = db.rows(f"SELECT {c(b, 'A', 'type')}, {c(b, 'A', 'type_index', 'logical_index')}, "
                f"COALESCE({c(b, 'A', 'product_name')}, {c(b, 'A', 'model_name')}, {c(b, 'A', 'name')}), "
                f"{c(b, 'A', 'name')} FROM {db.src[b]} A", ["type", "index", "product", "arch"])
    seen, out = set(), []
    for typ, idx, product, arch in zip(*(t[k].to_pylist() for k in t.column_names), strict=True):
        if typ == "GPU" and isinstance(idx, int) and idx not in seen:
            seen.add(idx)
            out.append({"id": idx, "name": _short(product or "", 80), "arch": _short(arch or "", 40)})
    return sorted(out, key=lambda d: d["id"])


def _host(db: _Db) -> str | None:
    b = "rocpd_info_node"
    if b not in db.src or "hostname" not in db.cols[b]:
        return None
    row = db.rows(f"SELECT hostname FROM {db.src[b]} LIMIT 1", ["h"])["h"].to_pylist()
    return _short(row[0], 100) if row and isinstance(row[0], str) else None


class RocpdImporter(Importer):
    """rocprofv3's rocpd SQLite databases (schema 3.0.x): a file, or a folder of them (one per process)."""

    name = "rocpd"
    description = "ROCm rocprofv3 rocpd SQLite databases (schema 3.0.x), a file or a folder of them"
    formats = ("rocpd",)
    looks_for = ".db rocpd databases (rocprofv3)"

    def sniff(self, path: Path) -> Claim | None:
        if path.is_dir():
            try:
                found = [v for v in (_sniff_file(p) for p in _files(path)[:256]) if v is not None]
            except InputError:
                return None
            if not found:
                return None
            return Claim(self.name, "rocpd", STRONG, found[0] or None, f"a folder of {len(found)} rocpd databases")
        v = _sniff_file(path)
        return None if v is None else Claim(self.name, "rocpd", STRONG, v or None, f"a rocpd database, schema {v or '?'}")

    def import_ranks(self, path: Path, ranks: list[int] | None = None, *, progress: Progress | None = None,
                     kinds: set[str] | None = None, note: Note | None = None) -> Iterator[RankTables]:
        plan, notes = _plan(path)
        opened: tuple[Path, _Db] | None = None
        for entry in plan:
            if ranks is not None and entry["rank"] not in ranks:
                continue
            if opened is None or opened[0] != entry["path"]:
                if opened is not None:
                    opened[1].con.close()
                opened = (entry["path"], _Db(entry["path"]))
            db = opened[1]
            meta = {"rank": entry["rank"], "file": entry["path"].name, "pid": entry["pid"], "format_version": entry["version"],
                    "category_counts": {}, "dropped": {}, "devices": _devices(db), "host": _host(db),
                    "bytes": _file_size(entry["path"]), "rank_source": {k: entry[k] for k in ("rank", "from", "guess", "pid")},
                    "unread": {b: n for b in DROPPED if (n := db.count(b))}, "plan_notes": notes}
            tables = _read(db, entry["key"], entry["rank"], meta)
            if progress is not None:
                progress(meta["bytes"])
            for what, n in meta["dropped"].items():
                notes.append(f"{entry['path'].name}: {n} {what} (dropped)")
            yield entry["rank"], tables, meta
        if opened is not None:
            opened[1].con.close()
        if note is not None:
            for line in notes:
                note(line)

    def manifest_fields(self, path: Path, metas: list[dict[str, Any]]) -> dict[str, Any]:
        first = metas[0] if metas else {}
        unread: dict[str, int] = {}
        for m in metas:
            for k, n in m.get("unread", {}).items():
                unread[k] = unread.get(k, 0) + n
        return {
            "source": str(path), "format": "rocpd", "format_version": first.get("format_version"),
            "command": None, "host": first.get("host"), "devices": first.get("devices", []),
            "versions": {"rocpd_schema": first.get("format_version")},
            "ranks": sorted({m["rank"] for m in metas}),
            "rank_source": {f"{m['file']}:{m.get('pid')}": m["rank_source"] for m in metas},
            "notes": list(first.get("plan_notes", [])), "skipped": {},
            "clock": {"domain": "rocprofiler_ns", "anchors": {}},
            "capture_overhead": None, "dropped_events": None,
            "category_counts": {str(m["rank"]): m.get("category_counts", {}) for m in metas},
            "unknown_categories": {}, "unread_rows": unread,
            "trace_bytes": sum(m.get("bytes", 0) for m in {m["file"]: m for m in metas}.values()),
        }


def _file_size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0


def _plan(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """Every process of every database behind ``path``, with its rank: from its environment
    (RANK, OMPI_COMM_WORLD_RANK, ...) when every process states a distinct one, else in
    (file name, pid) order -- a guess, said in a note."""
    files = _files(path)
    entries: list[dict[str, Any]] = []
    notes: list[str] = []
    skipped = []
    for f in files:
        version = _sniff_file(f)
        if version is None:
            if not path.is_dir():
                raise InputError(f, "is an SQLite database without rocpd_metadata: not a rocpd database")
            skipped.append(f.name)
            continue
        if version.split(".")[0] != MAJOR:
            raise InputError(f, f"is a rocpd database of schema {_short(version or '?', 40)}; this importer reads "
                                f"schema {MAJOR}.0.x")
        db = _Db(f)
        try:
            for p in _processes(db):
                entries.append({"path": f, "version": version, **p})
        finally:
            db.con.close()
    if skipped:
        notes.append(f"skipped {len(skipped)} SQLite file(s) that are no rocpd database: {', '.join(skipped[:3])}")
    if not entries:
        raise InputError(path, "holds no rocpd database" if path.is_dir() else "holds no process")
    env = [e["env_rank"] for e in entries]
    if all(r is not None for r in env) and len(set(env)) == len(env):
        for e in entries:
            e.update(rank=e["env_rank"], guess=False, **{"from": "environment"})
    else:
        entries.sort(key=lambda e: (e["path"].name, e["pid"] if e["pid"] is not None else -1))
        for i, e in enumerate(entries):
            e.update(rank=i, guess=len(entries) > 1, **{"from": "file order"})
        if len(entries) > 1:
            notes.append(f"{len(entries)} processes state no distinct rank in their environment: ranks 0-"
                         f"{len(entries) - 1} given in (file name, pid) order")
    entries.sort(key=lambda e: e["rank"])
    return entries, notes
