"""Importer for Nsight Systems SQLite exports (``nsys export --type sqlite``), a file or a folder of them.

One rank per process with CUDA activity (kernels, copies, memsets, API calls):
``MPI_RANKS`` when the export has it, else a rank named in the file name of a
one-process export (``rank-3.sqlite``), else pid order -- a guess, said in a
note.  Correlation ids repeat across processes, so each process is split off
before anything is linked: API call and GPU work meet on (pid, correlationId).

Times are nanoseconds on the session's clock; the event model's Unix-epoch time
is ``t - systemClockNs + utcEpochNs`` of ``TARGET_INFO_SESSION_START_TIME``
(``t + utcEpochNs`` for an export made with ``--ts-normalize``); the manifest's
``clock`` says which anchor was used.  What is mapped and what is dropped:
docs/importers.md.
"""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pastaprof.errors import InputError
from pastaprof.importers import nsys_map
from pastaprof.importers.base import FALLBACK, STRONG, Claim, Importer, Note, Progress, RankTables
from pastaprof.importers.nsys_sql import SQLITE_MAGIC, Db, Strings, connect, damaged, ints
from pastaprof.importers.ranks import rank_from_name, show

FORMAT = "nsys-sqlite"
KNOWN_MAJORS = ("3",)
_NSYS_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS", "TARGET_INFO_GPU")


def _note(msg: str) -> None:
    try:
        sys.stderr.write(f"pastaprof: note: {msg}\n")
    except (AttributeError, OSError, ValueError):
        pass


def _is_sqlite(path: Path) -> bool:
    try:
        with open(path, "rb", buffering=0) as f:
            return f.read(16) == SQLITE_MAGIC
    except OSError:
        return False


def _meta(db: Db, table: str) -> dict[str, str]:
    if not db.has(table) or not {"name", "value"} <= db.columns(table):
        return {}
    return {n: v for n, v in db.query(f'SELECT name, value FROM "{table}"') if isinstance(n, str) and isinstance(v, str)}


def _identify(path: Path) -> Claim | None:
    """A claim on one file: STRONG for an nsys export, FALLBACK for a damaged SQLite file."""
    if not _is_sqlite(path):
        return None
    try:
        con = connect(path)
    except InputError:
        return Claim("nsys", FORMAT, FALLBACK, why="a damaged SQLite database")
    try:
        db = Db(path, con)
        meta = _meta(db, "META_DATA_EXPORT")
        product = meta.get("EXPORT_PRODUCT_NAME", "")
        if "Nsight Systems" not in product and not (db.has("StringIds") and any(db.has(t) for t in _NSYS_TABLES)):
            return None
        version = meta.get("EXPORT_SCHEMA_VERSION")
        return Claim("nsys", FORMAT, STRONG, version=version,
                     why=f"an Nsight Systems SQLite export{', schema ' + version if version else ''}")
    except InputError:
        return Claim("nsys", FORMAT, FALLBACK, why="a damaged SQLite database")
    finally:
        con.close()


def _folder_files(folder: Path) -> list[Path]:
    try:
        entries = sorted(p for p in folder.iterdir() if not p.name.startswith("."))
    except OSError:
        return []
    return [p for p in entries if p.is_file() and _is_sqlite(p)]


