"""Importer for PyTorch profiler / Kineto Chrome traces (.json, .json.gz).

The event array is staged to a temporary file (see staging.py) and parsed by
DuckDB's JSON reader into typed columns in one pass; each event kind is then
one SQL projection over that table.  Handles modern Kineto (torch 2.x:
``cpu_op``, ``kernel``, ``args.correlation``), older traces (capitalised
categories, ``"tid": "stream 7"``, links only through ac2g flows) and ROCm
traces (same categories, HIP API names).
"""

from __future__ import annotations

import math
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from pastaprof.errors import InputError
from pastaprof.events.limits import check_time_range
from pastaprof.importers import chrome_foreign
from pastaprof.importers.kineto_tables import collectives, encode_names, frame_fields
from pastaprof.importers.staging import split_staged, stage_events, stage_plain

# Kineto category (lower-cased) -> pastaprof kind.  Besides CUDA and ROCm, Kineto's other
# backends: MTIA's on-device "CCP" events are its kernels and mtia_runtime its host API
# (newer Kineto folds them into CONCURRENT_KERNEL / RUNTIME); XPU, Gaudi (hpu_op: host
# runtime), Glow and PrivateUse1 backends write runtime/driver calls under their own names.
CATEGORY_KIND = {
    "kernel": "kernel", "mtia_ccp_events": "kernel",
    "gpu_memcpy": "memcpy", "memcpy": "memcpy",
    "gpu_memset": "memset", "memset": "memset",
    "cuda_runtime": "api", "runtime": "api", "cuda_driver": "api", "driver": "api",
    "hip_runtime": "api", "hip_driver": "api", "mtia_runtime": "api", "xpu_runtime": "api", "xpu_driver": "api",
    "privateuse1_runtime": "api", "privateuse1_driver": "api", "glow_runtime": "api", "hpu_op": "api",
    "cuda_sync": "sync", "xpu_sync": "sync",
    "cpu_op": "op", "operator": "op",
    "user_annotation": "range", "gpu_user_annotation": "range",
    "python_function": "frame",
}
# Categories understood but not turned into events of their own.
IGNORED_CATEGORIES = {"ac2g", "async", "fwdbwd", "overhead", "trace", "cpu_instant_event"}
# c10::DeviceType codes (the "Device Type" of Kineto's [memory] events) -> name.
DEVICE_TYPES = {0: "cpu", 1: "cuda", 2: "mkldnn", 3: "opengl", 4: "opencl", 5: "ideep", 6: "hip", 7: "fpga",
                8: "maia", 9: "xla", 10: "vulkan", 11: "metal", 12: "xpu", 13: "mps", 14: "meta", 15: "hpu",
                16: "ve", 17: "lazy", 18: "ipu", 19: "mtia", 20: "privateuse1"}

# JSON keys each kind reads from ``args`` (its projection extracts these, and only these, per event).
KIND_ARGS: dict[str, tuple[str, ...]] = {
    "kernel": ("External id", "external id", "correlation", "device", "stream", "grid", "block",
               "registers per thread", "shared memory"),
    "memcpy": ("External id", "external id", "correlation", "device", "stream", "bytes"),
    "memset": ("External id", "external id", "correlation", "device", "stream", "bytes"),
    "sync": ("correlation", "device", "stream"),
    "api": ("External id", "external id", "correlation"),
    "op": ("External id", "external id", "Sequence number", "Input Dims", "Input type", "Collective name",
           "In msg nelems", "Group size", "dtype", "Process Group Ranks", "Record function id"),
    "range": ("External id", "external id", "device", "stream"),
    "frame": ("Python id", "Python parent id"),
    "tensor": ("Addr", "Bytes", "Total Allocated", "Total Reserved", "Device Id", "Device Type"),
}
# Kinds whose links need other kinds imported too.
KIND_NEEDS: dict[str, tuple[str, ...]] = {"op": ("frame", "api"), "collective": ("op",)}
FLOW_USERS = {"kernel", "memcpy", "memset", "api", "sync"}
ALL_KINDS = (*KIND_ARGS, "collective")

COLUMNS = (
    "{ph: 'VARCHAR', cat: 'VARCHAR', name: 'VARCHAR', pid: 'VARCHAR', tid: 'VARCHAR', "
    "ts: 'DECIMAL(38,6)', dur: 'DECIMAL(38,6)', id: 'VARCHAR', args: 'JSON'}"
)


