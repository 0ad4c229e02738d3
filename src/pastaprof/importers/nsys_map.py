"""The mapping from Nsight Systems export tables to pastaprof's raw tables (see docs/importers.md).

Every function here works on whole tables with Arrow / NumPy: the per-row work
happens in SQLite (integer CSV) and Arrow (parsing, regexes over names).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pastaprof.importers.nsys_sql import Db, Strings, ints

KERNEL, MEMCPY, MEMSET = "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"
SYNC, RUNTIME, NVTX = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS"
CUDA_EVENT, OSRT, MEMORY = "CUPTI_ACTIVITY_KIND_CUDA_EVENT", "OSRT_API", "CUDA_GPU_MEMORY_USAGE_EVENTS"
READ_TABLES = (KERNEL, MEMCPY, MEMSET, SYNC, RUNTIME, NVTX, CUDA_EVENT, OSRT, MEMORY)
# Tables with events pastaprof has no kind for (counted in a note when they hold rows).
DROPPED_TABLES = ("CUPTI_ACTIVITY_KIND_GRAPH_TRACE", "CUDA_GRAPH_EVENTS", "CUDA_GRAPH_NODE_EVENTS", "GPU_METRICS",
                  "CUDA_UM_CPU_PAGE_FAULT_EVENTS", "CUDA_UM_GPU_PAGE_FAULT_EVENTS", "SCHED_EVENTS",
                  "COMPOSITE_EVENTS", "MPI_P2P_EVENTS", "MPI_COLLECTIVES_EVENTS", "CUDNN_EVENTS", "CUBLAS_EVENTS",
                  "PROFILER_OVERHEAD", "CUPTI_ACTIVITY_KIND_OVERHEAD", "DIAGNOSTIC_EVENT")

# CUDA_MEMCPY_KIND_* -> the event model's direction (arrays count as device memory).
COPY_DIRECTION = {1: "HtoD", 2: "DtoH", 3: "HtoD", 4: "DtoH", 5: "DtoD", 6: "DtoD", 7: "DtoD", 8: "DtoD",
                  9: "HtoH", 10: "PtoP", 11: "HtoD", 12: "DtoH", 13: "DtoD"}
MEM_KIND = {0: "Pageable", 1: "Pinned", 2: "Device", 3: "Array", 4: "Managed", 5: "Device Static",
            6: "Managed Static"}
ALLOC_KIND = {0: "pageable", 1: "pinned", 2: "device", 3: "array", 4: "managed", 5: "device", 6: "managed"}
# CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_* -> Kineto's cuda_sync names.
SYNC_NAME = {0: "Unknown Sync", 1: "Event Sync", 2: "Stream Wait Event", 3: "Stream Sync", 4: "Context Sync"}
NVTX_RANGE_TYPES = (59, 60)   # NvtxPushPopRange, NvtxStartEndRange (marks, 34, are instants: dropped)
# torch.autograd.profiler.emit_nvtx / record_function under nvtx: "aten::mm, seq = 12, op_id = 34, sizes = [...]"
OP_RE = r"^(?P<name>.*?)(?:, seq = (?P<seq>\d+))?, op_id = (?P<opid>\d+)(?:, sizes = (?P<sizes>\[.*?\]\]?))?(?:, |$)"
API_SUFFIX_RE = r"_v\d+$"      # cudaLaunchKernel_v7000 -> cudaLaunchKernel (the CUPTI/Kineto name)


def clock(db: Db, meta: dict[str, str]) -> dict[str, Any]:
    """The offset that turns the export's times into Unix-epoch ns, and what it came from."""
    normalized = meta.get("EXPORT_PARAM_TIME_NORMALIZE", "false").strip().lower() == "true"
    t = "TARGET_INFO_SESSION_START_TIME"
    if db.has(t) and "utcEpochNs" in db.columns(t):
        sys_col = "systemClockNs" if "systemClockNs" in db.columns(t) else "NULL"
        rows = db.query(f"SELECT CAST(utcEpochNs AS INTEGER), CAST({sys_col} AS INTEGER) FROM {t} LIMIT 1")
        if rows and isinstance(rows[0][0], int) and 0 < rows[0][0] < 1 << 62:
            utc, sysns = rows[0]
            sysns = sysns if isinstance(sysns, int) and 0 <= sysns < 1 << 62 else 0
            offset = utc if normalized else utc - sysns
            return {"domain": "unix_epoch_ns", "offset_ns": offset, "anchor": f"{t}.utcEpochNs",
                    "method": "t + utcEpochNs (export with --ts-normalize)" if normalized
                    else "t - systemClockNs + utcEpochNs", "utcEpochNs": utc, "systemClockNs": sysns}
    return {"domain": "nsys_session_ns", "offset_ns": 0, "anchor": None, "method": "the export's own times"}


