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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from pastaprof.errors import InputError
from pastaprof.importers.base import STRONG, Claim, Importer, Note, Progress, RankTables
from pastaprof.importers.rocpd.db import (
    DB_ERRORS,
    DROPPED,
    MAJOR,
    RANK_ENV,
    _alloc_sql,
    _connect,
    _copy_sql,
    _Db,
    _is_sqlite,
    _kernel_sql,
    _process_key,
    _region_sql,
    _short,
    _version,
)
from pastaprof.importers.rocpd.events import _allocs, _copies, _kernels, _lookup, _regions, _timed


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
