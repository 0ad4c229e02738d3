"""CUPTI activity records -> Arrow tables: the handler's decoding half.

Two paths give the same columns.  The native drain (native/cupti_drain.c) decodes
completed buffers in C on CUPTI's worker thread; ``drain()`` moves its columns out
as NumPy arrays.  Without it, cupti-python hands record objects to ``_decode`` on
CUPTI's worker thread, which copies each record's fields into per-kind lists with
one C-level attrgetter; ``drain()`` transposes them.  Either way the application's
thread does no per-record work, and drains run on the flush thread.
"""

from __future__ import annotations

from operator import attrgetter

import numpy as np
import pyarrow as pa

from pastaprof.events.schema import merge
from pastaprof.handlers.cupti_memory import lookup_names, memory_tables

BUFFER_BYTES = 8 << 20

_MEMCPY_KIND = {1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA", 8: "DtoD", 9: "HtoH",
                10: "PtoP"}
_SYNC_KIND = {1: "event", 2: "stream_wait_event", 3: "stream", 4: "context"}


def no_stream(stream: np.ndarray) -> np.ndarray:
    """CUPTI's "no stream" (CUPTI_SYNCHRONIZATION_INVALID_VALUE, a context or event sync) as -1,
    as the launch callbacks and native programs write it."""
    s = np.asarray(stream, dtype=np.int64)
    return np.where(s == 0xFFFFFFFF, -1, s)
# Per kind: our column names and the CUPTI record attributes they come from.  One C-level
# attrgetter per record copies the fields as a tuple; drain() transposes the tuples.
FIELDS: dict[str, tuple[tuple[str, str], ...]] = {
    "kernel": (("start_ns", "start"), ("end_ns", "end"), ("device", "device_id"), ("stream", "stream_id"),
               ("correlation", "correlation_id"), ("name", "name"), ("grid_x", "grid_x"), ("grid_y", "grid_y"),
               ("grid_z", "grid_z"), ("block_x", "block_x"), ("block_y", "block_y"), ("block_z", "block_z"),
               ("registers", "registers_per_thread"), ("static_shared", "static_shared_memory"),
               ("dynamic_shared", "dynamic_shared_memory")),
    "memcpy": (("start_ns", "start"), ("end_ns", "end"), ("device", "device_id"), ("stream", "stream_id"),
               ("correlation", "correlation_id"), ("bytes", "bytes"), ("copy_kind", "copy_kind")),
    "memset": (("start_ns", "start"), ("end_ns", "end"), ("device", "device_id"), ("stream", "stream_id"),
               ("correlation", "correlation_id"), ("bytes", "bytes")),
    "sync": (("start_ns", "start"), ("end_ns", "end"), ("stream", "stream_id"), ("correlation", "correlation_id"),
             ("sync_type", "type")),
    "api": (("start_ns", "start"), ("end_ns", "end"), ("pid", "process_id"), ("tid", "thread_id"),
            ("correlation", "correlation_id"), ("cbid", "cbid")),
    "driver": (("start_ns", "start"), ("end_ns", "end"), ("pid", "process_id"), ("tid", "thread_id"),
               ("correlation", "correlation_id"), ("cbid", "cbid")),
    "external": (("correlation", "correlation_id"), ("external_id", "external_id")),
}
GETTERS = {kind: attrgetter(*(attr for _, attr in fields)) for kind, fields in FIELDS.items()}