def header(db: Db, meta: dict[str, str], version: str | None, clk: dict[str, Any]) -> dict[str, Any]:
    """Manifest facts of one export: schema, versions, devices, host, command."""
    env = {}
    t = "TARGET_INFO_SYSTEM_ENV"
    if db.has(t) and {"name", "value"} <= db.columns(t):
        env = {n: v for n, v in db.query(f"SELECT name, value FROM {t}") if isinstance(n, str) and isinstance(v, str)}
    capture = {}
    t = "META_DATA_CAPTURE"
    if db.has(t) and {"name", "value"} <= db.columns(t):
        capture = {n: v for n, v in db.query(f"SELECT name, value FROM {t} WHERE name LIKE 'PROCESS_0:%'")
                   if isinstance(n, str) and isinstance(v, str)}
    args = [capture[k] for k in sorted((k for k in capture if k.startswith("PROCESS_0:ARGUMENT_")),
                                       key=lambda k: int(k.rsplit("_", 1)[1]) if k.rsplit("_", 1)[1].isdigit() else 0)]
    command = [capture["PROCESS_0:COMMAND"], *args] if "PROCESS_0:COMMAND" in capture else None
    versions = {"nsys": meta.get("EXPORT_PRODUCT_VERSION"), "export_schema": version,
                "cuda_driver_version": env.get("CudaDriverVersion"), "nvidia_driver": env.get("NvDriverVersion")}
    return {"schema_version": version, "versions": {k: v for k, v in versions.items() if v},
            "host": env.get("Hostname") or meta.get("EXPORT_HOST"), "command": command, "clock": clk,
            "devices": devices(db)}


def devices(db: Db) -> list[dict[str, Any]]:
    t = "TARGET_INFO_GPU"
    if not db.has(t) or "id" not in db.columns(t):
        return []
    cols = db.columns(t)
    want = {"name": "name", "smCount": "numSms", "totalMemory": "totalGlobalMem", "computeMajor": "computeMajor",
            "computeMinor": "computeMinor", "chipName": "chipName", "busLocation": "busLocation"}
    have = [c for c in want if c in cols]
    out = []
    for row in db.query(f"SELECT id{''.join(', ' + c for c in have)} FROM {t}"):
        if not isinstance(row[0], int) or not 0 <= row[0] < 2**31:
            continue
        d: dict[str, Any] = {"id": row[0]}
        for c, v in zip(have, row[1:]):
            if isinstance(v, (str, int)) and not isinstance(v, bool):
                d[want[c]] = v
        out.append(d)
    return out


def mpi_ranks(db: Db) -> dict[int, int]:
    """pid -> rank from ``MPI_RANKS`` (empty when absent)."""
    t = "MPI_RANKS"
    if not db.has(t) or not {"globalTid", "rank"} <= db.columns(t):
        return {}
    rows = db.query(f"SELECT DISTINCT (CAST(globalTid AS INTEGER) >> 24) & 16777215, CAST(rank AS INTEGER) FROM {t}")
    return {p: r for p, r in rows if isinstance(p, int) and isinstance(r, int) and 0 <= r < 2**31}


def dropped(db: Db) -> list[tuple[str, int]]:
    out = []
    for t in DROPPED_TABLES:
        if db.has(t):
            n = db.query(f'SELECT count(*) FROM "{t}"')[0][0]
            if n:
                out.append((t, n))
    return out


def _i32(t: pa.Table, c: str) -> pa.Array:
    return pc.cast(t[c], pa.int32(), safe=False)


def _pid(col: pa.ChunkedArray) -> pa.Array:
    g = ints(col, -1)
    return pa.array((g >> 24) & 0xFFFFFF, pa.int64(), mask=g < 0)


def _tid(col: pa.ChunkedArray) -> pa.Array:
    g = ints(col, -1)
    return pa.array(g & 0xFFFFFF, pa.int64(), mask=g < 0)


