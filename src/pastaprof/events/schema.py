"""The unified event model: one Arrow schema per event kind.

Every handler and importer emits ``pyarrow.RecordBatch`` objects that conform to
these schemas, and every tool consumes them.  Keeping the model columnar (and
names dictionary-encoded) is what lets pastaprof move millions of events without
building one Python object per event.

Conventions (see docs/events.md):

* Time is ``start_ns`` / ``end_ns``: int64 nanoseconds on the Unix-epoch clock
  (the clock of ``time.time_ns()``).  Instant events have ``end_ns == start_ns``.
* ``rank`` is the distributed rank (0 for single-process runs), ``device`` the
  GPU ordinal (-1 for host-only events), ``stream`` the GPU stream (-1 if none).
* ``correlation`` ties a runtime API call to the GPU activity it launched.
* ``op_id`` (on GPU activities and API calls) is the ``id`` of the innermost
  framework operator that launched the work, or null when none did.
"""

from __future__ import annotations

import pyarrow as pa

SCHEMA_VERSION = 1

NAME = pa.dictionary(pa.int32(), pa.string())

COMMON: list[pa.Field] = [
    pa.field("start_ns", pa.int64(), nullable=False),
    pa.field("end_ns", pa.int64(), nullable=False),
    pa.field("rank", pa.int32(), nullable=False),
    pa.field("device", pa.int32()),
    pa.field("stream", pa.int64()),
    pa.field("pid", pa.int64()),
    pa.field("tid", pa.int64()),
    pa.field("correlation", pa.int64()),
    pa.field("name", NAME),
]

