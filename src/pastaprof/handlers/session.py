"""A capture session in one process: handlers -> processor -> shards of a run.

Each process of a profiled program (the main script, DataLoader workers,
torchrun ranks) runs one Session.  Every ``flush_ms`` a background thread
drains the handlers, gates what was captured by the control vocabulary
(ranges, steps, ranks), feeds live tools, and writes the events as Parquet
*parts* of its own shard (``<kind>/rank-R-pid-P-part-N.parquet``), each written
to a temporary name and renamed, so a crash loses at most what was recorded since
the last flush, bounded in time and memory (handlers/flushing.py).
``pastaprof run`` (or the Python API's ``stop()``) then compacts the parts into
a regular run directory (store/compact.py).

The profiled program must never be harmed: every failure inside the session
becomes one warning on stderr and capture stops; signals and exit codes are
left to the program (handlers/exits.py: terminating signals the program has
no handler for flush, then kill as they would have; os._exit and os.exec* flush
first; the program sees none of it).
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from pastaprof.events.schema import SCHEMA_VERSION, conform, merge
from pastaprof.handlers import exits
from pastaprof.handlers.control import CaptureConfig
from pastaprof.handlers.cupti_activity import CuptiActivityHandler
from pastaprof.handlers.flushing import FlushScheduler, sort_by_start
from pastaprof.handlers.imports import after_import
from pastaprof.handlers.linking import Linking
from pastaprof.handlers.messages import notice as _notice
from pastaprof.handlers.messages import warn as _warn
from pastaprof.handlers.optional import OptionalHandlers, _consumed_kinds
from pastaprof.handlers.torch_ops import TorchHandler
from pastaprof.processor.pipeline import Processor
from pastaprof.store.parts import system_memory, write_part
from pastaprof.tools.base import Report, RunInfo, Tool

SHARDS = "shards"
UNFLUSHED = ("ended without its final flush (SIGKILL, a crash, or os._exit from C): the events it "
             "recorded after its last flush are not in the run")


def current_rank() -> int:
    for var in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"):
        v = os.environ.get(var)
        if v and v.isdigit():
            return int(v)
    return 0


class Session(OptionalHandlers, Linking, FlushScheduler):
    """Capture in this process.  Use through ``pastaprof.profile()`` / ``start()``."""

    def __init__(self, config: CaptureConfig, tools: list[Tool] | None = None, gpu: bool = True) -> None:
        self.config = config
        self.gpu = gpu  # False in forked children: CUDA (and CUPTI) cannot be used after fork
        self.rank = current_rank()
        self.pid = os.getpid()
        self.out = Path(config.out or f"pastaprof-run-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
        self.processor = Processor(tools or [], info=RunInfo({"ranks": [self.rank]}))
        self.handlers: list[Any] = []
        self.status: dict[str, str] = {}
        self.events = dict.fromkeys(("kernel", "memcpy", "memset", "sync", "api", "range"), 0)
        self.filtered_out = 0
        self.flush_seconds = 0.0
        self.stop_seconds = 0.0
        self.stop_handlers_seconds = 0.0  # of which: handlers' stop (CUPTI's forced flush)
        self.final_flush_seconds = 0.0  # ... and the last drain + store write
        self.final_flush_phases: dict[str, float] = {}  # ... by phase: drain per handler, link+gate, write
        self.stop_join_seconds = 0.0  # ... and waiting for the flush thread's work in progress
        self.filtered_by_kind: dict[str, int] = {}
        self.started_ns = 0
        self.step = 0
        self._user_steps = 0
        self._explicit_steps = False
        self._last_user_step_ns: int | None = None
        self._open_ranges: list[str] = []
        self._ranges = {"start_ns": [], "end_ns": [], "tid": [], "name": [], "domain": []}
        # Recording windows: time intervals in which the gate (ranges/steps) was open.
        self._gate_open_since: int | None = None
        self._windows: list[tuple[int, int]] = []
        # The op observer is gated at the source (TorchHandler.set_gate) only from the first step
        # or the end of the first selected range on: until then it records everything (the store
        # keeps what the gate selects), so the program's op signatures, call sites and module
        # paths are known, and not first met -- at ~1 ms per step of a 75-module conv net (dev
        # VM) -- inside the first selected step.
        self._source_armed = False
        self._source_lock = threading.Lock()
        self._part = 0
        self._ext: pa.Table | None = None
        # Correlation ids of stored GPU work that had no op yet; if their correlation record
        # shows up later, compaction must re-link (else it can skip re-reading the parts).
        self._unlinked = np.zeros(0, np.int64)
        self._relink_needed = False
        self._held: dict[str, pa.Table] = {}
        self._reattach_flushes = 0
        consumed = _consumed_kinds(tools or [], config.tools)
        self._uvm_pending = bool(config.uvm or "uvm" in consumed)
        self._uvm_wanted = self._uvm_pending  # _uvm_pending clears once the counters are configured
        self._access_wanted = any(k.startswith("access_") for k in consumed)
        self._per_pc_wanted = "access_pc" in consumed  # the sanitizer's per-PC table (coalescing)
        self._launches = (np.zeros(0, np.int64), np.zeros(0, np.int64))  # recent (correlation, launch ns)
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._init_scheduler()  # the flush threads and the fork guard (handlers/flushing.py)
        self._meta_name = f"rank-{self.rank}-pid-{self.pid}.json"
        self._stopped = False
        self._stopping: int | None = None  # the thread in stop()
        self._stop_done = threading.Event()
        self.reports: list[Report] = []

    # -- lifecycle -----------------------------------------------------------
    def start(self) -> Session:
        self.started_ns = time.time_ns()
        # Load now what the last flush needs: at interpreter exit, lazy imports that
        # register atexit hooks (thread pools) are refused.  Parquet's own first call is
        # made by the flush thread's warm-up, which stop() waits for before the last flush.
        import concurrent.futures.thread  # noqa: F401

        (self.out / SHARDS).mkdir(parents=True, exist_ok=True)
        if not self.config.rank_selected(self.rank):
            self.status["session"] = f"rank {self.rank} not selected (PASTAPROF_RANKS): nothing recorded"
            self._write_meta()
            return self
        if self.gpu and self._access_wanted:  # before anything initializes CUDA
            self._start_sanitizer()
        cupti = None
        if self.gpu:  # not in forked children: no CUDA after fork, so no CUPTI import either
            cupti = CuptiActivityHandler(self.config, self.rank)
            self.handlers.append(cupti)
            cupti.start()
            san = next((h for h in self.handlers if getattr(h, "name", "") == "sanitizer"), None)
            if cupti.status and san is not None:
                # Measured on the H200 (driver 580): with the Compute Sanitizer subscribed,
                # cuptiActivityRegisterCallbacks fails with 39 (MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED).
                cupti.status = (f"{cupti.status}: CUPTI cannot run alongside the Compute Sanitizer (the driver "
                                "allows one callback subscriber), so kernel GPU times are not recorded in this "
                                "run; ops, tensors, instruction-level accesses and memcpy/memset calls (host "
                                "times, from the sanitizer) are")
                san.record_copies()
            self.status["cupti"] = cupti.status or "ok"
            if self._uvm_pending and cupti.status is None:
                self._start_uvm(cupti)
            elif self._uvm_pending:
                self.status["uvm"] = "unified-memory counters not recorded: CUPTI is not available"
                _notice(self.status["uvm"])
            if cupti.native_status and cupti.status is None:
                self.status["cupti native"] = cupti.native_status
                _notice(cupti.native_status)
        if self.config.uvm_plan or self._uvm_wanted or self._access_wanted:  # access runs name managed
            self._start_uvm_plan()                                         # allocations too (uvm_advisor)
        self._start_torch(cupti)
        if not self._gpu_present():
            self.status["gpu"] = "no GPU found: only host-side events are recorded"
        for line in (cupti.status if cupti else None, self.status.get("gpu")):
            if line:
                _notice(line)
        self._update_gate()
        self._after_exec()
        self.status["exit"] = UNFLUSHED  # until stop() has flushed
        self._start_threads()
        atexit.register(self.stop)
        exits.install()
        self._write_meta()
        return self

    def _start_torch(self, cupti: CuptiActivityHandler | None) -> None:
        """The PyTorch handler starts when torch is imported (now, or later via an
        import hook), so programs that never import torch pay nothing."""
        import importlib.util

        if "torch" not in sys.modules and importlib.util.find_spec("torch") is None:
            return

        def begin(_module: Any = None) -> None:
            push, pop = cupti.external_correlation() if cupti is not None else (None, None)
            foreign = (lambda: self._foreign_profiler(cupti, True), lambda: self._foreign_profiler(cupti, False))
            off = self.config.is_off
            handler = TorchHandler(self.rank, push, pop, on_optimizer_step=lambda: self.next_step("optimizer"),
                                   on_range=(self.range_begin, self.range_end), on_foreign_profiler=foreign,
                                   native_external=cupti.native_external if cupti is not None else None,
                                   shapes=self.config.shapes, call_sites=self.config.call_sites,
                                   ops=not off("ops"), modules=not off("modules"), tensors=not off("tensors"))
            handler.start()
            self.status["torch"] = handler.status or "ok"

            if handler.native_status:
                self.status["torch native"] = handler.native_status
                _notice(handler.native_status)
            with self._lock:
                self.handlers.append(handler)
            self._update_gate()  # the gate at the source, for a step or range before torch's import

        if "torch" in sys.modules:
            begin()
        else:
            after_import("torch", begin)

    def stop(self, join_timeout: float = 10.0) -> list[Report]:
        """Final flush; returns live tools' reports.  Safe to call twice.  ``join_timeout``:
        how long a flush in progress may delay it (os._exit and exec wait less)."""
        with self._lock:
            if self._stopped:
                other = self._stopping not in (None, threading.get_ident())
                if not other:  # done, or re-entered from a signal handler on the stopping thread
                    return self.reports
            else:
                other = False
                self._stopped = True
                self._stopping = threading.get_ident()
        if other:  # another thread is stopping: its final flush ends first
            self._stop_done.wait(join_timeout)
            return self.reports
        try:
            return self._final_stop(join_timeout)
        finally:
            self._stopping = None
            self._stop_done.set()
            exits.die_if_pending()  # a signal that came during the final flush ends the process now

    def stopping_here(self) -> bool:
        """Whether this thread is inside stop() (a signal handler interrupted the final flush)."""
        return self._stopping == threading.get_ident()

    def _final_stop(self, join_timeout: float) -> list[Report]:
        t0 = time.perf_counter()
        self._stop.set()
        self._join_threads(join_timeout)  # a periodic flush (or the warm-up) in progress ends first
        self.stop_join_seconds = time.perf_counter() - t0
        try:
            t1 = time.perf_counter()
            for h in self.handlers:
                h.stop()
            self.stop_handlers_seconds = time.perf_counter() - t1
            self._close_gate()
            t1 = time.perf_counter()
            with system_memory():
                self.flush(final=True)
            self.final_flush_seconds = time.perf_counter() - t1
            self.status.pop("exit", None)
            self.reports = self.processor.finish() if self.processor.tools else []
            for h in self.handlers:
                if getattr(h, "name", "") == "uvm_plan":
                    miss = h.mismatches()
                    if miss:
                        self.status["uvm plan"] = "plan does not fit this run: " + "; ".join(miss[:5])
                        _notice(self.status["uvm plan"])
        except Exception as e:
            _warn(f"capture stopped early: {type(e).__name__}: {e}")
        self._write_meta(stop_t0=t0)  # stop_seconds includes this manifest write (all but its last write)
        return self.reports

    @staticmethod
    def _gpu_present() -> bool:
        if os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/kfd"):
            return True
        return False

    # -- control vocabulary ----------------------------------------------------
    def _gate(self) -> bool:
        return self.config.step_selected(self.step) and self.config.range_selected(self._open_ranges)

    def _update_gate(self) -> None:
        # Handlers that gate at the source (the sanitizer, the op observer, CUPTI) are switched
        # under one lock, so with ranges opening and closing on several threads the last caller
        # leaves them in the current state.  They open before a recording window starts and
        # close after it ended, so no launch inside a window misses its records.
        with self._source_lock:
            gate = self._gate()
            if gate:
                self._set_source_gates(True)
            now = time.time_ns()
            with self._lock:
                if gate and self._gate_open_since is None:
                    self._gate_open_since = now
                elif not gate and self._gate_open_since is not None:
                    self._windows.append((self._gate_open_since, now))
                    self._gate_open_since = None
            if not gate:
                self._set_source_gates(False)

    def _set_source_gates(self, gate: bool) -> None:
        store_only = self.config.is_off("gate")  # PASTAPROF_OFF=gate: the store alone gates
        for h in self.handlers:
            set_gate = getattr(h, "set_gate", None)
            if store_only and getattr(h, "name", "") != "sanitizer":
                continue  # (the sanitizer's gate is what it instruments, not an optimization)
            if set_gate is not None:  # the op observer records everything until armed (see __init__)
                set_gate(gate or (getattr(h, "gated_once_armed", False) and not self._source_armed))

    def _close_gate(self) -> None:
        with self._lock:
            if self._gate_open_since is not None:
                self._windows.append((self._gate_open_since, time.time_ns()))
                self._gate_open_since = None

    def range_begin(self, name: str) -> int:
        self._open_ranges.append(name)
        self._update_gate()
        for h in self.handlers:
            begin = getattr(h, "range_begin", None)
            if begin is not None:
                begin(name)
        return time.time_ns()

    def range_end(self, name: str, start_ns: int, domain: str = "user") -> None:
        end = time.time_ns()
        if name in self._open_ranges:
            self._open_ranges.remove(name)
        if not self._source_armed and self.config.ranges and self.config.range_selected([name]):
            self._source_armed = True
        with self._lock:
            r = self._ranges
            r["start_ns"].append(start_ns)
            r["end_ns"].append(end)
            r["tid"].append(threading.get_native_id())
            r["name"].append(name)
            r["domain"].append(domain)
        self._update_gate()

    def next_step(self, source: str = "user") -> int:
        """Advance the step counter.  Optimizer steps count until the program calls
        ``pastaprof.step()`` itself; from then on only its calls count."""
        if source == "user":
            if not self._explicit_steps:
                self._explicit_steps = True
                self.step = self._user_steps
            self._mark_user_step()
            self._user_steps += 1
        elif self._explicit_steps:
            return self.step
        self.step += 1
        self._source_armed = True
        self._update_gate()
        return self.step

    def _mark_user_step(self) -> None:
        """A ``pastaprof.step()`` call ends the step that the previous call began: it becomes a
        range ``pastaprof.step#N`` (N counts the calls before it), which the steps tool reads like
        a ProfilerStep.  The work before the first call is in no step: it holds the program's
        setup as often as its first iteration."""
        now = time.time_ns()
        start, self._last_user_step_ns = self._last_user_step_ns, now
        if start is not None:
            self.range_end(f"pastaprof.step#{self._user_steps - 1}", start)

    # -- flushing ------------------------------------------------------------
    def flush(self, final: bool = False) -> None:
        t0 = time.perf_counter()
        if self._reattach_flushes > 0 and not final:
            self._reattach_flushes -= 1
            for h in self.handlers:
                if isinstance(h, CuptiActivityHandler):
                    h.reattach()
        for h in self.handlers:
            if isinstance(h, CuptiActivityHandler) and h.force_flush and not final:
                h.flush()
        phases: dict[str, float] = {}  # where this flush's time went (the final one's is in the manifest)
        with self._lock:
            tables: dict[str, pa.Table] = {}
            for h in self.handlers:
                t1 = time.perf_counter()
                try:
                    drained = h.drain()
                except Exception as e:  # one handler's failure must not lose the others' events
                    name = getattr(h, "name", type(h).__name__)
                    if name not in self.status.get("drain failed", ""):
                        _warn(f"{name} events of a flush lost: {type(e).__name__}: {e}")
                        self.status["drain failed"] = f"{self.status.get('drain failed', '')} {name}".strip()
                    continue
                for kind, t in drained.items():
                    # two handlers may emit one kind with different columns in one flush (CUPTI's
                    # MEMORY2 and the managed-allocation registry both make "alloc" rows): columns
                    # one lacks become nulls and types are the schema's, instead of the flush
                    # failing and losing every event
                    tables[kind] = merge(kind, [tables[kind], t]) if kind in tables else t
                key = f"drain_{getattr(h, 'name', 'handler')}"
                phases[key] = phases.get(key, 0.0) + time.perf_counter() - t1
            t1 = time.perf_counter()
            r = self._ranges
            if r["name"]:
                n = len(r["name"])
                tables["range"] = pa.table({**r, "rank": pa.array([self.rank] * n, pa.int32()),
                                            "pid": pa.array([self.pid] * n, pa.int64())})
                self._ranges = {k: [] for k in r}
            self._link_ops(tables, final)
            tables = self._gated(tables)
            part = self._part
            self._part += 1
        phases["link_and_gate"] = time.perf_counter() - t1
        t1 = time.perf_counter()
        for kind, t in tables.items():
            if t.num_rows == 0:
                continue
            t = conform(kind, t.append_column("pid", pa.array(np.full(t.num_rows, self.pid, np.int64)))
                        if "pid" not in t.column_names else t)
            t = sort_by_start(t)
            self._write_part(kind, t, part)
            with self._lock:  # flushes may overlap (handlers/flushing.py)
                self.events[kind] = self.events.get(kind, 0) + t.num_rows
                self.processor.submit(kind, t, self.rank)
        phases["write_parts"] = time.perf_counter() - t1
        with self._lock:
            self.flush_seconds += time.perf_counter() - t0
        if final:
            self.final_flush_phases = {k: round(v, 6) for k, v in phases.items()}
        if not final and (tables or self._part % 10 == 1):  # the final one: stop() writes it next
            self._write_meta()

    def _write_part(self, kind: str, table: pa.Table, part: int) -> None:
        write_part(self.out / kind / f"rank-{self.rank}-pid-{self.pid}-part-{part:05d}.parquet", table)

    def _write_meta(self, stop_t0: float | None = None) -> None:
        """This process's part of the manifest (merged by compaction).  ``stop_t0``: from
        stop(), whose stop_seconds is taken here, after everything but the JSON's encoding and
        write (~0.1 ms; the manifest is one small file)."""
        handlers = {h.name: {"records": h.records, "dropped": h.dropped, "sampled_out": h.sampled_out,
                             "kernels_seen": h.kernels_seen, "reattached": getattr(h, "reattached", 0),
                             "mechanism": getattr(h, "mechanism", "python"), "buffers": getattr(h, "buffers", None),
                             # capture gated at the source: switches, and seconds spent switching
                             "gate_changes": getattr(h, "gate_changes", None),
                             "gate_seconds": round(getattr(h, "gate_seconds", 0.0), 6),
                             **({"shapes": h.shapes_summary} if hasattr(h, "shapes_summary") else {})}
                    for h in list(self.handlers)}
        for h in list(self.handlers):  # found after start (e.g. at CUDA's lazy init)
            native = getattr(h, "native", None)
            if getattr(native, "mem_error", None):
                self.status["tensors"] = native.mem_error
        dropped = sum(h["dropped"] for h in handlers.values())
        if dropped:
            by = ", ".join(f"{k} {v['dropped']}" for k, v in handlers.items() if v["dropped"])
            self.status["dropped"] = f"{dropped} events dropped: the capture buffers were full ({by})"
        meta = {
            "schema_version": SCHEMA_VERSION, "rank": self.rank, "pid": self.pid, "host": socket.gethostname(),
            "argv": sys.argv, "started_ns": self.started_ns, "updated_ns": time.time_ns(),
            "status": self.status, "events": self.events, "filtered_out": self.filtered_out,
            "filtered_by_kind": self.filtered_by_kind,
            "handlers": handlers, "dropped_events": dropped,
            "capture_overhead": {"flush_seconds": round(self.flush_seconds, 6),
                                 "stop_seconds": round(self.stop_seconds, 6),
                                 "stop_handlers_seconds": round(self.stop_handlers_seconds, 6),
                                 "final_flush_seconds": round(self.final_flush_seconds, 6),
                                 "final_flush_phases": self.final_flush_phases,
                                 "stop_join_seconds": round(self.stop_join_seconds, 6),
                                 "bounds": self.bounds(), "deadline_flushes": self.deadline_flushes,
                                 "starved_flushes": self.starved_flushes, "max_pending_rows": self.max_pending_rows},
            "config": self.config.to_env(), "steps_seen": self.step, "versions": _versions(),
            "relink_needed": self._relink_needed or not self._stopped, "devices": _devices(),
            "uvm_plan": next((h.summary() for h in self.handlers if getattr(h, "name", "") == "uvm_plan"), None),
            "sanitizer": next((h.summary() for h in self.handlers if getattr(h, "name", "") == "sanitizer"), None),
        }
        if stop_t0 is not None:
            self.stop_seconds = time.perf_counter() - stop_t0
            meta["capture_overhead"]["stop_seconds"] = round(self.stop_seconds, 6)
        path = self.out / SHARDS / self._meta_name
        tmp = path.with_name(f".{path.name}.{threading.get_ident()}.tmp")  # flushes may overlap
        try:
            tmp.write_text(json.dumps(meta, default=str))
            os.replace(tmp, path)
        except OSError as e:
            _warn(f"cannot write {path}: {e}")


_DEVICES: dict[int, list[dict[str, Any]]] = {}  # per process (a forked child has no CUDA): found once, kept,
                                                 # as every manifest write (each flush, stop) asks


def _devices() -> list[dict[str, Any]]:
    """GPU names and memory from torch, if this process initialized CUDA (no NVML start-up)."""
    if os.getpid() in _DEVICES:
        return _DEVICES[os.getpid()]
    torch = sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_initialized():
            return []
        out = []
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            out.append({"id": i, "name": p.name, "totalGlobalMem": int(p.total_memory)})
        _DEVICES[os.getpid()] = out
        return out
    except Exception:
        return []


def _versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0]}
    torch = sys.modules.get("torch")
    if torch is not None:
        out["torch"] = getattr(torch, "__version__", "?")
        cuda = getattr(getattr(torch, "version", None), "cuda", None)
        if cuda:
            out["cuda"] = cuda
    return out