def _times(t: pa.Table, offset: int, start: str = "start", end: str = "end") -> dict[str, pa.Array]:
    s = pc.add(t[start], offset)
    e = pc.add(t[end], offset) if end in t.column_names else s
    return {"start_ns": s, "end_ns": pc.max_element_wise(e, s)}


def _coded_names(codes: np.ndarray, name_of) -> pa.DictionaryArray:
    """Names made from small integer codes (copy kinds, sync types): one string per distinct code."""
    uniq, inv = np.unique(codes, return_inverse=True)
    return pa.DictionaryArray.from_arrays(pa.array(inv.astype(np.int32)), pa.array([name_of(int(c)) for c in uniq]))


def _gpu_common(db: Db, table: str) -> dict[str, str]:
    return {"start": db.int_expr(table, "start"), "end": db.int_expr(table, "end"),
            "device": db.int_expr(table, "deviceId"), "stream": db.int_expr(table, "streamId"),
            "correlation": db.int_expr(table, "correlationId"), "gpid": db.int_expr(table, "globalPid")}


def _gpu_table(t: pa.Table, offset: int) -> dict[str, Any]:
    return {**_times(t, offset), "device": _i32(t, "device"), "stream": t["stream"], "pid": _pid(t["gpid"]),
            "tid": t["stream"], "correlation": t["correlation"]}


def _kernel_exprs(db: Db) -> dict[str, str]:
    e = _gpu_common(db, KERNEL)
    for c in ("gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ", "registersPerThread", "staticSharedMemory",
              "dynamicSharedMemory", "demangledName", "shortName"):
        e[c] = db.int_expr(KERNEL, c)
    return e


def kernels(db: Db, strings: Strings, offset: int) -> pa.Table:
    t = db.fetch(KERNEL, _kernel_exprs(db))
    idx = strings.index(t["demangledName"])
    idx = np.where(idx >= 0, idx, strings.index(t["shortName"]))
    shared = pa.array(ints(t["staticSharedMemory"], 0) + ints(t["dynamicSharedMemory"], 0))
    return pa.table({**_gpu_table(t, offset), "name": strings.dictionary(idx),
                     "grid_x": _i32(t, "gridX"), "grid_y": _i32(t, "gridY"), "grid_z": _i32(t, "gridZ"),
                     "block_x": _i32(t, "blockX"), "block_y": _i32(t, "blockY"), "block_z": _i32(t, "blockZ"),
                     "registers": _i32(t, "registersPerThread"), "shared_bytes": shared})


def memcpys(db: Db, offset: int) -> pa.Table:
    e = _gpu_common(db, MEMCPY) | {c: db.int_expr(MEMCPY, c) for c in ("bytes", "copyKind", "srcKind", "dstKind")}
    t = db.fetch(MEMCPY, e)
    kind = ints(t["copyKind"], 0)
    src, dst = (np.clip(ints(t[c], 7), 0, 255) for c in ("srcKind", "dstKind"))
    code = (np.clip(kind, 0, 255) << 16) | (src << 8) | dst
    name = _coded_names(code, lambda c: f"Memcpy {COPY_DIRECTION.get(c >> 16, 'unknown')} "
                                        f"({MEM_KIND.get((c >> 8) & 255, 'Unknown')} -> {MEM_KIND.get(c & 255, 'Unknown')})")
    direction = _coded_names(kind, lambda c: COPY_DIRECTION.get(c, "unknown"))
    return pa.table({**_gpu_table(t, offset), "name": name, "bytes": t["bytes"], "direction": direction})


def memsets(db: Db, offset: int) -> pa.Table:
    e = _gpu_common(db, MEMSET) | {c: db.int_expr(MEMSET, c) for c in ("bytes", "memKind")}
    t = db.fetch(MEMSET, e)
    mk = ints(t["memKind"], 7)
    return pa.table({**_gpu_table(t, offset), "bytes": t["bytes"],
                     "name": _coded_names(mk, lambda c: f"Memset ({MEM_KIND.get(c, 'Unknown')})")})