_SPECIFIC: dict[str, list[pa.Field]] = {
    # A GPU kernel execution.
    "kernel": [
        pa.field("grid_x", pa.int32()), pa.field("grid_y", pa.int32()), pa.field("grid_z", pa.int32()),
        pa.field("block_x", pa.int32()), pa.field("block_y", pa.int32()), pa.field("block_z", pa.int32()),
        pa.field("registers", pa.int32()),
        pa.field("shared_bytes", pa.int64()),
        pa.field("op_id", pa.int64()),
    ],
    # A GPU copy. ``direction`` is HtoD, DtoH, DtoD, HtoH, PtoP or unknown.
    # ``dst_address``/``src_address`` (memcpy) and ``address`` (memset): known when the copy
    # comes from the sanitizer's API callbacks (CUPTI's records carry no addresses).
    "memcpy": [
        pa.field("bytes", pa.int64()),
        pa.field("direction", NAME),
        pa.field("op_id", pa.int64()),
        pa.field("dst_address", pa.uint64()),
        pa.field("src_address", pa.uint64()),
    ],
    "memset": [
        pa.field("bytes", pa.int64()),
        pa.field("op_id", pa.int64()),
        pa.field("address", pa.uint64()),
    ],
    # Raw allocations by the driver/runtime. ``memory_kind``: device, pinned, managed, pool.
    "alloc": [
        pa.field("address", pa.uint64()),
        pa.field("bytes", pa.int64()),
        pa.field("memory_kind", NAME),
    ],
    "free": [
        pa.field("address", pa.uint64()),
        pa.field("bytes", pa.int64()),
        pa.field("memory_kind", NAME),
    ],
    # Host/device synchronisation (stream, event, context or device wait).
    "sync": [
        pa.field("sync_kind", NAME),
    ],
    # A runtime or driver API call on the host. ``api_kind``: runtime or driver.
    "api": [
        pa.field("api_kind", NAME),
        pa.field("op_id", pa.int64()),
    ],
    # A framework operator (e.g. aten::mm). ``id`` is unique within a rank.  ``input_ptrs``: the
    # data pointer of each argument in order, 0 (or null) for a non-tensor; a tensor list gives one
    # entry per tensor.  Null for the whole op where not recorded (imports, older runs).
    "op": [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("parent_id", pa.int64()),
        pa.field("depth", pa.int32()),
        pa.field("external_id", pa.int64()),
        pa.field("sequence_id", pa.int64()),
        pa.field("is_backward", pa.bool_()),
        pa.field("input_shapes", NAME),
        pa.field("input_dtypes", NAME),
        pa.field("input_ptrs", pa.list_(pa.int64())),
        pa.field("module", NAME),
        pa.field("call_site", NAME),
        # From a PyTorch execution trace (importers/execution_trace.py), null elsewhere: the
        # RecordFunction id, the ET node and its parent, the op schema, one tensor id per
        # argument / output (null: not a tensor), output shapes/dtypes (JSON) and ``data_deps``:
        # the ET ids of the ops that produced the op's input tensors.
        pa.field("rf_id", pa.int64()),
        pa.field("et_id", pa.int64()),
        pa.field("et_parent", pa.int64()),
        pa.field("op_schema", NAME),
        pa.field("input_tensor_ids", pa.list_(pa.int64())),
        pa.field("output_tensor_ids", pa.list_(pa.int64())),
        pa.field("output_shapes", NAME),
        pa.field("output_dtypes", NAME),
        pa.field("data_deps", pa.list_(pa.int64())),
    ],
    # A caching-allocator block event. ``bytes`` is negative on free.
    "tensor": [
        pa.field("address", pa.uint64()),
        pa.field("bytes", pa.int64()),
        pa.field("total_allocated", pa.int64()),
        pa.field("total_reserved", pa.int64()),
        pa.field("device_type", NAME),
    ],
    # A user, NVTX or record_function range. ``domain``: user, gpu_user, nvtx, python.
    "range": [
        pa.field("domain", NAME),
        pa.field("id", pa.int64()),
    ],
    # A Python call frame (torch.profiler with_stack): file, line, function in ``name``.
    "frame": [
        pa.field("id", pa.int64()),
        pa.field("parent_id", pa.int64()),
        pa.field("file", NAME),
        pa.field("line", pa.int32()),
        pa.field("function", NAME),
        pa.field("is_module", pa.bool_()),
    ],
    # Unified memory: faults and migrations. ``uvm_kind``: gpu_fault, cpu_fault, htod, dtoh, dtod,
    # thrashing, throttling, remote_map. ``cause``: the migration cause where known.
    # A CUPTI unified-memory counter record.  ``uvm_kind``: htod, dtoh, dtod (migrations:
    # ``bytes``, ``cause`` = user/coherence/prefetch/eviction/access_counters), gpu_page_fault
    # (``count`` = fault groups), cpu_page_fault (``count`` = 1) -- for both ``cause`` is the
    # access: read/write/atomic/prefetch --, thrashing, throttling, remote_map (``bytes``; ``cause`` for remote_map).
    # ``device``: the GPU involved; ``src_device``/``dst_device``: -1 for the CPU.
    "uvm": [
        pa.field("uvm_kind", NAME),
        pa.field("address", pa.uint64()),
        pa.field("bytes", pa.int64()),
        pa.field("count", pa.int64()),
        pa.field("cause", NAME),
        pa.field("src_device", pa.int32()),
        pa.field("dst_device", pa.int32()),
    ],
    # A sampled device metric, e.g. SM clock or memory used.
    "counter": [
        pa.field("value", pa.float64()),
        pa.field("unit", NAME),
    ],
    # A collective communication op (NCCL/RCCL).
    "collective": [
        pa.field("bytes", pa.int64()),
        pa.field("dtype", NAME),
        pa.field("group_size", pa.int32()),
        pa.field("peers", pa.string()),
        pa.field("op_id", pa.int64()),
    ],
    # Per kernel launch (``correlation``) x memory object, produced by an instruction-level
    # handler (reduced on the GPU, or on the CPU from raw requests: processor/access.py).
    # Lane ``reads``/``writes``; ``sectors`` = sum over warp requests of distinct 32-byte
    # sectors touched in the object; ``page_counts`` = lane accesses per page of the object.
    # A null object collects accesses that fall in no live object.  ``live_bytes``: all objects
    # live at the launch (its footprint).
    "access_summary": [
        pa.field("object_address", pa.uint64()),
        pa.field("object_bytes", pa.int64()),
        pa.field("object_kind", NAME),  # tensor (allocator block) or allocation (driver); null: none
        pa.field("reads", pa.int64()),
        pa.field("writes", pa.int64()),
        pa.field("bytes_read", pa.int64()),
        pa.field("bytes_written", pa.int64()),
        pa.field("sectors", pa.int64()),
        pa.field("page_bytes", pa.int64()),
        pa.field("page_counts", pa.list_(pa.int64())),
        pa.field("live_bytes", pa.int64()),
    ],
    # One CTA of one launch, per 32-byte sector it touched (raw mode, processor/access.py).
    "access_heatmap": [
        pa.field("cta", pa.int64()),
        pa.field("object_address", pa.uint64()),
        pa.field("sector_address", pa.uint64()),
        pa.field("accesses", pa.int64()),
        pa.field("reads", pa.int64()),
        pa.field("writes", pa.int64()),
        pa.field("warps", pa.int64()),
        pa.field("word_counts", pa.list_(pa.int64(), 8)),
    ],
    # Per kernel launch x PC of a memory instruction: warp ``requests``, active ``lanes``,
    # lane ``bytes``, distinct 32-byte ``sectors`` over its requests (sectors / requests = coalescing).
    # One instrumented kernel launch of the sanitizer handler (``correlation`` = its launch
    # sequence in the process; access_summary / access_pc rows carry the same value).
    # Totals that belong to no object: shared / local lanes, cp.async lanes, and what the
    # patches cannot see lane by lane -- TMA / bulk copies and warpgroup MMAs are counted as
    # *uncovered* instructions, never silently dropped.  ``*_dropped`` say what a bounded
    # table could not hold; ``device_bytes`` is the handler's device memory at the launch.
    "access_launch": [
        pa.field("grid_x", pa.int32()), pa.field("grid_y", pa.int32()), pa.field("grid_z", pa.int32()),
        pa.field("block_x", pa.int32()), pa.field("block_y", pa.int32()), pa.field("block_z", pa.int32()),
        pa.field("process", NAME),
        pa.field("requests", pa.int64()),
        pa.field("lanes", pa.int64()),
        pa.field("unattributed_lanes", pa.int64()),
        pa.field("unattributed_sample", pa.uint64()),  # one such address, to tell what it was
        pa.field("shared_lanes", pa.int64()),
        pa.field("local_lanes", pa.int64()),
        pa.field("async_copy_lanes", pa.int64()),
        pa.field("uncovered_bulk_copies", pa.int64()),
        pa.field("uncovered_wgmma", pa.int64()),
        pa.field("pc_dropped", pa.int64()),
        pa.field("page_dropped", pa.int64()),
        pa.field("raw_requests", pa.int64()),
        pa.field("raw_stored", pa.int64()),
        pa.field("objects", pa.int64()),
        pa.field("live_bytes", pa.int64()),
        pa.field("device_bytes", pa.int64()),
    ],
    "access_pc": [
        pa.field("pc", pa.uint64()),
        pa.field("source", NAME),  # file:line of the PC, where the module carries line info
        pa.field("requests", pa.int64()),
        pa.field("lanes", pa.int64()),
        pa.field("bytes", pa.int64()),
        pa.field("sectors", pa.int64()),
        pa.field("reads", pa.int64()),
        pa.field("writes", pa.int64()),
    ],
    # One call of a probed host function (uprobe + uretprobe: ``start_ns`` at entry, ``end_ns`` at
    # return) or one firing of a USDT probe (instant), recorded by eBPF (handlers/probe.py).
    # ``name``: the probe as asked (``libc.so.6:malloc``); ``lib``: the library or binary's path;
    # ``function``: the function, or ``provider:probe``; ``args``: the first integer arguments
    # asked for (``:args=N``); ``ret``: a function's return value (null for USDT).
    "probe": [
        pa.field("lib", NAME),
        pa.field("function", NAME),
        pa.field("args", pa.list_(pa.int64())),
        pa.field("ret", pa.int64()),
    ],
}