_MAPPED_SQL = ", ".join(f"'{c}'" for c in CATEGORY_KIND)
_DEVICE_TYPE_WHENS = " ".join(f"WHEN {code} THEN '{name}'" for code, name in DEVICE_TYPES.items())


def clean_devices(value: Any) -> list[dict[str, Any]]:
    """``deviceProperties`` as tools and the run store may trust it: dict entries with an
    integer ``id`` (an integral number or digit string is converted; entries without one
    are dropped), a string ``name``, finite non-negative numbers, other scalar fields."""
    out = []
    for d in value if isinstance(value, list) else []:
        if not isinstance(d, dict):
            continue
        dev_id = _as_int(d.get("id"))
        if dev_id is None or not 0 <= dev_id < 2**31:
            continue
        clean: dict[str, Any] = {"id": dev_id}
        for k, v in d.items():
            if k == "id" or not isinstance(k, str):
                continue
            if k == "name":
                if isinstance(v, str):
                    clean[k] = v
            elif isinstance(v, bool) or v is None or isinstance(v, str):
                clean[k] = v
            elif isinstance(v, (int, float)) and math.isfinite(v) and 0 <= v < 2**63:
                clean[k] = v
        out.append(clean)
    return out


def _as_int(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str) and v.strip().isdigit() and len(v) < 19:
        return int(v)
    return None


def unmapped_categories(counts: dict[str, int]) -> dict[str, int]:
    """The categories of ``counts`` that pastaprof neither maps to a kind nor knows to skip."""
    return {c: n for c, n in counts.items() if c and c not in CATEGORY_KIND and c not in IGNORED_CATEGORIES}


def unread_note(meta: dict[str, Any]) -> str | None:
    """One line on the events of an imported trace that pastaprof did not read (None: all
    were read): categories it does not map (e.g. a backend's own), and events of mapped
    categories with a phase other than complete ('X') or without a timestamp."""
    parts = []
    unknown = unmapped_categories(meta.get("category_counts") or {})
    if unknown:
        top = sorted(unknown.items(), key=lambda kv: -kv[1])
        shown = ", ".join(f"{_short(c)} ({n:,})" for c, n in top[:6]) + (f" and {len(top) - 6} more" if len(top) > 6 else "")
        parts.append(f"{sum(unknown.values()):,} events of categories pastaprof does not map were skipped: {shown}")
    odd = meta.get("unread_phases") or {}
    phases = {k: n for k, n in odd.items() if not k.endswith("(dur<0)")}
    if phases:
        top = list(phases.items())
        shown = ", ".join(f"{_short(c, 60)} {n:,}" for c, n in top[:4]) + (" ..." if len(top) > 4 else "")
        parts.append(f"{sum(phases.values()):,} events skipped for their phase or a missing timestamp (only "
                     f"complete 'X' events with a ts are read): {shown}")
    negative = sum(n for k, n in odd.items() if k.endswith("(dur<0)"))
    if negative:
        parts.append(f"{negative:,} events with a negative duration read as zero-length")
    return "; ".join(parts) or None