def syncs(db: Db, offset: int) -> pa.Table:
    """Synchronizations, and CUDA event records as instants on their stream."""
    parts = []
    if db.has(SYNC):
        e = _gpu_common(db, SYNC) | {"syncType": db.int_expr(SYNC, "syncType")}
        t = db.fetch(SYNC, e)
        st = ints(t["syncType"], 0)
        names = _coded_names(st, lambda c: SYNC_NAME.get(c, "Unknown Sync"))
        parts.append(pa.table({**_gpu_table(t, offset), "name": names, "sync_kind": names}))
    if db.has(CUDA_EVENT):
        ts = "start" if "start" in db.columns(CUDA_EVENT) else "timestamp"
        e = _gpu_common(db, CUDA_EVENT) | {"start": db.int_expr(CUDA_EVENT, ts), "end": db.int_expr(CUDA_EVENT, ts)}
        ev = db.fetch(CUDA_EVENT, e)
        n = _coded_names(np.zeros(ev.num_rows, dtype=np.int64), lambda c: "Event Record")
        parts.append(pa.table({**_gpu_table(ev, offset), "name": n, "sync_kind": n}))
    return pa.concat_tables(parts, promote_options="permissive")


def _api_exprs(db: Db) -> dict[str, str]:
    return {c: db.int_expr(RUNTIME, c) for c in ("start", "end", "globalTid", "correlationId", "nameId", "eventClass")}


def api_calls(db: Db, strings: Strings, offset: int) -> pa.Table:
    t = db.fetch(RUNTIME, _api_exprs(db))
    idx = strings.index(t["nameId"])
    clean = pc.replace_substring_regex(pa.array(strings.values, pa.string()), API_SUFFIX_RE, "")
    names = pa.DictionaryArray.from_arrays(pa.array(idx.astype(np.int32), mask=idx < 0), clean)
    cls = ints(t["eventClass"], -1)
    if t.num_rows and (cls < 0).all():  # no eventClass column: the name says (cu* is the driver API)
        low = pc.fill_null(pc.starts_with(names.cast(pa.string()), "cuda"), True)
        cls = np.where(np.asarray(low), 0, 1)
    kind = _coded_names(cls == 1, lambda c: "driver" if c else "runtime")
    return pa.table({**_times(t, offset), "pid": _pid(t["globalTid"]), "tid": _tid(t["globalTid"]),
                     "correlation": t["correlationId"], "name": names, "api_kind": kind})


def nvtx(db: Db, strings: Strings, offset: int) -> tuple[pa.Table, pa.Table]:
    """NVTX push/pop and start/end ranges: (ranges, ops).  PyTorch's op ranges
    (``name, seq = N, op_id = N``) are ops; every other range is a range."""
    inline = strings.add_inline(db, NVTX, "text", "nvtx_text")
    e = {c: db.int_expr(NVTX, c) for c in ("start", "end", "globalTid", "textId", "eventType")}
    e["inline"] = inline
    where = f"CAST(eventType AS INTEGER) IN {NVTX_RANGE_TYPES} AND \"end\" IS NOT NULL" \
        if "eventType" in db.columns(NVTX) and "end" in db.columns(NVTX) else "0"
    t = db.fetch(NVTX, e, where, parallel=False)  # the inline-text index reads a temp table of this connection
    idx = ints(t["inline"], -1)
    idx = np.where(idx >= 0, idx, strings.index(t["textId"]))
    values = pa.array(strings.values, pa.string())
    parsed = pc.extract_regex(values, OP_RE)
    is_op_value = np.asarray(pc.is_valid(parsed).fill_null(False))
    is_op = np.zeros(t.num_rows, dtype=bool)
    ok = idx >= 0
    is_op[ok] = is_op_value[idx[ok]]
    base = {**_times(t, offset), "pid": _pid(t["globalTid"]), "tid": _tid(t["globalTid"])}
    rng_rows = np.nonzero(~is_op)[0]
    ranges = pa.table({k: v.take(pa.array(rng_rows)) for k, v in base.items()}
                      | {"name": strings.dictionary(idx[rng_rows]),
                         "domain": pa.array(np.full(len(rng_rows), "nvtx", dtype=object), pa.string())})
    op_rows = np.nonzero(is_op)[0]
    vidx = pa.array(idx[op_rows])
    fields = {f: parsed.field(f).take(vidx) if len(op_rows) else pa.array([], pa.string())
              for f in ("name", "seq", "sizes")}
    ops = pa.table({k: v.take(pa.array(op_rows)) for k, v in base.items()}
                   | {"name": pc.dictionary_encode(fields["name"]),
                      "sequence_id": pc.cast(pc.if_else(pc.equal(fields["seq"], ""), None, fields["seq"]), pa.int64()),
                      "input_shapes": pc.if_else(pc.equal(fields["sizes"], ""), None, fields["sizes"])})
    return ranges, ops


