"""CUPTI's memory records as event tables: MEMORY2 / MEMORY_POOL records (cudaMalloc-level,
managed, pinned and pool allocations) -> ``alloc`` / ``free``, UNIFIED_MEMORY_COUNTER records
-> ``uvm``.  The C drain hands them over as NumPy columns (handlers/cupti_native.py)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

_MEMORY_KIND = {0: "unknown", 1: "pageable", 2: "pinned", 3: "device", 4: "array", 5: "managed", 6: "device_static",
                7: "managed_static"}
_UVM_KIND = {1: "htod", 2: "dtoh", 3: "cpu_page_fault", 4: "gpu_page_fault", 5: "thrashing", 6: "throttling",
             7: "remote_map", 8: "dtod"}
_MIGRATION_CAUSE = {0: "unknown", 1: "user", 2: "coherence", 3: "prefetch", 4: "eviction", 5: "access_counters"}
_ACCESS = {0: "unknown", 1: "read", 2: "write", 3: "atomic", 4: "prefetch"}
_REMOTE_CAUSE = {0: "unknown", 1: "coherence", 2: "thrashing", 3: "policy", 4: "out_of_memory", 5: "eviction"}


def lookup_names(codes: np.ndarray, names: dict[int, str | None]) -> pa.Array:
    """Integer codes -> dictionary-encoded names (vectorized)."""
    codes = np.asarray(codes, dtype=np.int64)
    uniq, inv = np.unique(codes, return_inverse=True)
    labels = pa.array([names.get(int(u)) or "unknown" for u in uniq], pa.string())
    return pa.DictionaryArray.from_arrays(pa.array(inv.astype(np.int32)), labels)


def memory_tables(kind: str, cols: dict[str, np.ndarray], rank_of_process: int) -> dict[str, pa.Table]:
    """MEMORY2 / MEMORY_POOL records -> alloc and free; UNIFIED_MEMORY_COUNTER -> uvm."""
    n = len(cols["start_ns"])
    rank = pa.array(np.full(n, rank_of_process, np.int32))
    if kind == "uvm":
        ck, value = cols["counter_kind"], cols["value"]
        migration = np.isin(ck, (1, 2, 8))
        with_bytes = migration | np.isin(ck, (5, 7))
        fault = np.isin(ck, (3, 4))
        flags = cols["flags"]
        cause = np.full(n, "", dtype=object)
        for mask, names in ((migration, _MIGRATION_CAUSE), (fault, _ACCESS), (ck == 7, _REMOTE_CAUSE)):
            if mask.any():
                cause[mask] = [names.get(int(f), "unknown") for f in flags[mask]]
        src, dst = cols["src_device"], cols["dst_device"]
        gpu = np.where(ck == 1, dst, np.where(ck == 2, src, np.maximum(src, dst)))
        end = np.where(cols["end_ns"] > 0, cols["end_ns"], cols["start_ns"])
        return {"uvm": pa.table({
            "start_ns": cols["start_ns"], "end_ns": end, "rank": rank, "device": gpu.astype(np.int32),
            "stream": cols["stream"], "uvm_kind": lookup_names(ck, _UVM_KIND),
            "address": pa.array(cols["address"].astype(np.uint64)),
            "bytes": pa.array(value, pa.int64(), mask=~with_bytes),
            "count": pa.array(np.where(ck == 3, 1, value), pa.int64(), mask=~fault),
            "cause": pa.array(cause, pa.string(), mask=cause == ""),
            "src_device": src.astype(np.int32), "dst_device": dst.astype(np.int32),
            "name": lookup_names(ck, _UVM_KIND)})}
    out = {}
    if kind == "memory":
        op, mk = cols["operation"], lookup_names(cols["memory_kind"], _MEMORY_KIND)
        pid = cols["pid"]
    else:  # pool created (1) -> alloc; destroyed (2) / trimmed (3) -> free
        op = np.where(cols["operation"] == 1, 1, 2)
        mk = pa.array(np.where(cols["is_managed"] > 0, "managed_pool", "device_pool").astype(object), pa.string())
        pid = np.full(n, -1)
    for name, code in (("alloc", 1), ("free", 2)):
        m = op == code
        if not m.any():
            continue
        out[name] = pa.table({
            "start_ns": cols["start_ns"][m], "end_ns": cols["start_ns"][m], "rank": rank.filter(pa.array(m)),
            "device": cols["device"][m].astype(np.int32), "correlation": cols["correlation"][m],
            "pid": pa.array(pid[m], pa.int64(), mask=pid[m] < 0),
            "address": pa.array(cols["address"][m].astype(np.uint64)), "bytes": cols["bytes"][m],
            "memory_kind": mk.filter(pa.array(m))})
    return out