def _short(text: str, limit: int = 40) -> str:
    """A category as shown in a note: printable, bounded."""
    text = "".join(ch if ch.isprintable() else "?" for ch in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def expand_kinds(kinds: set[str] | None) -> set[str]:
    """The kinds to import for ``kinds`` (None: all), with what their links need."""
    out = set(ALL_KINDS) if kinds is None else set(kinds) & set(ALL_KINDS)
    changed = True
    while changed:
        changed = False
        for k in list(out):
            for dep in KIND_NEEDS.get(k, ()):
                if dep not in out:
                    out.add(dep)
                    changed = True
    return out


def _int_or_digits(col: str) -> str:
    # "7", 7 or "stream 7" -> 7
    return f"COALESCE(TRY_CAST({col} AS BIGINT), TRY_CAST(regexp_extract({col}, '(\\d+)\\s*$', 1) AS BIGINT))"


def _cats(kind: str) -> list[str]:
    return [c for c, k in CATEGORY_KIND.items() if k == kind]


class _Sql:
    """SQL fragments for one kind's projection: ``a`` is the list of the ``args`` values
    that kind reads (``KIND_ARGS``), extracted in one ``json_extract`` per event."""

    def __init__(self, kinds: set[str]) -> None:
        keys: list[str] = []
        for kind in sorted(kinds):
            for key in KIND_ARGS.get(kind, ()):
                if key not in keys:
                    keys.append(key)
        self.keys = keys
        self.index = {k: i + 1 for i, k in enumerate(keys)}  # DuckDB lists are 1-based

    def extract(self) -> str:
        paths = ", ".join("'$.\"" + k.replace('"', '\\"') + "\"'" for k in self.keys)
        return f"json_extract(args, [{paths}])" if self.keys else "CAST(NULL AS JSON[])"

    def arg(self, key: str, typ: str = "BIGINT") -> str:
        if key not in self.index:
            return "NULL"
        ref = f"a[{self.index[key]}]"
        if typ == "JSON":
            return ref
        if typ == "VARCHAR":
            return f"({ref} ->> '$')"
        return f"TRY_CAST({ref} ->> '$' AS {typ})"

    def ext(self) -> str:
        return f"COALESCE({self.arg('External id')}, {self.arg('external id')})"

    def gpu_device(self) -> str:
        return f"COALESCE({self.arg('device', 'INTEGER')}, {_int_or_digits('pid')})"

    def gpu_stream(self) -> str:
        return f"COALESCE({self.arg('stream')}, {_int_or_digits('tid')})"

    def common(self, rank: int, device: str = "NULL", stream: str = "NULL", corr: bool = False) -> str:
        c = f"COALESCE({self.arg('correlation')}, flow_id)" if corr else "NULL"
        return (
            "start_ns, end_ns, "
            f"CAST({rank} AS INTEGER) AS rank, CAST({device} AS INTEGER) AS device, CAST({stream} AS BIGINT) AS stream, "
            f"{_int_or_digits('pid')} AS pid, {_int_or_digits('tid')} AS tid, CAST({c} AS BIGINT) AS correlation, name"
        )

    def queries(self, rank: int) -> dict[str, str]:
        arg, ext = self.arg, self.ext()
        dev, stream = self.gpu_device(), self.gpu_stream()
        dim = lambda key, i: f"TRY_CAST({arg(key, 'JSON')}->>'$[{i}]' AS INTEGER)"  # noqa: E731
        direction = """CASE WHEN regexp_matches(name, 'HtoD|HostToDevice|H2D') THEN 'HtoD'
                 WHEN regexp_matches(name, 'DtoH|DeviceToHost|D2H') THEN 'DtoH'
                 WHEN regexp_matches(name, 'DtoD|DeviceToDevice|D2D') THEN 'DtoD'
                 WHEN regexp_matches(name, 'HtoH|HostToHost|H2H') THEN 'HtoH'
                 WHEN regexp_matches(name, 'PtoP|PeerToPeer|P2P') THEN 'PtoP' ELSE 'unknown' END"""
        gpu_range = "lcat = 'gpu_user_annotation'"
        return {
            "kernel": f"""SELECT {self.common(rank, dev, stream, True)},
                {dim('grid', 0)} AS grid_x, {dim('grid', 1)} AS grid_y, {dim('grid', 2)} AS grid_z,
                {dim('block', 0)} AS block_x, {dim('block', 1)} AS block_y, {dim('block', 2)} AS block_z,
                {arg('registers per thread', 'INTEGER')} AS registers, {arg('shared memory')} AS shared_bytes,
                {ext} AS external_id FROM evk""",
            "memcpy": f"""SELECT {self.common(rank, dev, stream, True)}, {arg('bytes')} AS bytes,
                {direction} AS direction, {ext} AS external_id FROM evk""",
            "memset": f"""SELECT {self.common(rank, dev, stream, True)}, {arg('bytes')} AS bytes,
                {ext} AS external_id FROM evk""",
            "sync": f"""SELECT {self.common(rank, dev, stream, True)}, name AS sync_kind FROM evk""",
            "api": f"""SELECT {self.common(rank, corr=True)},
                CASE WHEN contains(lcat, 'driver') THEN 'driver' ELSE 'runtime' END AS api_kind,
                {ext} AS external_id FROM evk""",
            "op": f"""SELECT {self.common(rank)}, {ext} AS external_id,
                {arg('Sequence number')} AS sequence_id, {arg('Record function id')} AS rf_id,
                CAST({arg('Input Dims', 'JSON')} AS VARCHAR) AS input_shapes,
                CAST({arg('Input type', 'JSON')} AS VARCHAR) AS input_dtypes,
                {arg('Collective name', 'VARCHAR')} AS collective,
                {arg('In msg nelems')} AS nelems, {arg('Group size', 'INTEGER')} AS group_size,
                {arg('dtype', 'VARCHAR')} AS dtype, CAST({arg('Process Group Ranks', 'JSON')} AS VARCHAR) AS peers
                FROM evk""",
            "range": f"""SELECT {self.common(rank, f"CASE WHEN {gpu_range} THEN {dev} END",
                                             f"CASE WHEN {gpu_range} THEN {stream} END")},
                CASE WHEN {gpu_range} THEN 'gpu_user' ELSE 'user' END AS domain, {ext} AS id
                FROM evk""",
            # file, line, function and is_module come from the name: see kineto_tables.frame_fields
            "frame": f"""SELECT {self.common(rank)}, {arg('Python id')} AS id, {arg('Python parent id')} AS parent_id
                FROM evk""",
            "tensor": f"""SELECT {self.common(rank, arg('Device Id', 'INTEGER'))},
                CAST({arg('Addr', 'UBIGINT')} AS UBIGINT) AS address, {arg('Bytes')} AS bytes,
                {arg('Total Allocated')} AS total_allocated, {arg('Total Reserved')} AS total_reserved,
                CASE {arg('Device Type', 'INTEGER')} {_DEVICE_TYPE_WHENS}
                     ELSE CAST({arg('Device Type', 'INTEGER')} AS VARCHAR) END AS device_type
                FROM evk""",
        }

    @staticmethod
    def kind_case(kinds: set[str]) -> str:
        """SQL giving each raw event its pastaprof kind (NULL: not wanted)."""
        whens = []
        for kind in sorted(kinds & set(KIND_ARGS)):
            if kind == "tensor":
                whens.append("WHEN lcat = 'cpu_instant_event' AND name = '[memory]' THEN 'tensor'")
            else:
                cats = ", ".join(f"'{c}'" for c in _cats(kind))
                whens.append(f"WHEN ph = 'X' AND lcat IN ({cats}) THEN '{kind}'")
        if kinds & FLOW_USERS:
            whens.append("WHEN lcat IN ('ac2g', 'async') AND ph IN ('s', 'f') THEN 'flow'")
        return "CASE " + " ".join(whens) + " END" if whens else "NULL"


def _kind_query(kind: str, rank: int) -> str:
    """The projection of one kind: its events of ``ev`` with only its own ``args`` keys
    extracted (each event's JSON is parsed for the few keys its kind reads, not for the
    union of every wanted kind's keys, and the parse table holds no list per event)."""
    sql = _Sql({kind})
    return (f"WITH evk AS (SELECT *, {sql.extract()} AS a FROM ev WHERE kind = '{kind}') "
            + sql.queries(rank)[kind])


MEMORY_LIMIT = "600MB"  # DuckDB's share; beyond it, it spills to the import's temporary directory
THREADS = 2           # DuckDB threads; the staged array is cut into this many files
MAX_EVENT_BYTES = 16 << 20  # one JSON event may be this large (DuckDB buffers it per thread)


def _connect(threads: int | None = None, tmp: str | None = None) -> duckdb.DuckDBPyConnection:
    config = {"threads": threads or THREADS, "memory_limit": MEMORY_LIMIT, "preserve_insertion_order": False}
    if tmp is not None:  # spill files stay in our temporary directory, never in the cwd
        config["temp_directory"] = tmp
    return duckdb.connect(config=config)


def import_file(
    path: Path, rank: int | None = None, progress: Callable[[int], None] | None = None,
    tmpdir: str | None = None, kinds: set[str] | None = None,
) -> tuple[dict[str, pa.Table], dict[str, Any]]:
    """Import one Kineto trace file: per-kind Arrow tables (unlinked) and metadata.

    ``kinds``: import only these kinds (and what linking them needs); None: all.
    Skipping kinds nobody consumes is what makes ``analyze -t kernels`` fast.
    ``rank`` overrides the rank found in the trace (``distributedInfo.rank``).
    """
    path = Path(path)
    wanted = expand_kinds(kinds)
    with tempfile.TemporaryDirectory(prefix="pastaprof-import-", dir=tmpdir) as tmp:
        staged = Path(tmp) / "events.json"
        fast = stage_plain(path, staged, THREADS, progress)  # a big plain file: its events are not read here
        meta, files = fast or _stage_exactly(path, staged, progress)
        given = rank
        rank, base = _rank_and_base(meta, given)
        try:
            tables, counts, phases = _parse(files, rank, base, path, wanted, tmp)
        except InputError:
            if fast is None:
                raise
            # the tail's guess of where the array closes was wrong, or the trace is bad:
            # what the exact path reads (or says) stands
            meta, files = _stage_exactly(path, staged, progress)
            rank, base = _rank_and_base(meta, given)
            tables, counts, phases = _parse(files, rank, base, path, wanted, tmp)
    check_time_range(tables, path)
    meta = {k: v for k, v in meta.items() if k != "_bytes"} | {"bytes": meta.get("_bytes", 0)}
    meta["rank"] = rank
    meta["category_counts"] = counts
    meta["unread_phases"] = phases
    meta["kinds"] = sorted(wanted)
    return tables, meta


def _stage_exactly(path: Path, staged: Path, progress: Callable[[int], None] | None) -> tuple[dict[str, Any], list[Path]]:
    meta = stage_events(path, staged, progress)
    return meta, split_staged(staged, THREADS)


def _rank_and_base(meta: dict[str, Any], rank: int | None) -> tuple[int, int]:
    """The rank (given, else ``distributedInfo.rank``, else 0) and the ns offset of ``ts``;
    cleans ``deviceProperties`` in place."""
    if "deviceProperties" in meta:
        meta["deviceProperties"] = clean_devices(meta["deviceProperties"])
    dist = meta.get("distributedInfo") or {}
    if rank is None:
        r = dist.get("rank") if isinstance(dist, dict) else None
        rank = int(r) if isinstance(r, int) else 0
    base = meta.get("baseTimeNanoseconds", 0)
    base = int(base) if isinstance(base, (int, float)) and abs(base) < 2**62 else 0
    return rank, base


def _parse(files: list[Path], rank: int, base: int, path: Path, kinds: set[str],
           tmp: str) -> tuple[dict[str, pa.Table], dict[str, int], dict[str, int]]:
    con = _connect(tmp=tmp)
    try:
        return _project(con, files, rank, base, path, kinds)
    finally:
        con.close()


def _project(con, files: list[Path], rank: int, base: int, path: Path,
             kinds: set[str]) -> tuple[dict[str, pa.Table], dict[str, int], dict[str, int]]:
    kind = _Sql.kind_case(kinds)
    when = "kind IS NOT NULL"
    try:
        # One parallel parse of the whole array.  Every event keeps its category (for
        # the manifest's counts); only wanted events keep their fields, ``args`` as JSON text.
        con.execute(f"""
            CREATE TEMP TABLE ev AS
            WITH src AS (
                SELECT *, lower(cat) AS lcat FROM read_json(?, format='array', columns={COLUMNS},
                                                           maximum_object_size={MAX_EVENT_BYTES})),
            k0 AS (SELECT *, {kind} AS kind FROM src),
            k AS (SELECT *, CASE WHEN {when} THEN CAST(ts * 1000 AS BIGINT) + {base} END AS t_ns FROM k0)
            SELECT lcat, kind, ph IS NOT NULL AS has_ph,
                   (ph = 'X' AND ts IS NOT NULL AND lcat IN ({_MAPPED_SQL}))
                   OR (lcat = 'cpu_instant_event' AND name = '[memory]') AS readable,
                   CASE WHEN lcat IS NULL OR lcat NOT IN ({_MAPPED_SQL}) THEN NULL
                        WHEN ph IS DISTINCT FROM 'X' THEN 'ph=' || coalesce(to_json(ph)::VARCHAR, 'none')
                        WHEN ts IS NULL THEN 'no ts'
                        WHEN dur < 0 THEN 'dur<0' END AS odd_ph,
                   CASE WHEN {when} THEN ph END AS ph, CASE WHEN {when} THEN name END AS name,
                   CASE WHEN {when} THEN pid END AS pid, CASE WHEN {when} THEN tid END AS tid,
                   t_ns AS start_ns,  -- ts in integer ns, computed once, for wanted events only
                   CASE WHEN {when} THEN t_ns + GREATEST(COALESCE(CAST(dur * 1000 AS BIGINT), 0), 0) END AS end_ns,
                   CASE WHEN kind = 'flow' THEN TRY_CAST(id AS BIGINT) END AS fid,
                   CASE WHEN {when} AND kind <> 'flow' THEN args END AS args,
                   CAST(NULL AS BIGINT) AS flow_id
            FROM k
        """, [[str(f) for f in files]])
        counts = dict(con.execute("SELECT coalesce(lcat, ''), count(*) FROM ev GROUP BY 1").fetchall())
        phases = {f"{c} ({why})": n for c, why, n in con.execute(
            "SELECT lcat, odd_ph, count(*) FROM ev WHERE odd_ph IS NOT NULL GROUP BY 1, 2 ORDER BY 3 DESC").fetchall()}
        total, with_ph, readable = con.execute(
            "SELECT count(*), count(*) FILTER (has_ph), count(*) FILTER (readable) FROM ev").fetchall()[0]
        if total and not with_ph:
            raise InputError(path, "no event has a 'ph' field: not a Chrome/Kineto trace")
        if not readable:
            raise InputError(path, chrome_foreign.describe(con, files, counts, phases) if total
                             else "the event array is empty: the trace holds no events")
        con.execute("DELETE FROM ev WHERE kind IS NULL OR start_ns IS NULL AND kind <> 'flow'")
        tables = {}
        borrowed = False
        for k in KIND_ARGS:
            if k in kinds:  # fetched one by one, names dictionary-encoded at once: a lower peak
                t = con.sql(_kind_query(k, rank) + " ORDER BY start_ns").to_arrow_table()
                if k in FLOW_USERS and not borrowed and t["correlation"].null_count:
                    # an older trace: the ids come from flows, for this kind and the ones after
                    # it (those before it had every correlation)
                    _borrow_flow_ids(con)
                    borrowed = True
                    t = con.sql(_kind_query(k, rank) + " ORDER BY start_ns").to_arrow_table()
                tables[k] = encode_names(k, frame_fields(con, t) if k == "frame" else t)
                con.execute(f"DELETE FROM ev WHERE kind = '{k}'")
    except (duckdb.Error, UnicodeDecodeError) as e:
        raise InputError(path, _describe_duckdb_error(e)) from None
    if "collective" in kinds:
        tables["collective"] = collectives(tables["op"])
    return tables, counts, phases


#: Where a call and one GPU activity are tied only by an External id that no other call or activity
#: has (no correlation, no flow where they are): their correlation, past any id a trace numbers.
EXTERNAL_TIE = 1 << 40


def _borrow_flow_ids(con) -> None:
    """Older traces link GPU work to its launch only through ac2g/async flows: an
    activity (or API call) without ``args.correlation`` takes the id of the flow
    that ends (starts) at the same thread and time.  Where several events and flows meet
    there (integer-microsecond traces: launches of under a microsecond), an event takes the
    flow numbered like its own External id (ROCm traces number both alike), else the events
    and the flows left are paired in order (shorter event, lower flow id first), never two
    events one flow.  A call and a GPU activity left without either, whose External id is theirs
    alone, are tied by it.  Run only once a projection found an event without one (reading every
    event's ``args`` to find out first would parse them all once more)."""
    corr = "TRY_CAST(json_extract(ev.args, '$.\"correlation\"') ->> '$' AS BIGINT)"
    ext = "TRY_CAST(json_extract(ev.args, '$.\"External id\"') ->> '$' AS BIGINT)"
    con.execute(f"""
        CREATE TEMP TABLE fl AS SELECT ph, {_int_or_digits('pid')} AS p, {_int_or_digits('tid')} AS t, start_ns, fid
        FROM ev WHERE kind = 'flow' AND fid IS NOT NULL;
        CREATE TEMP TABLE wants AS
        SELECT rowid AS rid, CASE WHEN kind = 'api' THEN 's' ELSE 'f' END AS ph, {_int_or_digits('pid')} AS p,
               {_int_or_digits('tid')} AS t, start_ns, end_ns, {ext} AS ext
        FROM ev WHERE kind IN ('kernel','memcpy','memset','api','sync') AND {corr} IS NULL;
        UPDATE ev SET flow_id = fl.fid FROM wants w, fl
        WHERE ev.rowid = w.rid AND fl.fid = w.ext AND fl.ph = w.ph AND fl.start_ns = w.start_ns
          AND fl.p IS NOT DISTINCT FROM w.p AND fl.t IS NOT DISTINCT FROM w.t;
        UPDATE ev SET flow_id = pair.fid FROM (
            WITH e AS (SELECT w.*, row_number() OVER (PARTITION BY w.ph, w.p, w.t, w.start_ns
                                                      ORDER BY w.end_ns, w.rid) AS k
                       FROM wants w JOIN ev ON ev.rowid = w.rid WHERE ev.flow_id IS NULL),
                 f AS (SELECT fl.*, row_number() OVER (PARTITION BY fl.ph, fl.p, fl.t, fl.start_ns ORDER BY fl.fid) AS k
                       FROM fl WHERE fl.fid NOT IN (SELECT flow_id FROM ev WHERE flow_id IS NOT NULL))
            SELECT e.rid, f.fid FROM e JOIN f ON f.ph = e.ph AND f.start_ns = e.start_ns AND f.k = e.k
              AND f.p IS NOT DISTINCT FROM e.p AND f.t IS NOT DISTINCT FROM e.t) AS pair
        WHERE ev.rowid = pair.rid;
        UPDATE ev SET flow_id = one.fid FROM (
            WITH held AS (SELECT w.ph, ev.flow_id AS fid FROM wants w JOIN ev ON ev.rowid = w.rid
                          WHERE ev.flow_id IS NOT NULL),
                 cand AS (SELECT w.rid, w.ph, w.ext, ev.flow_id AS fid FROM wants w JOIN ev ON ev.rowid = w.rid
                          WHERE w.ext >= 0 AND w.ext < {EXTERNAL_TIE}),
                 tied AS (SELECT ext, max(fid) FILTER (WHERE ph = 'f') AS act, max(fid) FILTER (WHERE ph = 's') AS call
                          FROM cand GROUP BY ext
                          HAVING count(*) FILTER (WHERE ph = 's') = 1 AND count(*) FILTER (WHERE ph = 'f') = 1)
            -- the side that has an id gives it, unless a call (an activity) of its own holds it already
            SELECT cand.rid, coalesce(tied.act, tied.call, {EXTERNAL_TIE} + cand.ext) AS fid
            FROM cand JOIN tied USING (ext)
            WHERE cand.fid IS NULL AND (tied.act IS NULL OR tied.call IS NULL)
              AND (tied.act IS NULL OR tied.act NOT IN (SELECT fid FROM held WHERE ph = 's'))
              AND (tied.call IS NULL OR tied.call NOT IN (SELECT fid FROM held WHERE ph = 'f'))) AS one
        WHERE ev.rowid = one.rid;
        DROP TABLE fl; DROP TABLE wants;
    """)


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
    msg = _short(msg, 300)  # DuckDB quotes the event: printable and bounded
    low = msg.lower()
    rec = _RECORD_RE.search(msg)
    where = f" (event {rec.group(1)})" if rec else ""
    if "expected object" in low:
        return f"traceEvents holds an entry that is not an event object{where}"
    if "malformed json" in low or "unexpected" in low or ("invalid" in low and "json" in low):
        return f"malformed JSON in the event array ({msg})"
    if "duplicate key" in low:
        return f"an event has a key twice{where} ({msg})"
    if "decimal value" in low and "to type int64" in low:  # ts * 1000 beyond int64 ns
        return (f"a timestamp is beyond int64 nanoseconds (ts and dur are read in µs, as the Chrome trace "
                f"format defines them: are these ns?) ({msg})")
    if "could not convert" in low or "conversion" in low or "out of range" in low or "failed to cast" in low:
        return f"a field has the wrong type ({msg})"
    return msg
