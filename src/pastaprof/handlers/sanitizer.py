"""Instruction-level memory accesses through the Compute Sanitizer API (issue D).

The native tool (``native/sanitizer_tool.cpp`` + device patches ``sanitizer_patch.cu``)
patches every loaded CUDA module.  Launches that issue B's vocabulary selects (ranges
and steps through the session's gate, ``--kernels`` regex, ``--sample`` every Nth) get
per-launch callback data; the others see a null pointer and return at once.

* ``--process gpu`` (default): accesses are reduced on the device -- binary search of
  the live tensors, then of the driver allocations, both ends checked; atomic counters
  per object; distinct 32-byte sectors per warp request; per-page histograms; a per-PC
  table -- and only those fixed-size tables come back per launch.
* ``--process cpu``: the patches store every warp request (PC, flags, size, mask, CTA,
  warp, 32 addresses) in a bounded device buffer; the host reduces them with
  ``processor.access.reduce_requests``, the same attribution vectorized with NumPy.  The
  time it takes is recorded, so the two paths can be compared on the same launches.

Either way the handler emits ``access_launch``, ``access_summary`` and ``access_pc`` rows
(raw mode also keeps the requests of the launches the ``heatmap`` tool asks for).  It must
start before the program initializes CUDA: the sanitizer has one subscriber, and it
sees modules only as they load.
"""

from __future__ import annotations

import ctypes
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from pastaprof.events.schema import conform
from pastaprof.handlers.base import Gated, Handler, HandlerContext, Setting, Summarized, boolean, integer
from pastaprof.live.config import CaptureConfig
from pastaprof.processor.link import map_keys

T_LAUNCH, T_OBJ, T_PAGE, T_PC, T_RAW, T_SNAP, T_COPY = range(7)
LAUNCH_COLS = ("correlation", "start_ns", "end_ns", "device", "stream", "name_id", "grid_x", "grid_y", "grid_z",
               "block_x", "block_y", "block_z", "mode", "requests", "lanes", "unattributed_lanes", "shared_lanes",
               "local_lanes", "async_copy_lanes", "uncovered_bulk_copies", "uncovered_wgmma", "pc_dropped",
               "page_dropped", "raw_requests", "raw_stored", "objects", "live_bytes", "function_pc", "device_bytes",
               "space_bytes", "unattributed_sample", "module_hash")
OBJ_COLS = ("correlation", "object_address", "object_bytes", "kind", "reads", "writes", "bytes_read",
            "bytes_written", "sectors", "page_start", "page_len")
PC_COLS = ("correlation", "pc", "requests", "lanes", "bytes", "sectors", "reads", "writes")
RAW_COLS = ("correlation", "pc", "flags", "size", "active", "cta", "warp", "pad")
SNAP_COLS = ("correlation", "base", "bytes", "level")
COPY_COLS = ("start_ns", "kind", "bytes", "direction", "stream", "dst", "src")
NCOLS = (len(LAUNCH_COLS), len(OBJ_COLS), 1, len(PC_COLS), len(RAW_COLS), len(SNAP_COLS), len(COPY_COLS))
DIRECTIONS = ("unknown", "HtoH", "HtoD", "DtoH", "DtoD")  # by Sanitizer_MemcpyDirection
INSTRUCTIONS = {"shared": 1, "local": 2, "async": 4, "bulk": 8, "wgmma": 16}


def _env_int(name: str, default: int) -> int:
    v = os.environ.get(name, "")
    try:
        return int(v) if v else default
    except ValueError:
        return default


def pc_slots(per_pc: bool) -> int:
    """Entries of the device's per-PC table: PASTAPROF_SAN_PCS if set (0: none), else 4,096
    when a tool reads per-PC rows and none otherwise -- the per-PC probe and counters were
    the heaviest part of the patch (docs/instruction-level.md)."""
    if os.environ.get("PASTAPROF_SAN_PCS", "").strip():
        return _env_int("PASTAPROF_SAN_PCS", 4096)
    return 4096 if per_pc else 0


