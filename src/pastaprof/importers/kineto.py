"""Importer for PyTorch profiler / Kineto Chrome traces (.json, .json.gz).

The event array is staged to a temporary file (see staging.py) and parsed by
DuckDB's JSON reader into typed columns in one pass; each event kind is then
one SQL projection over that table.  Handles modern Kineto (torch 2.x:
``cpu_op``, ``kernel``, ``args.correlation``), older traces (capitalised
categories, ``"tid": "stream 7"``, links only through ac2g flows) and ROCm
traces (same categories, HIP API names).
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from pastaprof.errors import InputError
from pastaprof.events.schema import conform
from pastaprof.importers.staging import stage_events

# Kineto category (lower-cased) -> pastaprof kind.
CATEGORY_KIND = {
    "kernel": "kernel",
    "gpu_memcpy": "memcpy", "memcpy": "memcpy",
    "gpu_memset": "memset", "memset": "memset",
    "cuda_runtime": "api", "runtime": "api", "cuda_driver": "api", "driver": "api",
    "hip_runtime": "api", "hip_driver": "api",
    "cuda_sync": "sync",
    "cpu_op": "op", "operator": "op",
    "user_annotation": "range", "gpu_user_annotation": "range",
    "python_function": "frame",
}
# Categories understood but not turned into events of their own.
IGNORED_CATEGORIES = {"ac2g", "async", "fwdbwd", "overhead", "trace", "cpu_instant_event"}

# JSON keys pulled out of ``args`` in the single parsing pass (index = position).
ARG_KEYS = [
    "External id", "correlation", "device", "stream", "grid", "block", "registers per thread",
    "shared memory", "bytes", "Input Dims", "Input type", "Sequence number", "Addr", "Bytes",
    "Total Allocated", "Total Reserved", "Device Id", "Device Type", "Python id", "Python parent id",
    "Collective name", "In msg nelems", "Group size", "dtype", "Process Group Ranks", "external id",
]
A = {k: i + 1 for i, k in enumerate(ARG_KEYS)}  # DuckDB lists are 1-based

COLUMNS = (
    "{ph: 'VARCHAR', cat: 'VARCHAR', name: 'VARCHAR', pid: 'VARCHAR', tid: 'VARCHAR', "
    "ts: 'DECIMAL(38,6)', dur: 'DECIMAL(38,6)', id: 'VARCHAR', s: 'VARCHAR', args: 'JSON'}"
)

_DTYPE_BYTES = {"float": 4, "float32": 4, "half": 2, "float16": 2, "bfloat16": 2, "double": 8, "float64": 8,
                "int": 4, "int32": 4, "long": 8, "int64": 8, "long int": 8, "byte": 1, "uint8": 1, "char": 1,
                "int8": 1, "bool": 1, "short": 2, "int16": 2}


def _arg(key: str, typ: str = "BIGINT") -> str:
    if typ == "JSON":
        return f"a[{A[key]}]"
    if typ == "VARCHAR":
        return f"(a[{A[key]}] ->> '$')"
    return f"TRY_CAST(a[{A[key]}] ->> '$' AS {typ})"


def _int_or_digits(col: str) -> str:
    # "7", 7 or "stream 7" -> 7
    return f"COALESCE(TRY_CAST({col} AS BIGINT), TRY_CAST(regexp_extract({col}, '(\\d+)\\s*$', 1) AS BIGINT))"


def _common(rank: int, device: str = "NULL", stream: str = "NULL", corr: str = "NULL") -> str:
    return (
        "start_ns, end_ns, "
        f"CAST({rank} AS INTEGER) AS rank, CAST({device} AS INTEGER) AS device, CAST({stream} AS BIGINT) AS stream, "
        f"{_int_or_digits('pid')} AS pid, {_int_or_digits('tid')} AS tid, CAST({corr} AS BIGINT) AS correlation, name"
    )


def _cats(kind: str) -> str:
    cats = [c for c, k in CATEGORY_KIND.items() if k == kind]
    return "lcat IN (" + ", ".join(f"'{c}'" for c in cats) + ")"


GPU_DEVICE = f"COALESCE({_arg('device', 'INTEGER')}, {_int_or_digits('pid')})"
GPU_STREAM = f"COALESCE({_arg('stream')}, {_int_or_digits('tid')})"
CORR = f"COALESCE({_arg('correlation')}, flow_id)"


def _queries(rank: int) -> dict[str, str]:
    dim = lambda key, i: f"TRY_CAST({_arg(key, 'JSON')}->>'$[{i}]' AS INTEGER)"  # noqa: E731
    return {
        "kernel": f"""SELECT {_common(rank, GPU_DEVICE, GPU_STREAM, CORR)},
            {dim('grid', 0)} AS grid_x, {dim('grid', 1)} AS grid_y, {dim('grid', 2)} AS grid_z,
            {dim('block', 0)} AS block_x, {dim('block', 1)} AS block_y, {dim('block', 2)} AS block_z,
            {_arg('registers per thread', 'INTEGER')} AS registers, {_arg('shared memory')} AS shared_bytes,
            COALESCE({_arg('External id')}, {_arg('external id')}) AS external_id
            FROM ev WHERE ph = 'X' AND {_cats('kernel')}""",
        "memcpy": f"""SELECT {_common(rank, GPU_DEVICE, GPU_STREAM, CORR)}, {_arg('bytes')} AS bytes,
            CASE WHEN regexp_matches(name, 'HtoD|HostToDevice|H2D') THEN 'HtoD'
                 WHEN regexp_matches(name, 'DtoH|DeviceToHost|D2H') THEN 'DtoH'
                 WHEN regexp_matches(name, 'DtoD|DeviceToDevice|D2D') THEN 'DtoD'
                 WHEN regexp_matches(name, 'HtoH|HostToHost|H2H') THEN 'HtoH'
                 WHEN regexp_matches(name, 'PtoP|PeerToPeer|P2P') THEN 'PtoP' ELSE 'unknown' END AS direction,
            COALESCE({_arg('External id')}, {_arg('external id')}) AS external_id
            FROM ev WHERE ph = 'X' AND {_cats('memcpy')}""",
        "memset": f"""SELECT {_common(rank, GPU_DEVICE, GPU_STREAM, CORR)}, {_arg('bytes')} AS bytes,
            COALESCE({_arg('External id')}, {_arg('external id')}) AS external_id
            FROM ev WHERE ph = 'X' AND {_cats('memset')}""",
        "sync": f"""SELECT {_common(rank, GPU_DEVICE, GPU_STREAM, CORR)}, name AS sync_kind
            FROM ev WHERE ph = 'X' AND {_cats('sync')}""",
        "api": f"""SELECT {_common(rank, 'NULL', 'NULL', CORR)},
            CASE WHEN contains(lcat, 'driver') THEN 'driver' ELSE 'runtime' END AS api_kind,
            COALESCE({_arg('External id')}, {_arg('external id')}) AS external_id
            FROM ev WHERE ph = 'X' AND {_cats('api')}""",
        "op": f"""SELECT {_common(rank)},
            COALESCE({_arg('External id')}, {_arg('external id')}) AS external_id,
            {_arg('Sequence number')} AS sequence_id,
            CAST({_arg('Input Dims', 'JSON')} AS VARCHAR) AS input_shapes,
            CAST({_arg('Input type', 'JSON')} AS VARCHAR) AS input_dtypes,
            {_arg('Collective name', 'VARCHAR')} AS collective,
            {_arg('In msg nelems')} AS nelems, {_arg('Group size', 'INTEGER')} AS group_size,
            {_arg('dtype', 'VARCHAR')} AS dtype, CAST({_arg('Process Group Ranks', 'JSON')} AS VARCHAR) AS peers
            FROM ev WHERE ph = 'X' AND {_cats('op')}""",
        "range": f"""SELECT {_common(rank, f"CASE WHEN lcat = 'gpu_user_annotation' THEN {GPU_DEVICE} END",
                                      f"CASE WHEN lcat = 'gpu_user_annotation' THEN {GPU_STREAM} END")},
            CASE WHEN lcat = 'gpu_user_annotation' THEN 'gpu_user' ELSE 'user' END AS domain,
            COALESCE({_arg('External id')}, {_arg('external id')}) AS id
            FROM ev WHERE ph = 'X' AND {_cats('range')}""",
        "frame": f"""SELECT {_common(rank)}, {_arg('Python id')} AS id, {_arg('Python parent id')} AS parent_id,
            CASE WHEN starts_with(name, 'nn.Module: ') THEN NULL
                 ELSE NULLIF(regexp_extract(name, '^(.*)\\((\\d+)\\): ', 1), '') END AS file,
            TRY_CAST(NULLIF(regexp_extract(name, '^(.*)\\((\\d+)\\): ', 2), '') AS INTEGER) AS line,
            CASE WHEN starts_with(name, 'nn.Module: ') THEN substr(name, 12)
                 WHEN regexp_matches(name, '^(.*)\\((\\d+)\\): ') THEN regexp_replace(name, '^(.*)\\((\\d+)\\): ', '')
                 ELSE name END AS function,
            starts_with(name, 'nn.Module: ') AS is_module
            FROM ev WHERE ph = 'X' AND {_cats('frame')}""",
        "tensor": f"""SELECT {_common(rank, _arg('Device Id', 'INTEGER'))},
            CAST({_arg('Addr', 'UBIGINT')} AS UBIGINT) AS address, {_arg('Bytes')} AS bytes,
            {_arg('Total Allocated')} AS total_allocated, {_arg('Total Reserved')} AS total_reserved,
            CASE {_arg('Device Type', 'INTEGER')} WHEN 0 THEN 'cpu' WHEN 1 THEN 'cuda' WHEN 6 THEN 'hip'
                 ELSE CAST({_arg('Device Type', 'INTEGER')} AS VARCHAR) END AS device_type
            FROM ev WHERE lcat = 'cpu_instant_event' AND name = '[memory]'""",
    }


def _connect(threads: int | None = None) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(config={"threads": threads or 2, "memory_limit": "1GB", "preserve_insertion_order": False})
    return con


def import_file(
    path: Path, rank: int | None = None, progress: Callable[[int], None] | None = None,
    tmpdir: str | None = None,
) -> tuple[dict[str, pa.Table], dict[str, Any]]:
    """Import one Kineto trace file: per-kind Arrow tables (unlinked) and metadata.

    ``rank`` overrides the rank found in the trace (``distributedInfo.rank``).
    """
    path = Path(path)
    with tempfile.TemporaryDirectory(prefix="pastaprof-import-", dir=tmpdir) as tmp:
        staged = Path(tmp) / "events.json"
        meta = stage_events(path, staged, progress)
        dist = meta.get("distributedInfo") or {}
        if rank is None:
            r = dist.get("rank") if isinstance(dist, dict) else None
            rank = int(r) if isinstance(r, int) else 0
        base = meta.get("baseTimeNanoseconds", 0)
        base = int(base) if isinstance(base, (int, float)) else 0
        con = _connect()
        try:
            tables, counts = _project(con, staged, rank, base, path)
        finally:
            con.close()
    meta = {k: v for k, v in meta.items() if k != "_bytes"} | {"bytes": meta.get("_bytes", 0)}
    meta["rank"] = rank
    meta["category_counts"] = counts
    return tables, meta


def _project(con, staged: Path, rank: int, base: int, path: Path) -> tuple[dict[str, pa.Table], dict[str, int]]:
    args_list = "[" + ", ".join("'$.\"" + k.replace('"', '\\"') + "\"'" for k in ARG_KEYS) + "]"
    try:
        con.execute(f"""
            CREATE TEMP TABLE raw AS
            SELECT ph, cat, lower(cat) AS lcat, name, pid, tid, ts, dur, id, s,
                   CASE WHEN args IS NOT NULL THEN json_extract(args, {args_list}) END AS a
            FROM read_json(?, format='array', columns={COLUMNS}, maximum_object_size=268435456)
        """, [str(staged)])
    except (duckdb.Error, UnicodeDecodeError) as e:
        raise InputError(path, _describe_duckdb_error(e)) from None
    counts = dict(con.execute("SELECT coalesce(lcat, ''), count(*) FROM raw GROUP BY 1").fetchall())
    bad = con.execute("SELECT count(*) FROM raw WHERE ph IS NULL").fetchone()[0]
    total = con.execute("SELECT count(*) FROM raw").fetchone()[0]
    if total and bad == total:
        raise InputError(path, "no event has a 'ph' field: not a Chrome/Kineto trace")
    con.execute(f"""
        CREATE TEMP TABLE flows AS
        SELECT ph, {_int_or_digits('pid')} AS pid, {_int_or_digits('tid')} AS tid, ts, TRY_CAST(id AS BIGINT) AS fid
        FROM raw WHERE lcat = 'ac2g' AND ph IN ('s', 'f')""")
    has_flows = con.execute("SELECT count(*) FROM flows").fetchone()[0] > 0
    # Events whose correlation lives only in ac2g flows (older traces): borrow the flow id.
    flow_join = (
        "LEFT JOIN flows fl ON fl.ph = (CASE WHEN raw.lcat IN ('kernel','gpu_memcpy','memcpy','gpu_memset','memset') "
        "THEN 'f' ELSE 's' END) AND fl.ts = raw.ts AND fl.pid IS NOT DISTINCT FROM "
        f"{_int_or_digits('raw.pid')} AND fl.tid IS NOT DISTINCT FROM {_int_or_digits('raw.tid')} "
        f"AND raw.a[{A['correlation']}] IS NULL AND raw.ph = 'X'"
    ) if has_flows else ""
    flow_col = "fl.fid AS flow_id" if has_flows else "CAST(NULL AS BIGINT) AS flow_id"
    try:
        con.execute(f"""
            CREATE TEMP TABLE ev AS
            SELECT raw.ph, raw.lcat, raw.name, raw.pid, raw.tid, raw.a, {flow_col},
                   CAST(raw.ts * 1000 AS BIGINT) + {base} AS start_ns,
                   CAST(raw.ts * 1000 AS BIGINT) + {base} + COALESCE(CAST(raw.dur * 1000 AS BIGINT), 0) AS end_ns
            FROM raw {flow_join}
            WHERE raw.ph IN ('X', 'i', 'I') AND raw.ts IS NOT NULL
        """)
        con.execute("DROP TABLE raw")
        tables: dict[str, pa.Table] = {}
        for kind, sql in _queries(rank).items():
            t = con.sql(sql + " ORDER BY start_ns").to_arrow_table()
            tables[kind] = t
    except (duckdb.Error, UnicodeDecodeError) as e:
        raise InputError(path, _describe_duckdb_error(e)) from None
    tables["collective"] = _collectives(tables["op"])
    return tables, counts


def _collectives(op: pa.Table) -> pa.Table:
    """record_param_comms ops carry collective metadata (name, elements, dtype)."""
    import pyarrow.compute as pc

    mask = pc.is_valid(op["collective"])
    t = op.filter(mask)
    dtypes = t["dtype"].to_pylist()
    size = pa.array([_DTYPE_BYTES.get((d or "").lower().replace("c10::", ""), 0) or None for d in dtypes], pa.int64())
    nbytes = pc.multiply(t["nelems"].cast(pa.int64()), size)
    return pa.table({
        "start_ns": t["start_ns"], "end_ns": t["end_ns"], "rank": t["rank"], "device": t["device"],
        "stream": t["stream"], "pid": t["pid"], "tid": t["tid"], "correlation": t["correlation"],
        "name": t["collective"], "bytes": nbytes, "dtype": t["dtype"], "group_size": t["group_size"],
        "peers": t["peers"], "external_id": t["external_id"],
    })


_DUCK_RE = re.compile(r"^[A-Za-z ]*Error: ")
_STAGED_FILE_RE = re.compile(r'\s*in file "[^"]*",?')
_RECORD_RE = re.compile(r"record/value (\d+)")


def _describe_duckdb_error(e: Exception) -> str:
    """One user-facing line for a DuckDB failure on the staged event array (the
    temporary file is not the user's business: its name is removed)."""
    if isinstance(e, UnicodeDecodeError):  # DuckDB quoting a broken value in its own message
        return "a field has the wrong type or invalid text"
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    msg = _STAGED_FILE_RE.sub("", _DUCK_RE.sub("", msg)).strip()
    low = msg.lower()
    rec = _RECORD_RE.search(msg)
    where = f" (event {rec.group(1)})" if rec else ""
    if "expected object" in low:
        return f"traceEvents holds an entry that is not an event object{where}"
    if "malformed json" in low or "unexpected" in low or ("invalid" in low and "json" in low):
        return f"malformed JSON in the event array ({msg})"
    if "could not convert" in low or "conversion" in low or "out of range" in low or "failed to cast" in low:
        return f"a field has the wrong type ({msg})"
    return msg


def finalize(tables: dict[str, pa.Table]) -> dict[str, pa.Table]:
    """Conform imported tables to the event schemas (extra link columns kept aside)."""
    return {kind: conform(kind, t) for kind, t in tables.items()}
