"""CUPTI Activity handler: GPU kernels, copies, memsets, syncs and launch calls.

Uses NVIDIA's ``cupti-python`` and the libcupti that PyTorch already loaded
(``cuda.pathfinder`` reuses a loaded ``libcupti.so``; we never load a second
one).  This module is the handler's lifecycle: which kinds are enabled, launch
calls through CUPTI's callback API, the session's gate at the source, and
giving CUPTI to a foreign client (torch.profiler) and taking it back.  Records
become columns in cupti_records.py, off the application's thread.  Timestamps
are CUPTI ns, which share ``time.time_ns()``'s clock (verified on the H200 to
~2 us).

Launch-call rows are kept only for launch, copy, memset, synchronize and stream-wait calls
(what correlation and the timeline need) -- see docs/benchmarks.md.  With the launch callbacks,
the synchronize and stream-wait calls' rows also give the sync rows (``sync_type``; the native
injection library maps names the same way in C, inject_callbacks.c's ``pp_sync_type``).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from pastaprof.handlers.base import Gated, Handler, HandlerContext
from pastaprof.handlers.cupti_records import BUFFER_BYTES, FIELDS, CuptiRecords
from pastaprof.live.config import CaptureConfig

_API_KEEP = ("Launch", "Memcpy", "Memset", "Synchronize", "StreamWaitEvent", "Graph")


def sync_type(name: str) -> int:
    """The CUpti_ActivitySynchronizationType of a call named ``name`` (a CUPTI cbid name such
    as ``cudaStreamSynchronize_v3020``), or 0 for a call that is no synchronization."""
    if "StreamWaitEvent" in name:
        return 2
    if "EventSynchronize" in name:
        return 1
    if "StreamSynchronize" in name:
        return 3
    if any(k in name for k in ("DeviceSynchronize", "CtxSynchronize", "ThreadSynchronize")):
        return 4
    return 0


def cupti_status() -> str | None:
    """None if cupti-python can be used here, else a one-line reason."""
    try:
        from cupti import cupti  # noqa: F401
    except Exception as e:  # ImportError, or its library loader failing
        return f"cupti-python unavailable ({type(e).__name__}: {e})"
    return None




class CuptiActivityHandler(CuptiRecords, Handler, Gated):
    """Collects GPU activity through the CUPTI Activity API."""

    name = "cupti"
    kinds = ("kernel", "memcpy", "memset", "sync", "api", "alloc", "free", "uvm")
    native_library = "cupti"
    order = 20  # after the Compute Sanitizer (one callback subscriber), before the op observer
    listed_when_unavailable = True

    @classmethod
    def create(cls, ctx: HandlerContext) -> CuptiActivityHandler | None:
        """Not in forked children: no CUDA after fork, so no CUPTI import either."""
        return cls(ctx.config, ctx.rank) if ctx.gpu else None

    def __init__(self, config: CaptureConfig, rank: int = 0) -> None:
        self.config = config
        self.rank = rank
        self.status: str | None = cupti_status()
        self.dropped = 0
        self.records = 0
        self.sampled_out = 0
        self.kernels_seen = 0  # kernel records CUPTI delivered, before any filtering
        self.force_flush = False  # set once a foreign CUPTI client has come and gone
        self.reattached = 0
        self.reattach_flushes = 0  # flushes that re-register first (after a foreign client left)
        self._lock = threading.Lock()
        self._launch_seq = 0
        self._rows: dict[str, list[tuple]] = {kind: [] for kind in FIELDS}
        self._api_names: dict[int, str | None] = {}
        self._driver_names: dict[int, str | None] = {}
        self._cupti: Any = None
        self._enabled: list = []
        self._native: Any = None  # NativeCupti: buffers decoded in C
        self.mechanism = "python"
        self.native_status: str | None = None
        self.native_external: tuple[int, int, int] | None = None  # (push ptr, pop ptr, kind) for C++ callers
        self.buffers_at_reattach = -1  # diagnostics: buffers CUPTI had asked us for at the last reattach
        # how launch calls (and their ops) are recorded: "callbacks" (CUPTI callback API, the native
        # drain's), "activity" (RUNTIME/DRIVER + EXTERNAL_CORRELATION records) or "off"
        self.api_mechanism = "activity"
        # how synchronizations are recorded: "activity" (CUPTI's SYNCHRONIZATION records) or
        # "callbacks" (rows written by the launch callbacks; the kind stays off: it made every
        # kernel launch dearer)
        self.sync_mechanism = "activity"
        # The session's gate at the source (set_gate): closed outside the selected steps and
        # ranges, where the kinds that make a record per launch are disabled.
        self._gate_open = True
        self._gate_lock = threading.Lock()
        # between release() and reattach() a foreign client (torch.profiler) owns CUPTI's kinds:
        # the gate then only remembers its state (disabling a kind would cut the user's trace)
        self._foreign = False
        self.gate_changes = 0
        self.gate_seconds = 0.0  # spent switching, on the program's thread

    # -- lifecycle ---------------------------------------------------------
    def start(self) -> None:
        if self.status is not None:
            return
        from cupti import cupti

        self._cupti = cupti
        # torch.profiler (Kineto) otherwise tears CUPTI down (cuptiFinalize) lazily at a
        # callback after its session, undoing our re-attachment; a user's own setting wins.  In the
        # C environment only (Kineto reads it there): the program's os.environ stays its own.
        if "TEARDOWN_CUPTI" not in os.environ:
            os.putenv("TEARDOWN_CUPTI", "0")
        K = cupti.ActivityKind
        try:
            self._native = self._bind_native()
            self._register()
            off = self.config.is_off
            # No timestamp callback of our own yet: CUPTI's default clock already is
            # time.time_ns()'s, and a registered callback made every traced launch dearer
            # (H200: 20,000 tiny launches 1.84x -> 1.24x of bare without it; bench/overhead.py
            # --breakdown).  It is registered at reattach(), after a foreign client (Kineto)
            # left its own clock behind.
            kinds = [K.CONCURRENT_KERNEL, K.MEMCPY, K.MEMSET, K.SYNCHRONIZATION]
            if self._native is not None:  # decoded only in C: cudaMalloc-level and pool events
                kinds += [K.MEMORY2, K.MEMORY_POOL]
            kept = self._keep_api_names()
            if off("api"):
                self.api_mechanism = "off"
            else:
                self._launch_calls(kept)
                if self.api_mechanism == "activity":
                    # DRIVER too: cuBLAS/cuDNN launch through the driver API, and CUPTI emits the
                    # external-correlation record (op -> kernel) only for traced API calls.
                    kinds += [K.RUNTIME, K.DRIVER]
                elif not off("sync"):  # sync rows from the launch callbacks (cupti_callbacks.c)
                    self._native.sync_rows(self._sync_cbids(kept))
                    kinds.remove(K.SYNCHRONIZATION)
                    self.sync_mechanism = "callbacks"
            dropped = {K.CONCURRENT_KERNEL} if off("kernels") else set()
            dropped |= {K.MEMORY2, K.MEMORY_POOL} if off("memory") else set()
            dropped |= {K.MEMCPY, K.MEMSET} if off("copies") else set()
            dropped |= {K.SYNCHRONIZATION} if off("sync") else set()
            kinds = [k for k in kinds if k not in dropped]
            for kind in kinds:
                cupti.activity_enable(kind)
                self._enabled.append(kind)
            if self.api_mechanism == "activity":
                self._filter_api()
            cupti.activity_flush_period(self.config.flush_ms)
        except Exception as e:  # e.g. another CUPTI client (torch.profiler, nsys) holds it
            self.status = f"CUPTI activity tracing could not start ({e})"
            if self.api_mechanism == "callbacks":
                self._native.callbacks_off()
            self._disable()

    def _bind_native(self) -> Any:
        """The C buffer drain bound to the libcupti in this process, or None (then
        cupti-python's record objects are decoded in Python)."""
        from pastaprof import native
        from pastaprof.handlers.cupti_native import NativeCupti

        try:
            self._cupti.get_timestamp()  # makes cupti-python load libcupti (torch's, if torch loaded it)
        except Exception:
            pass
        path = native.loaded_libcupti()
        try:
            if path is None:
                raise RuntimeError("libcupti is not loaded in this process")
            drain = NativeCupti(native.load("cupti"), path, BUFFER_BYTES)
        except RuntimeError as e:
            self.native_status = f"native CUPTI drain unavailable ({e}); decoding records in Python"
            return None
        self.mechanism = "native"
        return drain

    def _own_clock(self) -> None:
        """Timestamps on time.time_ns()'s clock, registered with no kind enabled (CUPTI's
        rule), after a foreign client left its clock behind.  Only the native drain can:
        cupti-python takes no C timestamp callback; its path keeps whatever clock is set."""
        if self._native is not None:
            try:
                self._native.own_clock()
            except RuntimeError as e:  # CUPTI's own clock then; say so in the manifest
                self.native_status = f"timestamps on CUPTI's default clock ({e})"

    def _register(self) -> None:
        if self._native is not None:
            self._native.register()
        else:
            self._cupti.activity_register_callbacks(self._buffer_requested, self._buffer_completed)

    def enable_uvm(self, device: int) -> str | None:
        """Unified-memory counters (after the CUDA context exists).  Returns None, or a
        one-line reason why they are not recorded (the rest of the capture goes on)."""
        if self._cupti is None or self.status is not None:
            return "unified-memory counters not recorded: CUPTI is not available"
        if self._native is None:
            return "unified-memory counters not recorded: they need the native CUPTI drain"
        K = self._cupti.ActivityKind
        try:
            self._native.configure_uvm(device)
            self._cupti.activity_enable(K.UNIFIED_MEMORY_COUNTER)
            self._enabled.append(K.UNIFIED_MEMORY_COUNTER)
        except Exception as e:  # e.g. UM profiling not supported (MIG, some virtualised hosts)
            return f"unified-memory counters not supported here ({e}); the rest of the capture goes on"
        return None

    def _launch_calls(self, kept: list[tuple[bool, int]]) -> None:
        """Launch calls through CUPTI's callback API when the native drain is bound and the
        subscriber slot is free (cheaper per launch than activity records: see
        native/cupti_callbacks.c); else as activity records."""
        if self._native is None or self.config.is_off("callbacks"):
            return
        r = self._native.callbacks_on(kept)
        if r == 0:
            self.api_mechanism = "callbacks"
        else:  # e.g. a profiler (torch.profiler, nsys) subscribed before us
            why = f"cuptiEnableCallback error {r - 1000}" if r >= 1000 else f"cuptiSubscribe error {r}"
            self.native_status = f"launch calls recorded as CUPTI activity records (callback API refused: {why})"

    def release(self) -> None:
        """Before a foreign CUPTI client (torch.profiler) takes over: deliver what we have,
        and give back CUPTI's one subscriber slot (Kineto keeps it for the rest of the
        process), so launch calls come as activity records from then on."""
        self.flush()
        with self._gate_lock:
            self._foreign = True
        if self.api_mechanism == "callbacks":
            self._native.callbacks_off()
            self.api_mechanism = "activity"
            K = self._cupti.ActivityKind
            add = [K.RUNTIME, K.DRIVER] + ([K.EXTERNAL_CORRELATION] if self.native_external else [])
            if self.sync_mechanism == "callbacks":  # the callbacks are gone: CUPTI's records again
                add.append(K.SYNCHRONIZATION)
                self.sync_mechanism = "activity"
            self._enabled += [k for k in add if k not in self._enabled]  # enabled at reattach()

    def reattach(self) -> None:
        """After a foreign client's session: CUPTI's buffer callbacks are process-global
        (last registration wins) and it disabled its kinds, so register and enable again."""
        if self._cupti is None or self.status is not None:
            return
        with self._gate_lock:  # a step or range switching the gate meanwhile waits
            self._reattach()

    def _reattach(self) -> None:
        cupti = self._cupti
        self._foreign = False
        try:
            if self._native is not None:
                try:  # Kineto leaves per-thread activity buffers on (process-wide)
                    self._native.shared_buffers()
                except RuntimeError:
                    pass  # best effort: the re-registration below is what matters
            self._register()
            # Complete every buffer CUPTI still holds (it may have been requested through the
            # foreign client's callback) so the next records go to buffers we hand out.
            cupti.activity_flush_all(1)
            # Kineto leaves its own (TSC) timestamp source registered.  CUPTI wants a timestamp
            # callback registered before any kind is enabled; registered with kinds still on,
            # ours did not take effect at once on the H200, so disable every kind (theirs too),
            # register our clock, then enable ours.
            for kind in cupti.ActivityKind:
                try:
                    cupti.activity_disable(kind)
                except Exception:  # noqa: BLE001 -- kinds this CUPTI or device does not have
                    pass
            self._own_clock()
            for kind in self._enabled:
                if self._gate_open or kind not in self._per_launch_kinds():
                    cupti.activity_enable(kind)
            self._filter_api()
            try:  # the foreign client may have changed CUPTI's flush period
                cupti.activity_flush_period(self.config.flush_ms)
            except Exception:
                pass
            # and from now on each of our flushes forces one: Kineto may leave records in
            # per-thread buffers that only a forced flush completes
            self.force_flush = True
            self.reattached += 1
            if self._native is not None:
                self.buffers_at_reattach = self._native.stat("buffers_requested")
        except Exception as e:
            self.status = f"CUPTI could not be taken back after torch.profiler ({e})"

    def start_notes(self) -> dict[str, str]:
        return {"cupti native": self.native_status} if self.native_status and self.status is None else {}

    def before_drain(self, final: bool) -> None:
        """After a foreign client's session, re-register at the next flushes too (it may
        disable kinds after its session object exited, from its own thread), and force
        CUPTI's buffers out (Kineto leaves records in per-thread buffers)."""
        if final:
            return
        if self.reattach_flushes > 0:
            self.reattach_flushes -= 1
            self.reattach()
        if self.force_flush:
            self.flush()

    def stats(self) -> dict[str, Any]:
        return {**super().stats(), "reattached": self.reattached, "buffers": getattr(self, "buffers", None),
                "gate_changes": self.gate_changes, "gate_seconds": round(self.gate_seconds, 6)}

    def external_correlation(self):
        """(push, pop) callables tagging the calling thread's launches with an id
        (CUPTI external correlation, kind CUSTOM2), or (None, None)."""
        if self.status is not None or self._cupti is None or self.config.is_off("ext"):
            return None, None
        cupti = self._cupti
        if self.api_mechanism == "activity":  # the callbacks read the op stack themselves
            try:
                with self._gate_lock:
                    if self._gate_open:
                        cupti.activity_enable(cupti.ActivityKind.EXTERNAL_CORRELATION)
                    self._enabled.append(cupti.ActivityKind.EXTERNAL_CORRELATION)
            except Exception:
                return None, None
        kind = int(cupti.ExternalCorrelationKind.CUSTOM2)
        if self._native is not None:
            self.native_external = (*self._native.push_pop, kind)
            native = self._native
            return (lambda i: native.tls_push(kind, i)), (lambda: native.tls_pop(kind))
        from pastaprof import native as native_build

        path = native_build.loaded_libcupti()
        try:
            if path:
                self.native_external = (*native_build.external_correlation_fns(path), kind)
        except (OSError, AttributeError):
            pass
        push, pop = cupti.activity_push_external_correlation_id, cupti.activity_pop_external_correlation_id
        return (lambda i: push(kind, i)), (lambda: pop(kind))

    def _per_launch_kinds(self) -> set:
        """The kinds that make records per launch, copy or call: off while the gate is closed.
        Allocation (MEMORY2, MEMORY_POOL) and unified-memory records stay on: an allocation
        made outside a window and freed inside it is understood, as the tensor tracker's."""
        K = self._cupti.ActivityKind
        return {K.CONCURRENT_KERNEL, K.MEMCPY, K.MEMSET, K.SYNCHRONIZATION, K.RUNTIME, K.DRIVER,
                K.EXTERNAL_CORRELATION}

    def set_gate(self, open_: bool) -> None:
        """Capture gated at the source: outside the selected steps and ranges, kernel, copy,
        memset, sync and launch-call records are switched off in CUPTI (and the launch
        callbacks' cbids), so launches there do not pay for records the store would drop.
        Records of work launched while the gate was open are still delivered (checked on the
        H200 by scripts/gpu_live_check.py: a --steps window keeps a whole step's kernels)."""
        if self._cupti is None or self.status is not None:
            return
        with self._gate_lock:
            if open_ == self._gate_open:
                return
            t0 = time.perf_counter()
            self._gate_open = open_
            self.gate_changes += 1
            if self._foreign:  # applied at reattach()
                return
            per_launch = self._per_launch_kinds()
            switch = self._cupti.activity_enable if open_ else self._cupti.activity_disable
            try:
                for kind in self._enabled:
                    if kind in per_launch:
                        switch(kind)
                if open_ and self.api_mechanism == "activity":
                    self._filter_api()
                if self.api_mechanism == "callbacks":
                    self._native.callbacks_gate(open_)
            except Exception as e:  # capture goes on ungated: the store still gates
                self.native_status = f"CUPTI not gated at the source ({type(e).__name__}: {e})"
                for kind in self._enabled:
                    try:
                        self._cupti.activity_enable(kind)
                    except Exception:
                        pass
                self._gate_open = True
            self.gate_seconds += time.perf_counter() - t0

    def _keep_api_names(self) -> list[tuple[bool, int]]:
        """The launch/copy/memset/sync calls worth a row, as (driver, cbid); names kept for
        the rows' labels.  PyTorch makes ~5 runtime calls per kernel (cudaGetDevice,
        cudaStreamIsCapturing, ...) that nothing here needs."""
        cupti = self._cupti
        kept = []
        for driver, names, enum in ((False, self._api_names, cupti.RuntimeApiTraceCbid),
                                    (True, self._driver_names, cupti.DriverApiTraceCbid)):
            for name, cbid in enum.__members__.items():
                keep = any(key in name for key in _API_KEEP)
                names[int(cbid)] = name if keep else None
                if self._native is not None:
                    self._native.keep_api(driver, int(cbid), keep)
                if keep:
                    kept.append((driver, int(cbid)))
        return kept

    def _sync_cbids(self, kept: list[tuple[bool, int]]) -> list[tuple[bool, int, int, bool]]:
        """(driver, cbid, sync type, per-thread stream) of the kept calls that synchronize."""
        out = []
        for driver, cbid in kept:
            name = (self._driver_names if driver else self._api_names).get(cbid) or ""
            if t := sync_type(name):
                out.append((driver, cbid, t, "_pt" in name))
        return out

    def _filter_api(self) -> None:
        """Activity records only for the kept calls: each record costs CUPTI and us time."""
        cupti = self._cupti
        for names, enable in ((self._api_names, cupti.activity_enable_runtime_api),
                              (self._driver_names, cupti.activity_enable_driver_api)):
            for cbid, name in names.items():
                if name is None:
                    try:
                        enable(cbid, 0)
                    except Exception:
                        pass

    def flush(self) -> None:
        """Ask CUPTI to hand over every buffer, even incomplete ones (at stop; while
        running, CUPTI's own flush period delivers buffers)."""
        if self._cupti is not None and self.status is None:
            try:
                self._cupti.activity_flush_all(1)
            except Exception:
                pass

    def stop(self) -> None:
        self.flush()
        if self.api_mechanism == "callbacks":
            self._native.callbacks_off()  # rows recorded so far stay for the final drain
        if self._native is not None:
            self._native_stats()
        elif self._cupti is not None:
            try:
                import numpy as np

                out = np.zeros(1, dtype=np.uint64)
                self._cupti.activity_get_num_dropped_records(0, 0, out.ctypes.data)
                self.dropped += int(out[0])
            except Exception:
                pass
        self._disable()

    def _disable(self) -> None:
        for kind in self._enabled:
            try:
                self._cupti.activity_disable(kind)
            except Exception:
                pass
        self._enabled.clear()
