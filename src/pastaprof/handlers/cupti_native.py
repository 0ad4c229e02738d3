"""CUPTI activity buffers decoded in C (native/cupti_drain.c), drained as columns.

The CUPTI handler uses this when the small C library builds and binds to the
libcupti already loaded in the process; otherwise it decodes cupti-python's
record objects in Python.  Either way the tables have the same columns.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from pastaprof.native import copy_columns

# Kinds and column order of cupti_drain.c
KIND_INDEX = {"kernel": 0, "memcpy": 1, "memset": 2, "sync": 3, "api": 4, "external": 5, "memory": 6, "pool": 7,
              "uvm": 8}
COLUMNS = {
    "kernel": ("start_ns", "end_ns", "device", "stream", "correlation", "name", "grid_x", "grid_y", "grid_z",
               "block_x", "block_y", "block_z", "registers", "shared_bytes"),
    "memcpy": ("start_ns", "end_ns", "device", "stream", "correlation", "bytes", "copy_kind"),
    "memset": ("start_ns", "end_ns", "device", "stream", "correlation", "bytes"),
    "sync": ("start_ns", "end_ns", "stream", "correlation", "sync_type"),
    "api": ("start_ns", "end_ns", "pid", "tid", "correlation", "cbid", "is_driver"),
    "external": ("correlation", "external_id"),
    "memory": ("start_ns", "device", "stream", "correlation", "address", "bytes", "memory_kind", "operation", "pid",
               "is_async"),
    "pool": ("start_ns", "device", "correlation", "address", "bytes", "utilized_bytes", "release_threshold",
             "pool_type", "operation", "is_managed"),
    "uvm": ("start_ns", "end_ns", "counter_kind", "value", "address", "src_device", "dst_device", "stream", "flags"),
}
STAT = {"records": 0, "kernels_seen": 1, "dropped": 2, "buffers": 3, "decode_ns": 4, "buffers_requested": 5,
        "foreign_buffers": 6}


class NativeCupti:
    def __init__(self, lib: Any, libcupti: str, buffer_bytes: int) -> None:
        self.lib = lib
        if lib.pp_cupti_init(libcupti.encode(), buffer_bytes) != 0:
            raise RuntimeError(lib.pp_cupti_error().decode())
        self._names: list[str] = []
        self.refused_cbids = 0  # launch-call cbids this libcupti does not know (callbacks_on)

    def configure_uvm(self, device: int) -> None:
        """Unified-memory counters for ``device`` (before UNIFIED_MEMORY_COUNTER is enabled)."""
        if self.lib.pp_cupti_configure_uvm(int(device)) != 0:
            raise RuntimeError(self.lib.pp_cupti_error().decode())

    def register(self) -> None:
        if self.lib.pp_cupti_register() != 0:
            raise RuntimeError(self.lib.pp_cupti_error().decode())

    def shared_buffers(self) -> None:
        """Back to shared activity buffers after a foreign session left per-thread ones on."""
        if self.lib.pp_cupti_shared_buffers() != 0:
            raise RuntimeError(self.lib.pp_cupti_error().decode())

    def own_clock(self) -> None:
        """Stamp records with CLOCK_REALTIME (time.time_ns) through CUPTI's timestamp
        callback, replacing any clock a foreign client (Kineto) left registered."""
        if self.lib.pp_cupti_own_clock() < 0:
            raise RuntimeError(self.lib.pp_cupti_error().decode())

    def keep_api(self, driver: bool, cbid: int, keep: bool) -> None:
        self.lib.pp_cupti_keep_api(int(driver), int(cbid), int(keep))

    @property
    def push_pop(self) -> tuple[int, int]:
        """The op observer's push/pop: a thread-local op stack read by the launch callbacks
        (forwarded to CUPTI's external correlation while launches come as activity records)."""
        return self.lib.pp_cupti_push_fn(), self.lib.pp_cupti_pop_fn()

    def tls_push(self, kind: int, op_id: int) -> None:
        self.lib.pp_tls_push(kind, op_id)

    def tls_pop(self, kind: int) -> None:
        self.lib.pp_tls_pop(kind, None)

    def callbacks_on(self, cbids: list[tuple[bool, int]]) -> int:
        """Record launch calls through CUPTI's callback API, for these (driver, cbid): 0, or
        the CUPTI error (e.g. 39, another subscriber such as torch.profiler's holds the slot),
        or 1000 + the error when no cbid could be enabled.
        cupti-python's enums name calls newer than the libcupti in the process (torch's):
        CUPTI refuses those (1, invalid parameter), and they are skipped."""
        r = self.lib.pp_cupti_callbacks_on()
        if r != 0:
            return r
        errors = [self.lib.pp_cupti_callback_cbid(int(driver), int(cbid)) for driver, cbid in cbids]
        refused = [e for e in errors if e != 0]
        if len(refused) == len(cbids):
            self.callbacks_off()
            return 1000 + (refused[0] if refused else 0)  # none enabled
        self.refused_cbids = len(refused)
        return 0

    def sync_rows(self, syncs: list[tuple[bool, int, int, bool]]) -> None:
        """Sync rows from the launch callbacks for these (driver, cbid, sync type, per-thread
        stream), instead of CUPTI's SYNCHRONIZATION records (then not enabled)."""
        for driver, cbid, kind, per_thread in syncs:
            self.lib.pp_cupti_sync_cbid(int(driver), int(cbid), int(kind), int(per_thread))
        self.lib.pp_cupti_sync_rows(1)

    def callbacks_off(self) -> None:
        self.lib.pp_cupti_callbacks_off()

    def callbacks_gate(self, open_: bool) -> int:
        """Switch the launch callbacks' cbids off or back on (the session's gate); 0 or the
        first CUPTI error."""
        return int(self.lib.pp_cupti_callbacks_gate(int(open_)))

    def callback_stats(self) -> dict[str, int]:
        return {"calls": int(self.lib.pp_cupti_callback_stat(0)), "dropped": int(self.lib.pp_cupti_callback_stat(1))}

    def stat(self, name: str) -> int:
        return int(self.lib.pp_cupti_stat(STAT[name]))

    def kernel_names(self) -> pa.Array:
        n = self.lib.pp_cupti_string_count()
        for i in range(len(self._names), n):
            self._names.append(self.lib.pp_cupti_string(i).decode("utf-8", "replace"))
        return pa.array(self._names, pa.string())

    def take(self) -> dict[str, dict[str, np.ndarray]]:
        """Every kind's rows decoded since the last call, as NumPy columns."""
        out = {}
        lib = self.lib
        for kind, k in KIND_INDEX.items():
            n = lib.pp_cupti_take(k)
            if n <= 0:
                continue
            out[kind] = copy_columns(lambda i, ptr, k=k: lib.pp_cupti_copy(k, i, ptr), COLUMNS[kind], n)
        lib.pp_cupti_release()
        return out