KINDS: tuple[str, ...] = tuple(_SPECIFIC)

SCHEMAS: dict[str, pa.Schema] = {
    kind: pa.schema(COMMON + fields, metadata={"pastaprof.kind": kind, "pastaprof.schema_version": str(SCHEMA_VERSION)})
    for kind, fields in _SPECIFIC.items()
}

#: The kinds whose events occupy a GPU engine (used by the timeline tools).
GPU_ACTIVITY_KINDS = ("kernel", "memcpy", "memset")


def schema(kind: str) -> pa.Schema:
    """The schema of ``kind``; raises ``KeyError`` naming the known kinds."""
    try:
        return SCHEMAS[kind]
    except KeyError:
        raise KeyError(f"unknown event kind {kind!r}; known kinds: {', '.join(KINDS)}") from None


def empty(kind: str) -> pa.Table:
    """An empty table of ``kind`` with the full schema."""
    return schema(kind).empty_table()


def merge(kind: str, tables: list[pa.Table]) -> pa.Table:
    """Concatenate tables of one kind from different sources: columns the schema knows are
    cast to its types first (one source may give a name as a string, another dictionary-
    encoded), columns one source lacks become nulls, extra columns are kept."""
    known = {f.name: f.type for f in schema(kind)}

    def typed(t: pa.Table) -> pa.Table:
        for i, name in enumerate(t.column_names):
            want = known.get(name)
            if want is not None and t.schema.field(i).type != want:
                t = t.set_column(i, name, t.column(i).cast(want))
        return t

    return pa.concat_tables([typed(t) for t in tables], promote_options="permissive")


def conform(kind: str, table: pa.Table) -> pa.Table:
    """Cast/extend ``table`` to the schema of ``kind``: missing columns become nulls
    and extra columns are dropped.  Used at the boundary of every handler."""
    target = schema(kind)
    if table.schema.equals(target):  # already conformed (metadata aside): the common case, ~50x cheaper
        return table.replace_schema_metadata(target.metadata)
    n = table.num_rows
    have = dict(zip(table.column_names, table.columns))
    cols = []
    for field in target:
        col = have.get(field.name)
        if col is None:
            col = pa.nulls(n, field.type)
        elif col.type != field.type:
            col = col.cast(field.type)
        cols.append(col)
    return pa.Table.from_arrays(cols, schema=target)
