"""A capture session in one process: handlers -> processor -> shards of a run.

Each process of a profiled program (the main script, DataLoader workers,
torchrun ranks) runs one Session.  Every ``flush_ms`` a background thread
drains the handlers, gates what was captured by the control vocabulary
(ranges, steps, ranks), feeds live tools, and writes the events as Parquet
*parts* of its own shard (``<kind>/rank-R-pid-P-part-N.parquet``), each written
to a temporary name and renamed, so a crash loses at most what was recorded since
the last flush, bounded in time and memory (live/flush.py).
``pastaprof run`` (or the Python API's ``stop()``) then compacts the parts into
a regular run directory (store/compact.py).

The profiled program must never be harmed: every failure inside the session
becomes one warning on stderr and capture stops; signals and exit codes are
left to the program (live/exits.py: terminating signals the program has
no handler for flush, then kill as they would have; os._exit and os.exec* flush
first; the program sees none of it).
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from pastaprof.events.schema import conform, merge, schema
from pastaprof.handlers import registry
from pastaprof.handlers.base import Handler
from pastaprof.live import exits
from pastaprof.live.config import CaptureConfig, current_rank
from pastaprof.live.flush import FlushScheduler, sort_by_start
from pastaprof.live.gates import Gates
from pastaprof.live.imports import after_import
from pastaprof.live.linking import Linking
from pastaprof.live.manifests import SHARDS, Manifests
from pastaprof.live.messages import capture_started as _capture_started
from pastaprof.live.messages import notice as _notice
from pastaprof.live.messages import stop_reason as _stop_reason
from pastaprof.live.messages import stopped as _stopped
from pastaprof.live.messages import warn as _warn
from pastaprof.live.wiring import Wiring, _consumed_kinds
from pastaprof.processor.pipeline import Processor
from pastaprof.store.parts import system_memory, write_part
from pastaprof.tools.base import Report, RunInfo, Tool

__all__ = ["SHARDS", "UNFLUSHED", "Session", "current_rank"]

UNFLUSHED = ("ended without its final flush (SIGKILL, a crash, or os._exit from C): the events it "
             "recorded after its last flush are not in the run")
_INTERNAL_KINDS = frozenset(("external",))  # CUPTI's op -> launch correlation, consumed by linking


class Session(Wiring, Gates, Manifests, Linking, FlushScheduler):
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
        self.first_part = 0  # of this process image (exec: after the earlier image's parts)
        self._ext: pa.Table | None = None
        # Correlation ids of stored GPU work that had no op yet; if their correlation record
        # shows up later, compaction must re-link (else it can skip re-reading the parts).
        self._unlinked = np.zeros(0, np.int64)
        self._relink_needed = False
        self._held: dict[str, pa.Table] = {}
        self.consumed = _consumed_kinds(tools or [], config.tools)  # kinds the chosen tools read
        self._uvm_pending = bool(config.uvm or "uvm" in self.consumed)  # until the counters are configured
        self._bad_kinds: set[tuple[str, str]] = set()
        self._troubles: set[str] = set()  # (handler or kind, place) already warned about
        self._launches = (np.zeros(0, np.int64), np.zeros(0, np.int64))  # recent (correlation, launch ns)
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._init_scheduler()  # the flush threads and the fork guard (live/flush.py)
        self._meta_name = f"rank-{self.rank}-pid-{self.pid}.json"
        self._stopped = False
        self._stopping: int | None = None  # the thread in stop()
        self._stop_done = threading.Event()
        self.reports: list[Report] = []

    # -- what handlers see of the session (handlers/base.py HandlerContext) ----------
    def wants(self, kind: str) -> bool:
        return kind in self.consumed

    def handler(self, name: str) -> Any:
        return next((h for h in list(self.handlers) if getattr(h, "name", None) == name), None)

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
        for cls in registry.available().values():  # in start order (the sanitizer before CUDA is used)
            if cls.starts_on_import:
                self._start_on_import(cls)
            else:
                self._start_handler(cls)
        if not self._gpu_present():
            if self.status.get("cupti", "ok") != "ok":  # why CUPTI did not start says nothing without a GPU
                self.status.pop("cupti")
            self.status["gpu"] = "no GPU found: only host-side events are recorded"
            _notice(self.status["gpu"])
        self._update_gate()
        self._after_exec()
        self.status["exit"] = UNFLUSHED  # until stop() has flushed
        _capture_started()
        self._start_threads()
        atexit.register(self.stop)
        exits.install()
        self._write_meta()
        return self

    def _start_handler(self, cls: type[Handler]) -> Handler | None:
        """Create and start one handler; its trouble is one warning, never the program's."""
        name = cls.name
        try:
            h = cls.create(self)
            if h is None:
                return None
            h.start()
        except Exception as e:
            self.status[name] = f"{name} handler not started: {type(e).__name__}: {e}"
            _notice(self.status[name])  # once: `pastaprof run` prints the status lines itself
            return None
        if h.status and not h.listed_when_unavailable:  # records nothing: left out, said once
            self.status[name] = h.status
            _notice(h.status)
            return None
        self._wire(h)
        if h.status_line:
            self.status[name] = h.status or "ok"
        if h.status:
            _notice(h.status)
        for key, line in h.start_notes().items():
            self.status[key] = line
            _notice(line)
        with self._lock:
            self.handlers.append(h)
        return h

    def _start_on_import(self, cls: type[Handler]) -> None:
        """A handler that hooks a framework starts when the program imports it (now, if it
        already has), so programs that never import it pay nothing."""
        module = cls.starts_on_import or ""
        if module not in sys.modules and importlib.util.find_spec(module.partition(".")[0]) is None:
            return

        def begin(_module: Any = None) -> None:
            if self._stopped:
                return
            self._start_handler(cls)
            self._update_gate()  # the gate at the source, for a step or range before the import

        after_import(module, begin)

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
                try:
                    h.stop()
                except Exception as e:  # one handler's trouble must not cost the others' last events
                    _warn(f"{getattr(h, 'name', type(h).__name__)} handler did not stop cleanly: "
                          f"{type(e).__name__}: {e}")
            self.stop_handlers_seconds = time.perf_counter() - t1
            self._close_gate()
            t1 = time.perf_counter()
            with system_memory():
                self.flush(final=True)
            self.final_flush_seconds = time.perf_counter() - t1
            self.status.pop("exit", None)
            self.reports = self.processor.finish() if self.processor.tools else []
            self._late_status(final=True)
        except Exception as e:
            _stopped(e)
        if _stop_reason:  # not a crash: the process ended, capture had stopped (said once already)
            self.status["exit"] = _stop_reason[0]
        self._write_meta(stop_t0=t0)  # stop_seconds includes this manifest write (all but its last write)
        return self.reports

    @staticmethod
    def _gpu_present() -> bool:
        if os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/kfd"):
            return True
        return False

    # -- flushing ------------------------------------------------------------
    def flush(self, final: bool = False) -> None:
        t0 = time.perf_counter()
        for h in self.handlers:
            if isinstance(h, Handler):
                try:
                    h.before_drain(final)
                except Exception as e:  # its drain may still deliver; the others' surely
                    self._handler_trouble(h.name, "before_drain", e)
        phases: dict[str, float] = {}  # where this flush's time went (the final one's is in the manifest)
        take: list[int] = []  # when this flush took its rows (live/flush.py: flushed_through_ns)
        try:
            wrote = self._flush_taken(final, t0, phases, take)
        finally:
            if take:
                self._take_end(take[0])
        if not final and (wrote or self._part % 10 == 1):  # the final one: stop() writes it next
            self._write_meta()

    def _flush_taken(self, final: bool, t0: float, phases: dict[str, float], take: list[int]) -> bool:
        """Drain every handler, link, gate and write the parts of one flush (``take`` gets
        the moment of the drain); whether any part was written."""
        with self._lock:
            take.append(self._take_begin())
            tables: dict[str, pa.Table] = {}
            for h in self.handlers:
                t1 = time.perf_counter()
                try:
                    drained = self._drained(h)
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
            try:
                t = conform(kind, t.append_column("pid", pa.array(np.full(t.num_rows, self.pid, np.int64)))
                            if "pid" not in t.column_names else t)
            except (pa.ArrowException, ValueError, TypeError) as e:  # columns that do not cast to the schema
                self._handler_trouble(kind, "conform", e)
                continue
            t = sort_by_start(t)
            self._write_part(kind, t, part)
            with self._lock:  # flushes may overlap (live/flush.py)
                self.events[kind] = self.events.get(kind, 0) + t.num_rows
                self.processor.submit(kind, t, self.rank)
        phases["write_parts"] = time.perf_counter() - t1
        with self._lock:
            self.flush_seconds += time.perf_counter() - t0
        if final:
            self.final_flush_phases = {k: round(v, 6) for k, v in phases.items()}
        return bool(tables)

    def _drained(self, h: Any) -> dict[str, pa.Table]:
        """One handler's drain as {kind: Table}: a mapping or (kind, Table | RecordBatch) pairs;
        kinds a Handler did not declare are dropped, with one warning per handler and kind."""
        out = h.drain()
        pairs = out.items() if hasattr(out, "items") else (out or ())
        tables: dict[str, pa.Table] = {}
        declared = h.kinds if isinstance(h, Handler) else None
        for kind, t in pairs:
            if declared is not None and kind not in declared and kind not in _INTERNAL_KINDS:
                if (h.name, kind) not in self._bad_kinds:
                    self._bad_kinds.add((h.name, kind))
                    _warn(f"{h.name} handler emitted {kind!r} events, not among its kinds "
                          f"({', '.join(declared)}): dropped")
                continue
            if isinstance(t, pa.RecordBatch):
                t = pa.Table.from_batches([t])
            elif not isinstance(t, pa.Table):
                raise TypeError(f"{kind} events as a {type(t).__name__}, not a pyarrow Table or RecordBatch")
            if declared is not None and kind not in _INTERNAL_KINDS and type(h).__module__.split(".")[0] != "pastaprof":
                # a plugin's (pastaprof's own add columns like rank while linking, after the drain)
                missing = [f.name for f in schema(kind) if not f.nullable and f.name not in t.column_names]
                if missing:
                    raise ValueError(f"{kind} events without the column(s) {', '.join(missing)}")
            tables[kind] = merge(kind, [tables[kind], t]) if kind in tables else t
        return tables

    def _handler_trouble(self, what: str, where: str, e: Exception) -> None:
        """One warning per handler (or kind) and place; the events concerned of that flush are lost."""
        key = f"{what} {where}"
        if key not in self._troubles:
            self._troubles.add(key)
            _warn(f"{what} events of a flush lost ({where}): {type(e).__name__}: {e}")
            self.status["drain failed"] = f"{self.status.get('drain failed', '')} {what}".strip()

    def _write_part(self, kind: str, table: pa.Table, part: int) -> None:
        write_part(self.out / kind / f"rank-{self.rank}-pid-{self.pid}-part-{part:05d}.parquet", table)