class NsysImporter(Importer):
    """Nsight Systems ``nsys export --type sqlite`` files (export schema 3.x)."""

    name = "nsys"
    description = "Nsight Systems SQLite exports (nsys export --type sqlite), a file or a folder of them"
    formats = (FORMAT,)
    looks_for = ".sqlite Nsight Systems exports"

    def sniff(self, path: Path) -> Claim | None:
        if not path.is_dir():
            return _identify(path)
        claims = [c for c in (_identify(p) for p in _folder_files(path)) if c is not None and c.score == STRONG]
        if not claims:
            return None
        versions = sorted({c.version for c in claims if c.version})
        return Claim(self.name, FORMAT, STRONG, version=", ".join(versions) or None,
                     why=f"a folder of {len(claims)} Nsight Systems SQLite export{'s' if len(claims) > 1 else ''}")

    def import_ranks(self, path: Path, ranks: list[int] | None = None, *, progress: Progress | None = None,
                     kinds: set[str] | None = None, note: Note | None = None) -> Iterator[RankTables]:
        note = note or _note
        if path.is_dir():
            files = [p for p in _folder_files(path) if (c := _identify(p)) is not None and c.score == STRONG]
            skipped = {p.name: "not an Nsight Systems export" for p in _folder_files(path) if p not in files}
        else:
            files, skipped = [path], {}
        notes: list[str] = []
        if skipped:
            notes.append(f"skipped {len(skipped)} SQLite file{'s' if len(skipped) > 1 else ''} that "
                         f"{'are' if len(skipped) > 1 else 'is'} no Nsight Systems export: "
                         + ", ".join(show(n) for n in list(skipped)[:3]))
        next_rank = 0
        yielded = False
        for f in files:
            if progress:
                progress(0)
            plan = _read_file(f, kinds, notes, next_rank, multi=len(files) > 1)
            if progress:
                try:
                    progress(f.stat().st_size)
                except OSError:
                    pass
            next_rank = max([next_rank - 1, *plan["ranks"].values()]) + 1
            orders = {k: _Order(t) for k, t in plan["tables"].items()}
            for pid, rank in sorted(plan["ranks"].items(), key=lambda kv: kv[1]):
                if ranks is not None and rank not in ranks:
                    continue
                tables = {k: orders[k].rows(t, pid, rank) for k, t in plan["tables"].items()}
                meta = {"rank": rank, "file": f.name, "pid": pid, "process": plan["process_names"].get(pid),
                        "devices_used": plan["devices_used"].get(pid, []), "rank_from": plan["rank_from"],
                        "header": plan["header"], "counts": {k: t.num_rows for k, t in tables.items()},
                        "notes": notes, "skipped": skipped}
                yielded = True
                yield rank, tables, meta
        if yielded:
            for line in notes:
                note(line)

    def manifest_fields(self, path: Path, metas: list[dict[str, Any]]) -> dict[str, Any]:
        first = metas[0] if metas else {}
        header = first.get("header", {})
        devices: dict[int, dict[str, Any]] = {}
        for m in metas:
            for d in m.get("header", {}).get("devices", []):
                devices.setdefault(d["id"], d)
            for d in m.get("devices_used", []):
                devices.setdefault(d, {"id": d})
        return {
            "source": str(path),
            "format": FORMAT,
            "format_version": header.get("schema_version"),
            "command": header.get("command"),
            "host": header.get("host"),
            "devices": [devices[k] for k in sorted(devices)],
            "versions": header.get("versions", {}),
            "ranks": sorted({m["rank"] for m in metas}),
            "rank_source": {f"{m['file']}:pid {m['pid']}": {"rank": m["rank"], "from": m["rank_from"], "pid": m["pid"],
                                                            "process": m["process"], "guess": m["rank_from"] == "pid order"}
                            for m in metas},
            "notes": list(first.get("notes", [])),
            "skipped": dict(first.get("skipped", {})),
            "clock": header.get("clock", {"domain": "unix_epoch_ns"}),
            "capture_overhead": None,
            "dropped_events": None,
            "event_counts": {str(m["rank"]): m.get("counts", {}) for m in metas},
        }


def _check_version(path: Path, meta: dict[str, str]) -> str | None:
    version = meta.get("EXPORT_SCHEMA_VERSION")
    if version is None:
        return None
    major = version.split(".")[0].strip()
    if major not in KNOWN_MAJORS:
        shown = version if version.isprintable() and len(version) < 40 else repr(version[:40])
        raise InputError(path, f"Nsight Systems export schema {shown}: major version {major[:10]!r} is not one "
                               f"pastaprof reads ({', '.join(k + '.x' for k in KNOWN_MAJORS)}); export with a "
                               "matching nsys or report the version")
    return version


def _read_file(path: Path, kinds: set[str] | None, notes: list[str], first_rank: int, multi: bool) -> dict[str, Any]:
    """Every wanted table of one export (all processes), the pid -> rank plan and the header."""
    con = connect(path)
    db: Db | None = None
    try:
        db = Db(path, con)
        meta = _meta(db, "META_DATA_EXPORT")
        version = _check_version(path, meta)
        if version is None:
            notes.append(f"{show(path.name)}: no EXPORT_SCHEMA_VERSION in META_DATA_EXPORT: read as schema 3.x")
        clock = nsys_map.clock(db, meta)
        if clock.get("anchor") is None:
            notes.append(f"{show(path.name)}: no TARGET_INFO_SESSION_START_TIME: times are ns since the session "
                         "start, not Unix-epoch time (ranks of other files will not line up)")
        strings = Strings(db)
        try:
            tables = nsys_map.read_tables(db, strings, clock["offset_ns"], kinds)
        except sqlite3.Error as e:
            raise InputError(path, damaged(e)) from None
        plan = _plan_ranks(db, path, tables, notes, first_rank, multi)
        plan["tables"] = tables
        plan["header"] = nsys_map.header(db, meta, version, clock)
        dropped = nsys_map.dropped(db)
        if dropped:
            notes.append(f"{show(path.name)}: not read (no pastaprof kind for them): " + ", ".join(
                f"{t} ({n:,})" for t, n in dropped[:5]) + (" ..." if len(dropped) > 5 else ""))
        return plan
    finally:
        if db is not None:
            db.close()  # also stops chunk readers still queued after an error
        else:
            con.close()