class CuptiRecords:
    """Decoding and draining for CuptiActivityHandler (which sets the attributes used here:
    config, rank, the record counters, _cupti, _native, _lock, _rows, the API name maps)."""

    # -- CUPTI's worker thread ---------------------------------------------
    def _buffer_requested(self):
        return BUFFER_BYTES, 0

    def _buffer_completed(self, records) -> None:
        try:
            self._decode(records)
        except Exception as e:  # never let a decoding bug reach CUPTI or the app
            self.status = self.status or f"CUPTI decode failed ({type(e).__name__}: {e})"

    def _decode(self, records) -> None:
        K = self._cupti.ActivityKind
        by_kind = {K.CONCURRENT_KERNEL: "kernel", K.KERNEL: "kernel", K.MEMCPY: "memcpy", K.MEMSET: "memset",
                   K.SYNCHRONIZATION: "sync", K.RUNTIME: "api", K.DRIVER: "driver",
                   K.EXTERNAL_CORRELATION: "external"}
        cfg = self.config
        filtering = cfg.sample > 1 or cfg.kernels is not None
        with self._lock:
            self.records += len(records)
            rows = self._rows
            for r in records:
                kind = by_kind.get(r.kind)
                if kind is None:
                    continue
                if kind == "api" and self._api_names.get(r.cbid, "") is None:
                    continue
                if kind == "driver" and self._driver_names.get(r.cbid, "") is None:
                    continue
                if kind == "kernel":
                    self.kernels_seen += 1
                if kind == "kernel" and filtering:
                    self._launch_seq += 1
                    if (self._launch_seq % cfg.sample) or not cfg.kernel_selected(r.name):
                        self.sampled_out += 1
                        continue
                rows[kind].append(GETTERS[kind](r))

    # -- flush thread --------------------------------------------------------
    def _native_stats(self) -> None:
        n = self._native
        calls = n.callback_stats()
        self.records, self.kernels_seen = n.stat("records") + calls["calls"], n.stat("kernels_seen")
        self.dropped = n.stat("dropped") + calls["dropped"]
        self.buffers = {"requested": n.stat("buffers_requested"), "completed": n.stat("buffers"),
                        "requested_at_last_reattach": self.buffers_at_reattach,
                        "foreign_completed": n.stat("foreign_buffers"),  # a foreign client's, not freed by us
                        "decode_seconds": round(n.stat("decode_ns") / 1e9, 6),
                        "launch_calls": self.api_mechanism, "launch_callbacks": calls["calls"],
                        "syncs": getattr(self, "sync_mechanism", "activity"),
                        "launch_cbids_refused": n.refused_cbids}

    def drain(self) -> dict[str, pa.Table]:
        """Everything decoded since the last drain, as raw per-kind tables."""
        if self._native is not None:
            return self._drain_native()
        with self._lock:
            taken, self._rows = self._rows, {kind: [] for kind in FIELDS}
        out = {}
        for kind, rows in taken.items():
            if not rows:
                continue
            cols = {c: np.asarray(col) if c != "name" else list(col)
                    for (c, _), col in zip(FIELDS[kind], zip(*rows))}
            if kind == "kernel":
                cols["shared_bytes"] = cols.pop("static_shared").astype(np.int64) + cols.pop("dynamic_shared")
            elif kind == "memcpy":
                cols["direction"] = lookup_names(cols.pop("copy_kind"), _MEMCPY_KIND)
            elif kind == "sync":
                cols["sync_kind"] = lookup_names(cols.pop("sync_type"), _SYNC_KIND)
                cols["stream"] = no_stream(cols["stream"])
            elif kind in ("api", "driver"):
                cbid = cols.pop("cbid").astype(np.int64)
                names = self._api_names if kind == "api" else self._driver_names
                kept = {c: names.get(c, f"cbid_{c}") for c in np.unique(cbid).tolist()}
                keep = np.isin(cbid, [c for c, name in kept.items() if name is not None])
                cols = {k: v[keep] for k, v in cols.items()}
                cols["name"] = lookup_names(cbid[keep], kept)
                cols["api_kind"] = np.full(int(keep.sum()), "runtime" if kind == "api" else "driver", dtype=object)
            n = len(next(iter(cols.values())))
            if not n:
                continue
            t = pa.table(cols)
            if kind != "external":
                t = t.append_column("rank", pa.array([self.rank] * n, pa.int32()))
            if kind == "driver":
                kind = "api"
                if "api" in out:
                    t = pa.concat_tables([out["api"], t.cast(out["api"].schema)])
            out[kind] = t
        return out

    def _drain_native(self) -> dict[str, pa.Table]:
        taken = self._native.take()
        self._native_stats()
        out = {}
        for kind, cols in taken.items():
            if kind in ("memory", "pool", "uvm"):
                for name, t in memory_tables(kind, cols, self.rank).items():
                    # MEMORY2 and MEMORY_POOL rows in one drain (NCCL's pools): one schema
                    out[name] = merge(name, [out[name], t]) if name in out else t
                continue
            n = len(cols["correlation"])
            if kind == "kernel":
                names = self._native.kernel_names()
                cols = self._sampled(cols, names)
                codes = cols.pop("name")
                n = len(codes)
                cols["name"] = pa.DictionaryArray.from_arrays(pa.array(codes.astype(np.int32), mask=codes < 0), names)
                for c in ("device", "stream", "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z",
                          "registers"):
                    cols[c] = cols[c].astype(np.int32)
            elif kind == "memcpy":
                cols["direction"] = lookup_names(cols.pop("copy_kind"), _MEMCPY_KIND)
            elif kind == "sync":
                cols["sync_kind"] = lookup_names(cols.pop("sync_type"), _SYNC_KIND)
            elif kind == "api":
                cbid, driver = cols.pop("cbid"), cols.pop("is_driver").astype(bool)
                key = cbid + (driver.astype(np.int64) << 32)
                labels = {int(k): (self._driver_names if k >> 32 else self._api_names).get(int(k) & 0xFFFFFFFF)
                          or f"cbid_{int(k) & 0xFFFFFFFF}" for k in np.unique(key)}
                cols["name"] = lookup_names(key, labels)
                cols["api_kind"] = pa.DictionaryArray.from_arrays(pa.array(driver.astype(np.int32)),
                                                                  pa.array(["runtime", "driver"]))
            if not n:
                continue
            t = pa.table(cols)
            if kind != "external":
                t = t.append_column("rank", pa.array(np.full(n, self.rank, np.int32)))
            out[kind] = t
        return out

    def _sampled(self, cols: dict[str, np.ndarray], names: pa.Array) -> dict[str, np.ndarray]:
        """PASTAPROF_SAMPLE / PASTAPROF_KERNELS on decoded kernels (vectorized: the regex
        runs once per distinct name)."""
        cfg = self.config
        n = len(cols["name"])
        if not n or (cfg.sample <= 1 and cfg.kernels is None):
            return cols
        keep = np.ones(n, dtype=bool)
        if cfg.sample > 1:
            seq = self._launch_seq + 1 + np.arange(n)
            keep &= (seq % cfg.sample) == 0
            self._launch_seq += n
        if cfg.kernels is not None:
            uniq = np.unique(cols["name"])
            ok = {int(u) for u in uniq if u >= 0 and cfg.kernel_selected(names[int(u)].as_py())}
            keep &= np.isin(cols["name"], list(ok))
        self.sampled_out += int((~keep).sum())
        return {k: v[keep] for k, v in cols.items()}