def os_runtime(db: Db, strings: Strings, offset: int) -> pa.Table | None:
    if not db.has(OSRT):
        return None
    t = db.fetch(OSRT, {c: db.int_expr(OSRT, c) for c in ("start", "end", "globalTid", "nameId")})
    return pa.table({**_times(t, offset), "pid": _pid(t["globalTid"]), "tid": _tid(t["globalTid"]),
                     "name": strings.dictionary(strings.index(t["nameId"])),
                     "domain": pa.array(np.full(t.num_rows, "osrt", dtype=object), pa.string())})


def memory(db: Db, offset: int) -> tuple[pa.Table, pa.Table] | None:
    """``CUDA_GPU_MEMORY_USAGE_EVENTS`` (nsys --cuda-memory-usage): alloc / free events."""
    if not db.has(MEMORY):
        return None
    e = {c: db.int_expr(MEMORY, c) for c in ("start", "globalPid", "deviceId", "address", "bytes", "memKind",
                                              "memoryOperationType", "correlationId", "streamId")}
    t = db.fetch(MEMORY, e)
    op = ints(t["memoryOperationType"], 0)
    mk = ints(t["memKind"], 7)
    tab = pa.table({**_times(t, offset, end="start"), "device": _i32(t, "deviceId"), "stream": t["streamId"],
                    "pid": _pid(t["globalPid"]), "correlation": t["correlationId"],
                    "address": pc.cast(t["address"], pa.uint64(), safe=False), "bytes": t["bytes"],
                    "memory_kind": _coded_names(mk, lambda c: ALLOC_KIND.get(c, "unknown"))})
    tab = tab.append_column("name", _coded_names(op, lambda c: "cudaFree" if c == 1 else "cudaMalloc"))
    return tab.filter(pa.array(op != 1)), tab.filter(pa.array(op == 1))


def wanted(kinds: set[str] | None) -> set[str]:
    all_kinds = {"kernel", "memcpy", "memset", "sync", "api", "range", "op", "alloc", "free"}
    out = set(all_kinds) if kinds is None else set(kinds) & all_kinds
    if "op" in out:
        out.add("api")  # GPU work reaches its op through the launching call
    return out


def read_tables(db: Db, strings: Strings, offset: int, kinds: set[str] | None) -> dict[str, pa.Table]:
    """Every wanted kind of the export, all processes together (``pid`` set)."""
    want = wanted(kinds)
    out: dict[str, pa.Table] = {}
    # the two big tables are read ahead: SQLite reads API calls while kernels are mapped here
    if "kernel" in want and db.has(KERNEL):
        db.prefetch(KERNEL, _kernel_exprs(db))
    if "api" in want and db.has(RUNTIME):
        db.prefetch(RUNTIME, _api_exprs(db))
    if "kernel" in want and db.has(KERNEL):
        out["kernel"] = kernels(db, strings, offset)
    if "memcpy" in want and db.has(MEMCPY):
        out["memcpy"] = memcpys(db, offset)
    if "memset" in want and db.has(MEMSET):
        out["memset"] = memsets(db, offset)
    if "sync" in want and (db.has(SYNC) or db.has(CUDA_EVENT)):
        out["sync"] = syncs(db, offset)
    if "api" in want and db.has(RUNTIME):
        out["api"] = api_calls(db, strings, offset)
    if want & {"range", "op"} and db.has(NVTX):
        ranges, ops = nvtx(db, strings, offset)
        if "range" in want:
            out["range"] = ranges
        if "op" in want and ops.num_rows:
            out["op"] = ops
    if "range" in want:
        osrt = os_runtime(db, strings, offset)
        if osrt is not None:
            out["range"] = pa.concat_tables([out["range"], osrt.cast(out["range"].schema)]) if "range" in out else osrt
    if want & {"alloc", "free"}:
        mem = memory(db, offset)
        if mem is not None:
            out["alloc"], out["free"] = mem
    return out