def _plan_ranks(db: Db, path: Path, tables: dict[str, pa.Table], notes: list[str], first_rank: int,
                multi: bool) -> dict[str, Any]:
    """pid -> rank for the processes with CUDA activity, and where the ranks come from."""
    pids: set[int] = set()
    devices: dict[int, set[int]] = {}
    for kind in ("kernel", "memcpy", "memset", "api", "sync"):
        t = tables.get(kind)
        if t is None or not t.num_rows:
            continue
        p = ints(t["pid"], -1)
        pids.update(int(x) for x in _distinct(p) if x >= 0)
        if kind != "api":
            d = ints(t["device"], -1)
            for pid_, dev in set(zip(p.tolist(), d.tolist())) if t.num_rows < 4096 else _pairs(p, d):
                if dev >= 0:
                    devices.setdefault(pid_, set()).add(dev)
    names = {}
    if db.has("PROCESSES") and {"pid", "name"} <= db.columns("PROCESSES"):
        names = {p: n for p, n in db.query("SELECT pid, name FROM PROCESSES") if isinstance(p, int)}
    mpi = nsys_map.mpi_ranks(db)
    ordered = sorted(pids)
    distinct = len({mpi.get(p) for p in ordered}) == len(ordered)
    if mpi and all(p in mpi for p in ordered) and distinct:
        ranks, source = {p: mpi[p] for p in ordered}, "MPI_RANKS"
    elif len(ordered) == 1 and rank_from_name(path) is not None:
        ranks, source = {ordered[0]: rank_from_name(path)}, "file name"
    else:
        ranks, source = {p: first_rank + i for i, p in enumerate(ordered)}, "pid order"
        if len(ordered) > 1 or multi:
            shown = ", ".join(f"pid {p} ({show(str(names.get(p, '?')))}) as rank {ranks[p]}" for p in ordered[:4])
            why = "no MPI_RANKS table" if not mpi else "MPI_RANKS gives them no rank each of their own"
            notes.append(f"{show(path.name)}: {len(ordered)} process{'es' if len(ordered) > 1 else ''} with CUDA "
                         f"activity, {why}: read {shown}{' ...' if len(ordered) > 4 else ''} "
                         "by pid order, a guess")
    if not ordered:
        notes.append(f"{show(path.name)}: no process has CUDA activity (kernels, copies, API calls): no rank to read")
    others = [n for p, n in names.items() if p not in pids]
    if others and ordered:
        notes.append(f"{show(path.name)}: {len(others)} other process{'es' if len(others) > 1 else ''} without CUDA "
                     f"activity not read as ranks ({', '.join(show(str(n)) for n in others[:4])}"
                     f"{' ...' if len(others) > 4 else ''})")
    return {"ranks": ranks, "rank_from": source, "process_names": {p: names.get(p) for p in ordered},
            "devices_used": {p: sorted(devices.get(p, ())) for p in ordered}}


def _pairs(p: np.ndarray, d: np.ndarray) -> set[tuple[int, int]]:
    """Distinct (pid, device) pairs (pids < 2^24, devices clipped to 2^20): one 1-D unique."""
    ok = d >= 0
    p, d = p[ok], d[ok]
    u = _distinct((p << 20) | np.clip(d, -1, (1 << 20) - 1) & ((1 << 20) - 1))
    return {(int(c >> 20), int(c & ((1 << 20) - 1))) for c in u if c >= 0}


def _distinct(a: np.ndarray) -> np.ndarray:
    """The distinct values of ``a`` by hashing (Arrow), not by sorting millions of rows."""
    return np.asarray(pc.unique(pa.array(a)))


class _Order:
    """A table's pids and its rows in time order, computed once for all its ranks."""

    def __init__(self, t: pa.Table) -> None:
        self.pid = ints(t["pid"], -1)
        start = t["start_ns"]
        if start.null_count:
            self.order = np.asarray(pc.sort_indices(t, [("start_ns", "ascending")]))
        else:
            s = ints(start, 0)
            # exports are mostly written in time order: a sort only when they are not
            self.order = (np.arange(len(s)) if bool(np.all(s[1:] >= s[:-1]))
                          else np.argsort(s, kind="stable"))

    def rows(self, t: pa.Table, pid: int, rank: int) -> pa.Table:
        """The rows of process ``pid``, as rank ``rank``, in time order (ties in file order)."""
        sel = self.order[self.pid[self.order] == pid]
        sub = t.take(pa.array(sel))
        return sub.append_column("rank", pa.array(np.full(sub.num_rows, rank, dtype=np.int32)))