class SanitizerHandler(Handler, Gated, Summarized):
    """Loads and drives the native sanitizer tool; drains its tables as Arrow batches."""

    name = "sanitizer"
    kinds = ("access_launch", "access_summary", "access_pc", "access_heatmap", "memcpy", "memset", "sync")
    native_library = "sanitizer"
    order = 10  # before anything initializes CUDA, and before CUPTI (one callback subscriber)
    gate_is_instrumentation = True  # what it instruments, not an optimization (PASTAPROF_OFF=gate)
    # tuning knobs, environment only (docs/instruction-level.md)
    settings = (
        Setting("SAN_PCS", "per-PC hash slots (0: no access_pc rows)", integer(0)),
        Setting("SAN_PAGES", "page counters of the hotness histograms", integer(0)),
        Setting("SAN_RAW_MB", "raw request buffer (--process cpu), MiB", integer(0)),
        Setting("SAN_SHARDS", "counter copies per SM shard", integer(1, 64)),
        Setting("HEATMAP_CTA", "the CTA the heatmap tool shows", integer(0)),
        Setting("SAN_UNPATCH", "0 keeps modules patched outside the capture windows", boolean),
    )

    @classmethod
    def create(cls, ctx: HandlerContext) -> SanitizerHandler | None:
        """Only when a chosen tool consumes access_* events, and not in forked children."""
        if not ctx.gpu or not any(k.startswith("access_") for k in ctx.consumed):
            return None
        return cls(ctx.config, ctx.rank, ctx.out, per_pc="access_pc" in ctx.consumed)

    def __init__(self, config: CaptureConfig, rank: int = 0, out: Path | None = None, per_pc: bool = True) -> None:
        self.config = config
        self.per_pc = per_pc  # count per PC only where a tool reads access_pc (coalescing)
        # module images with line info, for PC -> source line (processor/lines.py)
        self.cubins = Path(out) / "_cubins" if out is not None else None
        self.rank = rank
        self.process = config.process
        self.lib: Any = None
        self.status: str | None = None
        self.notes: list[str] = []
        self.reduce_seconds = 0.0      # CPU path: time in reduce_requests
        self.drain_seconds = 0.0
        self.requests_reduced = 0
        self._names: list[str] = []      # as the driver gives them (mangled): cubin lookups
        self._display: list[str] = []    # demangled, for the events
        self.pid = os.getpid()
        # the heatmap tool's CTA (raw records only: --process cpu)
        self.heatmap_cta = _env_int("PASTAPROF_HEATMAP_CTA", 0) if "heatmap" in config.tools else None

    # -- what the manifest's handler table reads ------------------------------------
    @property
    def records(self) -> int:
        return int(self.lib.pp_san_stat(1)) if self.lib is not None else 0

    dropped = 0          # bounded tables report their overflow per launch (access_launch *_dropped)
    sampled_out = 0
    kernels_seen = 0

    @property
    def mechanism(self) -> str:
        return f"compute sanitizer ({self.process} reduction)"

    # -- session protocol -------------------------------------------------------
    def start(self) -> None:
        from pastaprof import native

        try:
            lib = native.load("sanitizer")
        except RuntimeError as e:
            self.status = f"instruction-level accesses not recorded: {e}"
            return
        page_shift = int(np.log2(self.config.page_bytes))
        # table sizes (entries): per-PC hash slots, page counters, raw requests (288 B each)
        pc_cap = pc_slots(self.per_pc)
        if not pc_cap:
            self.notes.append("no per-PC counts (access_pc): no selected tool reads them; "
                              "PASTAPROF_SAN_PCS=4096 keeps them for a later coalescing report")
        page_cap = _env_int("PASTAPROF_SAN_PAGES", 1 << 22)
        raw_cap = _env_int("PASTAPROF_SAN_RAW_MB", 1024) * (1 << 20) // 288
        flags = sum(INSTRUCTIONS.values())
        if os.environ.get("PASTAPROF_SAN_UNPATCH", "1").lower() in ("0", "false", "no", "off"):
            flags |= 32  # keep modules patched outside ranges (to measure what unpatching saves)
        if lib.pp_san_configure(2 if self.process == "cpu" else 1, lib.patch_path.encode(),
                                (self.config.kernels or "").encode(), self.config.sample, page_shift, pc_cap,
                                page_cap, raw_cap, flags) != 0:
            self.status = f"instruction-level accesses not recorded: {lib.pp_san_error().decode()}"
            return
        if self.cubins is not None:
            try:
                self.cubins.mkdir(parents=True, exist_ok=True)
                lib.pp_san_set_cubin_dir(str(self.cubins).encode())
            except OSError:
                pass  # no source lines, nothing else lost
        lib.pp_san_set_shards(_env_int("PASTAPROF_SAN_SHARDS", 16))  # rounded up to a power of two
        if lib.InitializeInjection() != 0:
            self.status = f"instruction-level accesses not recorded: {lib.pp_san_error().decode()}"
            return
        self.lib = lib

    def start_notes(self) -> dict[str, str]:
        if "heatmap" in self.config.tools and self.config.process != "cpu":
            return {"heatmap": "the heatmap tool needs raw access records: run with --process cpu "
                               "(PASTAPROF_PROCESS=cpu); PASTAPROF_HEATMAP_CTA picks the CTA (default 0)"}
        return {}

    def set_gate(self, on: bool) -> None:
        if self.lib is not None:
            self.lib.pp_san_set_enabled(int(on))

    def flush(self) -> None:
        pass

    def stop(self) -> None:
        if self.lib is not None:
            self.lib.pp_san_set_enabled(0)

    # -- draining -----------------------------------------------------------------
    def _take(self) -> tuple[list[dict[str, np.ndarray]], np.ndarray]:
        n = np.zeros(len(NCOLS), np.int64)  # pp_san_take writes one count per table
        self.lib.pp_san_take(n.ctypes.data_as(ctypes.c_void_p))
        tables = []
        for t, ncol in enumerate(NCOLS):
            cols = {}
            for c in range(ncol):
                a = np.empty(int(n[t]), np.int64)
                if n[t]:
                    self.lib.pp_san_copy(t, c, a.ctypes.data_as(ctypes.c_void_p))
                cols[c] = a
            tables.append(cols)
        addrs = np.empty((int(n[T_RAW]), 32), np.uint64)
        if n[T_RAW]:
            self.lib.pp_san_copy_addresses(addrs.ctypes.data_as(ctypes.c_void_p))
        return tables, addrs

    def _fetch_names(self) -> None:
        """Kernel names the library interned since the last call (once per distinct kernel)."""
        for i in range(len(self._names), self.lib.pp_san_name_count()):
            self._names.append(self.lib.pp_san_name(i).decode("utf-8", "replace"))
        for name in self._names[len(self._display):]:
            self._display.append(self.demangle(name))

    def _name_array(self, ids: np.ndarray) -> pa.Array:
        self._fetch_names()
        return pa.DictionaryArray.from_arrays(pa.array(ids.astype(np.int32)), pa.array(self._display, pa.string()))

    def demangle(self, name: str) -> str:
        """A kernel's readable name (as CUPTI and Kineto show it); the name itself if plain."""
        raw = name.encode()
        buf = ctypes.create_string_buffer(4096)
        n = self.lib.pp_san_demangle(raw, buf, len(buf))
        if n >= len(buf):
            buf = ctypes.create_string_buffer(n + 1)
            self.lib.pp_san_demangle(raw, buf, len(buf))
        return buf.value.decode("utf-8", "replace")

    def drain(self) -> dict[str, pa.Table]:
        if self.lib is None:
            return {}
        t0 = time.perf_counter()
        tables, addrs = self._take()
        out: dict[str, pa.Table] = self._copies(dict(zip(COPY_COLS, tables[T_COPY].values())))
        lc = dict(zip(LAUNCH_COLS, tables[T_LAUNCH].values()))
        n = len(lc["correlation"])
        if n == 0:
            return out
        common = {"rank": np.full(n, self.rank, np.int32), "pid": np.full(n, self.pid, np.int64)}
        launch = {k: lc[k] for k in LAUNCH_COLS if k not in ("name_id", "mode", "function_pc", "space_bytes")}
        launch["name"] = self._name_array(lc["name_id"])
        launch["process"] = pa.array(np.where(lc["mode"] == 2, "cpu", "gpu"))
        launch["unattributed_sample"] = pa.array(lc["unattributed_sample"].astype(np.uint64),
                                                 mask=lc["unattributed_sample"] == 0)
        out["access_launch"] = conform("access_launch", pa.table({**launch, **common}))
        name_of = (lc["correlation"], np.arange(n))  # launch number -> its row (map_keys)
        if self.process == "gpu":
            out.update(self._gpu_tables(tables, lc, name_of))
        else:
            out.update(self._cpu_tables(tables, addrs, lc, name_of))
        self.drain_seconds += time.perf_counter() - t0
        return out

    def record_copies(self) -> None:
        """memcpy / memset rows from the sanitizer's API callbacks (host time, no GPU
        duration), for runs in which CUPTI could not start alongside the sanitizer."""
        if self.lib is not None and self.lib.pp_san_record_copies(1) == 0:
            self.copies = True

    copies = False

    def _copies(self, c: dict[str, np.ndarray]) -> dict[str, pa.Table]:
        """memcpy / memset rows (with their addresses) and sync rows from the API callbacks."""
        out: dict[str, pa.Table] = {}
        for kind, codes in (("memcpy", (0,)), ("memset", (1,)), ("sync", (2, 3))):
            sel = np.isin(c["kind"], codes)
            k = int(sel.sum())
            if not k:
                continue
            cols = {"start_ns": c["start_ns"][sel], "end_ns": c["start_ns"][sel], "rank": np.full(k, self.rank, np.int32),
                    "pid": np.full(k, self.pid, np.int64), "stream": c["stream"][sel],
                    "name": pa.DictionaryArray.from_arrays(np.zeros(k, np.int32),
                                                           pa.array([f"{kind} (host-side, sanitizer)"]))}
            if kind == "memcpy":  # codes 0..4 index DIRECTIONS; anything else is "unknown" (0)
                d = c["direction"][sel]
                codes_ = np.where((d >= 0) & (d < len(DIRECTIONS)), d, 0).astype(np.int32)
                cols["direction"] = pa.DictionaryArray.from_arrays(codes_, pa.array(DIRECTIONS))
                cols["dst_address"] = c["dst"][sel].astype(np.uint64)
                cols["src_address"] = c["src"][sel].astype(np.uint64)
            if kind in ("memcpy", "memset"):
                cols["bytes"] = c["bytes"][sel]
            if kind == "memset":
                cols["address"] = c["dst"][sel].astype(np.uint64)
            if kind == "sync":
                cols["sync_kind"] = pa.DictionaryArray.from_arrays((c["kind"][sel] - 2).astype(np.int32),
                                                                   pa.array(["stream", "context"]))
            out[kind] = conform(kind, pa.table(cols))
        return out

    def _rows_of(self, corr: np.ndarray, lc: dict, name_of: tuple) -> dict[str, Any]:
        """The launch's columns for each row of a per-launch table (vectorized lookup)."""
        idx = np.maximum(map_keys(np.asarray(corr, np.int64), *name_of), 0)
        return {"start_ns": lc["start_ns"][idx], "end_ns": lc["end_ns"][idx], "device": lc["device"][idx],
                "stream": lc["stream"][idx], "rank": np.full(len(idx), self.rank, np.int32),
                "pid": np.full(len(idx), self.pid, np.int64), "correlation": corr,
                "name": self._name_array(lc["name_id"][idx])}

    def _gpu_tables(self, tables: list, lc: dict, name_of: tuple) -> dict[str, pa.Table]:
        o = dict(zip(OBJ_COLS, tables[T_OBJ].values()))
        pages = tables[T_PAGE][0]
        none = o["kind"] < 0
        start, length = o["page_start"], o["page_len"]
        offsets = np.zeros(len(start) + 1, np.int64)
        offsets[1:] = np.cumsum(np.where(start >= 0, length, 0))
        has = start >= 0
        ln = length[has]  # each row's slice of the flat page counts, gathered without a loop
        flat_idx = np.repeat(start[has] - offsets[:-1][has], ln) + np.arange(int(ln.sum()))
        page_counts = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(pages[flat_idx]),
                                               mask=pa.array(start < 0))
        summary = {**self._rows_of(o["correlation"], lc, name_of),
                   "object_address": pa.array(o["object_address"].astype(np.uint64), mask=none),
                   "object_bytes": pa.array(o["object_bytes"], mask=none),
                   "object_kind": pa.DictionaryArray.from_arrays(pa.array(np.clip(o["kind"], 0, 1).astype(np.int32),
                                                                          mask=none),
                                                                 pa.array(["tensor", "allocation"])),
                   "reads": o["reads"], "writes": o["writes"], "bytes_read": o["bytes_read"],
                   "bytes_written": o["bytes_written"], "sectors": o["sectors"],
                   "page_bytes": np.full(len(none), self.config.page_bytes, np.int64), "page_counts": page_counts}
        summary["live_bytes"] = lc["live_bytes"][np.maximum(map_keys(o["correlation"], *name_of), 0)]
        p = dict(zip(PC_COLS, tables[T_PC].values()))
        pcs = {**self._rows_of(p["correlation"], lc, name_of), "pc": p["pc"].astype(np.uint64),
               **{k: p[k] for k in ("requests", "lanes", "bytes", "sectors", "reads", "writes")},
               "source": self._sources(p["correlation"], p["pc"], lc, name_of)}
        return {"access_summary": conform("access_summary", pa.table(summary)),
                "access_pc": conform("access_pc", pa.table(pcs))}

    def _sources(self, corr: np.ndarray, pcs: np.ndarray, lc: dict, name_of: tuple) -> pa.Array:
        """file:line per (launch, PC) row, from the launch's module image when it was kept
        (one lookup per launch, not per row)."""
        from pastaprof.processor.lines import source_lines

        out: list[str | None] = [None] * len(corr)
        if self.cubins is None or len(corr) == 0:
            return pa.array(out, pa.string())
        row = np.maximum(map_keys(np.asarray(corr, np.int64), *name_of), 0)
        for launch in np.unique(row):
            h = int(lc["module_hash"][launch])
            if not h:
                continue
            sel = np.flatnonzero(row == launch)
            self._fetch_names()
            fn = self._names[int(lc["name_id"][launch])]
            for i, src in zip(sel, source_lines(str(self.cubins / f"{h:016x}.cubin"), fn, pcs[sel])):
                out[i] = src
        return pa.array(out, pa.string())

    def _cpu_tables(self, tables: list, addrs: np.ndarray, lc: dict, name_of: tuple) -> dict[str, pa.Table]:
        from pastaprof.processor.access import Objects, Requests, heatmap, reduce_requests

        r = dict(zip(RAW_COLS, tables[T_RAW].values()))
        s = dict(zip(SNAP_COLS, tables[T_SNAP].values()))
        req = Requests(launch=r["correlation"], pc=r["pc"].astype(np.uint64), flags=r["flags"], size=r["size"],
                       active=r["active"].astype(np.uint32), addresses=addrs, cta=r["cta"], warp=r["warp"])
        objs = Objects(launch=s["correlation"], base=s["base"].astype(np.uint64), nbytes=s["bytes"], level=s["level"])
        t0 = time.perf_counter()
        res = reduce_requests(req, objs, page_bytes=self.config.page_bytes) if len(req) else {}
        self.reduce_seconds += time.perf_counter() - t0
        self.requests_reduced += len(req)
        if self.heatmap_cta is not None and len(req):  # one CTA per launch, cuThermo-style
            maps = [heatmap(req, objs, int(launch), self.heatmap_cta) for launch in np.unique(req.launch)]
            maps = [m for m in maps if m.num_rows]
            if maps:
                res["access_heatmap"] = pa.concat_tables(maps)
        out = {}
        for kind, tab in res.items():
            cols = {c: tab[c] for c in tab.column_names}
            cols.update(self._rows_of(tab["correlation"].to_numpy(), lc, name_of))
            if kind == "access_pc":
                cols["source"] = self._sources(tab["correlation"].to_numpy(), tab["pc"].to_numpy().astype(np.int64),
                                               lc, name_of)
            out[kind] = conform(kind, pa.table(cols))
        return out

    def summary(self) -> dict[str, Any]:
        if self.lib is None:
            return {"status": self.status}
        lib = self.lib
        notes = [*self.notes, *(lib.pp_san_note(i).decode() for i in range(lib.pp_san_notes()))]
        err = lib.pp_san_error().decode()
        return {"mechanism": f"compute sanitizer, reduced on the {self.process.upper()}",
                "launches_seen": lib.pp_san_stat(0), "launches_instrumented": lib.pp_san_stat(1),
                "launches_skipped_busy": lib.pp_san_stat(2), "device_bytes": lib.pp_san_stat(3),
                "live_tensors": lib.pp_san_stat(4), "live_allocations": lib.pp_san_stat(5),
                "modules_repatched": lib.pp_san_stat(6), "modules_unpatched": lib.pp_san_stat(7),
                # host time of the instrumented launches: set-up, waiting for the kernel, read-back
                "setup_seconds": lib.pp_san_stat(8) / 1e9, "wait_seconds": lib.pp_san_stat(9) / 1e9,
                "readback_seconds": lib.pp_san_stat(10) / 1e9, "page_copy_seconds": lib.pp_san_stat(11) / 1e9,
                "arena_copy_seconds": lib.pp_san_stat(12) / 1e9,
                "cpu_reduce_seconds": round(self.reduce_seconds, 6), "requests_reduced": self.requests_reduced,
                "drain_seconds": round(self.drain_seconds, 6), "notes": notes, "error": err or None}
