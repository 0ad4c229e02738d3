"""When a session flushes: loss bounded in time, op rows in memory bounded by construction.

The flush thread runs at nice 19, so that a periodic flush landing in a
CPU-bound region does not deschedule the program's OpenMP workers (2-core dev VM: an
MLP training loop took 2-4x as long at nice 0).  But nice 19 starves on a busy host: a
hot loop on a loaded 2-core machine wrote its first part after more than 8 s.  So a
deadline thread, at the program's priority, waits in C with the GIL released
(``pp_obs_wait``, a futex) and hands a flush to one of two spill threads (also at the
program's priority, asleep until then), and goes on watching,

* when the last flush ended more than ``DEADLINE_PERIODS`` flush periods ago
  (``deadline_ms``; the wait times out every 50 ms to look), even while a starved flush of
  the nice thread is in progress (flushes may overlap: each writes its own part numbers);
* when the op observer's buffer reaches ``buffer_rows`` (``PASTAPROF_BUFFER_MB``) rows, or
  another multiple of it: the op that reaches it wakes the deadline thread at once (one
  futex wake per ``buffer_rows`` ops, never a wait or a lock on the program's thread).  It
  wakes the nice flush thread first (cheapest for the program's threads), and hands the rows
  to a spill thread if that has not started within a look (50 ms) or when the buffer reaches
  twice the budget (also, while a flush is still writing the previous rows, beside it): the
  rows are written to disk, not dropped.  Past half of it, at a look, the flush thread is
  woken early;
* periodically in its place, for a while, once the flush thread's last flush took far
  longer in wall time than in CPU time (it was starved).

Each of the flush thread's flushes runs on a thread of its own at nice 19 (the flush thread
sleeps at the program's priority: a SIGKILL ends a process only once each of its threads has
run).  A starved nice flush holds the rows it took (and the session's drain lock while it
drains and links them): the spill flushes after it could not make those rows safe.  So once it
has run for a flush period, the deadline thread raises it to the program's priority
(``raised_flushes``).  Where the process may not lower a nice value (no ``CAP_SYS_NICE``,
``RLIMIT_NICE`` 0), the spill threads flush in the flush thread's place from then on
(``nice_lowered`` false in the manifest).

Each process's manifest says how far its events are safe: ``flushed_through_ns`` (wall clock),
before which every event its handlers had delivered is in a part: the take of the latest
completed flush with no flush that took earlier still in progress.  (GPU activity records reach
the handlers when CUPTI hands over a buffer, which can be later than the work they describe.)
``pastaprof run`` states the loss of a program that died without its final flush from it (its
death, as it reaped it, minus that time).

Bounds, whatever the load:

* the observer's buffer never holds more than ``cap_rows`` = ``CAP_BUFFERS`` x
  ``buffer_rows`` op rows (checked under its lock for each op, from the first op on): the
  rows of ops past it are not recorded but counted, and said in the exit line and in
  run.json's ``dropped_events``.  Its most at once is ``capture_overhead.max_pending_rows``
  (exact, kept by the observer).  Flushes in progress (at most ``_SPILLERS`` + 1) each hold
  the rows they took, at most ``cap_rows`` each;
* a process that dies of SIGKILL loses what it recorded after its last flush: at most
  ``deadline_ms``, plus a flush period (a starved flush in progress is overlapped after one),
  plus the run of the flush that completed last and of the one in progress (each at most
  ``longest_flush_ms``, the longest measured of the flushes that were not starved), plus one
  look; at most ``cap_rows`` op rows (normally about ``buffer_rows``: the spill starts as the
  buffer reaches it).

The bounds are in each process's ``capture_overhead.bounds`` in run.json.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

from pastaprof.live import threads
from pastaprof.live.messages import stopped as _stopped
from pastaprof.store.parts import free_shard, next_part_numbers, warm_up

ROW_BYTES = 128  # an op row in the observer's buffer: 14 columns + ~2 input pointers (torch_observer.cpp: kRowBytes)
CAP_BUFFERS = 16  # the observer keeps at most this many buffers' rows (torch_observer.cpp: kCapBuffers)
DEADLINE_PERIODS = 2
_TICK_S = 0.05  # the deadline thread's look
LOOK_MS = round(_TICK_S * 1000)
_STARVED_PERIODS = 10  # after a starved flush, the deadline thread flushes for this many periods
_SPILLERS = 2  # flush threads at the program's priority the deadline thread hands flushes to


class ForkGuard:
    """Flushes hold it shared, a fork of the program alone (``acquire``/``release``, as
    live.py's fork hooks use it): a child forked mid-flush inherited the flush thread's
    import lock held, and hung at its first import of that module."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._flushers = 0
        self._forking = False

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        with self._cond:
            free = lambda: not self._flushers and not self._forking  # noqa: E731
            ok = self._cond.wait_for(free, None if timeout < 0 else timeout) if blocking else free()
            if ok:
                self._forking = True
            return ok

    def release(self) -> None:
        with self._cond:
            self._forking = False
            self._cond.notify_all()

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._forking)
            self._flushers += 1
        try:
            yield
        finally:
            with self._cond:
                self._flushers -= 1
                self._cond.notify_all()


class FlushScheduler:
    """The flush and deadline threads of a Session (which provides ``flush``, ``config``,
    ``handlers``, ``_stop``)."""

    config: Any
    handlers: list[Any]
    _stop: threading.Event
    out: Any
    rank: int
    pid: int
    _part: int
    _meta_name: str

    def flush(self, final: bool = False) -> None:  # pragma: no cover - the Session's
        raise NotImplementedError

    def _init_scheduler(self) -> None:
        self.fork_guard = ForkGuard()
        self._wake = threading.Event()
        self._sched = threading.Lock()
        self._active: dict[int, float] = {}  # thread id -> start of its flush in progress
        self._last_flush = time.monotonic()  # when the last flush ended
        self._starved_until = 0.0
        self._nice_woken: float | None = None  # when the flush thread was woken for a full buffer
        self.deadline_flushes = 0  # flushes the deadline thread made (the flush thread was late or starved)
        self.starved_flushes = 0  # flush-thread flushes that took > 3x their CPU time in wall time
        self.longest_flush_s = 0.0  # the longest flush not starved at nice 19, wall time (a term of the loss bound)
        self._observers: list[Any] = []  # the native op observers' libraries, their limits set
        self._threads: list[threads.HiddenThread] = []
        self._takes: list[int] = []  # wall ns at which each flush in progress took its rows, in take order
        self._done: list[int] = []  # takes of completed flushes later than flushed_through_ns
        self.flushed_through_ns = time.time_ns()  # every event recorded before is in a part
        self._nice_tid = 0  # native id of the thread flushing at nice 19, while it runs
        self._nice_since = 0.0  # when it started
        self._base_nice = 0  # the flush thread's nice value: the program's, what a raised flush gets
        self.raised_flushes = 0  # nice flushes the deadline thread raised to the program's priority
        self.nice_lowered = True  # whether the flush thread runs at nice 19 (see _raise_stuck)

    def _take_begin(self) -> int:
        """A flush is about to drain: its rows are everything recorded until now (drains hold
        the session's lock, so takes come in order)."""
        take = max(time.time_ns(), self._takes[-1] + 1 if self._takes else 0)
        with self._sched:
            self._takes.append(take)
        return take

    def _take_end(self, take: int) -> None:
        """The flush that took at ``take`` wrote its parts (or gave up on them): advance
        ``flushed_through_ns`` over every completed take with no earlier one in progress."""
        with self._sched:
            self._takes.remove(take)
            self._done.append(take)
            first_open = self._takes[0] if self._takes else None
            safe = [t for t in self._done if first_open is None or t < first_open]
            if safe:
                self.flushed_through_ns = max(self.flushed_through_ns, max(safe))
                self._done = [t for t in self._done if t > self.flushed_through_ns]

    def _start_threads(self) -> None:
        self._spill = [(threading.Event(), threading.Event()) for _ in range(_SPILLERS)]  # (go, busy)
        targets = [(self._flush_loop, "pastaprof-flush", ()), (self._deadline_loop, "pastaprof-deadline", ())]
        targets += [(self._spill_loop, f"pastaprof-spill-{i}", (i,)) for i in range(_SPILLERS)]
        for target, name, args in targets:
            self._threads.append(threads.start(target, name, args))  # not among the program's threads

    def _join_threads(self, timeout: float) -> None:
        self._wake.set()
        for lib in self._observers:
            lib.pp_obs_notify()  # the deadline thread waits in C
        for go, _busy in getattr(self, "_spill", []):
            go.set()
        end = time.monotonic() + timeout
        for th in self._threads:
            if th.ident != threading.get_ident():
                th.join(timeout=max(0.0, end - time.monotonic()))

    def bounds(self) -> dict[str, int]:
        """What a process's end may lose at most (rows recorded since its last flush), and
        the most op rows its buffer holds (``cap_rows``: more are dropped, counted)."""
        rows = (self.config.buffer_mb << 20) // ROW_BYTES
        return {"flush_ms": self.config.flush_ms, "deadline_ms": DEADLINE_PERIODS * self.config.flush_ms,
                "buffer_bytes": self.config.buffer_mb << 20, "buffer_rows": rows, "cap_rows": CAP_BUFFERS * rows}

    @property
    def max_pending_rows(self) -> int:
        """The most op rows the observer's buffer held at once (exact, counted in C)."""
        return max((int(lib.pp_obs_max_pending()) for lib in self._observer_libs()), default=0)

    def _observer_libs(self) -> list[Any]:
        """The native op observers' libraries (one, shared, where torch is observed), each
        given the buffer's limits the first time it is seen (the observer starts with the
        same ones, from PASTAPROF_BUFFER_MB)."""
        for h in list(self.handlers):
            lib = getattr(getattr(h, "native", None), "lib", None)
            if lib is not None and hasattr(lib, "pp_obs_wait") and all(lib is not o for o in self._observers):
                b = self.bounds()
                lib.pp_obs_limits(b["buffer_rows"], b["cap_rows"])
                self._observers.append(lib)
        return self._observers

    def _pending_rows(self) -> int:
        """Op rows waiting in the native observers' buffers (0 where none runs)."""
        return sum(int(lib.pp_obs_pending()) for lib in self._observers)

    def _timed_flush(self) -> tuple[float, float]:
        """One flush from this thread; (wall, CPU) seconds it took."""
        me = threading.get_ident()
        with self.fork_guard.shared():
            with self._sched:
                self._active[me] = time.monotonic()
            w0, c0 = time.monotonic(), time.thread_time()
            try:
                self.flush()
            finally:
                with self._sched:
                    self._active.pop(me, None)
                    self._last_flush = time.monotonic()
        return time.monotonic() - w0, time.thread_time() - c0

    def _at_nice(self, work: Any, *args: Any) -> Any:
        """``work(*args)`` on a thread of its own at nice 19, waited for here; its result (or
        the exception it raised).  The flush thread itself stays at the program's priority
        while it sleeps: a process killed by SIGKILL ends only once each of its threads has
        run, and a sleeping thread at nice 19 on a busy host delayed that by seconds."""
        result: list[Any] = []

        def run() -> None:
            try:  # Linux niceness is per thread; raising it is always allowed
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
                self._nice_tid = threading.get_native_id()
            except (AttributeError, OSError):
                pass
            try:
                result.append(work(*args))
            except Exception as e:  # noqa: BLE001 -- given to the flush thread
                result.append(e)
            finally:
                self._nice_tid = 0

        self._nice_since = time.monotonic()
        try:
            threads.start(run, "pastaprof-flush-nice").join()
        except RuntimeError:  # no thread to be had (a thread limit): this one does the work, as it is
            return self._at_once(work, *args)
        return result[0] if result else RuntimeError("the flush's thread ended without a result")

    @staticmethod
    def _at_once(work: Any, *args: Any) -> Any:
        try:
            return work(*args)
        except Exception as e:  # noqa: BLE001 -- given to the flush thread, as _at_nice does
            return e

    def _raise_stuck(self, now: float) -> None:
        """The nice thread's flush has run for a flush period (holding the rows it took, or about
        to take them): back to the program's priority for the rest of it.  If this process may
        not lower a nice value, the spill threads (at the program's priority) make the flush
        thread's flushes from then on."""
        tid = self._nice_tid
        if not tid or now - self._nice_since <= self.config.flush_ms / 1000:
            return
        try:
            os.setpriority(os.PRIO_PROCESS, tid, self._base_nice)
            self.raised_flushes += 1
        except OSError:
            self.nice_lowered = False
        self._nice_tid = 0

    def _warm_up(self) -> None:
        with self.fork_guard.shared():
            warm_up()

    def _flush_loop(self) -> None:
        with contextlib.suppress(AttributeError, OSError):  # the program's priority (`nice pastaprof run`)
            self._base_nice = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        self._at_nice(self._warm_up)  # Arrow/Parquet first-call costs, here rather than in the final flush
        period = self.config.flush_ms / 1000
        while not self._stop.is_set():
            self._wake.wait(period)
            self._wake.clear()
            if self._stop.is_set() or time.monotonic() < self._starved_until:
                continue
            if not self.nice_lowered:  # a nice flush could not be raised: a spill thread flushes instead
                self._hand_off()
                continue
            done = self._at_nice(self._timed_flush)
            if isinstance(done, Exception):
                _stopped(done)
                self._stop.set()
                return
            wall, cpu = done
            if wall > 3 * cpu + 0.05:  # descheduled for most of it: let the deadline thread flush a while
                self.starved_flushes += 1
                self._starved_until = time.monotonic() + _STARVED_PERIODS * period
            else:  # (a starved one does not bound the loss: a spill flush overlaps it after a period)
                self.longest_flush_s = max(self.longest_flush_s, wall)

    def _after_exec(self) -> None:
        """A session of this pid wrote before (this process image came by exec, or an exec
        failed): keep its shard, continue its part numbers.  This image numbers its ops and
        CUPTI its launches from 1 again: compaction shifts them past the earlier image's, which
        wrote the parts before ``first_part``."""
        shard = free_shard(self.out, self.rank, self.pid)
        if shard.name == f"rank-{self.rank}-pid-{self.pid}.json":  # no earlier session of this pid
            return
        self._meta_name = shard.name
        self._part = next_part_numbers(self.out).get((self.rank, self.pid), 0)
        self.first_part = self._part  # compaction tells this image's parts from the earlier one's by it

    def _deadline_due(self, rows: int) -> bool:
        b = self.bounds()
        period = self.config.flush_ms / 1000
        now = time.monotonic()
        with self._sched:
            age = now - self._last_flush
            oldest = min(self._active.values(), default=None)
            running = len(self._active)
        if rows >= 2 * b["buffer_rows"] and running <= _SPILLERS:
            return True  # a flush in progress cannot keep up: a second one takes the rows since
        if age > b["deadline_ms"] / 1000:
            return oldest is None or now - oldest > period  # overlap a flush only if it is stuck
        if rows >= b["buffer_rows"]:
            if oldest is not None:
                self._nice_woken = None
                return now - oldest > period
            if self._nice_woken is None and now >= self._starved_until:
                self._nice_woken = now  # the nice thread first: it costs the program's threads least
                self._wake.set()
                return False
            return self._nice_woken is None or now - self._nice_woken >= _TICK_S  # it did not start
        self._nice_woken = None
        if now < self._starved_until:
            return age > period and oldest is None
        if rows > b["buffer_rows"] // 2:
            self._wake.set()
        return False

    def _deadline_loop(self) -> None:
        tick_ms = max(1, round(min(_TICK_S, self.config.flush_ms / 4000) * 1000))
        seen = 0
        while not self._stop.is_set():
            try:
                libs = self._observer_libs()
                if libs:  # woken at once by an op that fills a buffer_rows; GIL released (ctypes)
                    seen = libs[0].pp_obs_wait(seen, tick_ms)
                elif self._stop.wait(tick_ms / 1000):
                    return
                if self._nice_tid:
                    self._raise_stuck(time.monotonic())
                if self._deadline_due(self._pending_rows()) and not self._stop.is_set():
                    self._hand_off()
            except Exception as e:
                _stopped(e)
                self._stop.set()
                return

    def _hand_off(self) -> None:
        """To an idle spill thread: the deadline thread itself keeps watching the buffer."""
        for go, busy in self._spill:
            if not busy.is_set():
                self.deadline_flushes += 1
                busy.set()
                go.set()
                return

    def _spill_loop(self, i: int) -> None:
        go, busy = self._spill[i]
        while True:
            go.wait()
            go.clear()
            if self._stop.is_set():
                return
            try:
                wall, _ = self._timed_flush()
                self.longest_flush_s = max(self.longest_flush_s, wall)
            except Exception as e:
                _stopped(e)
                self._stop.set()
                return
            finally:
                busy.clear()


def sort_by_start(table: Any) -> Any:
    """``table`` ordered by ``start_ns`` (stable).  Ops are recorded as they end, so a part's
    rows come nearly but not quite in start order.  Arrow's take of a list column (the ops'
    ``input_ptrs``) costs ~0.4 us a row, most of a flush (dev VM: 1.0 of 2.2 s for 845,000
    ops): list columns are gathered here with NumPy instead."""
    import numpy as np
    import pyarrow as pa

    from pastaprof.live.linking import _np_i64

    start = _np_i64(table["start_ns"])
    if len(start) < 2 or not (np.diff(start) < 0).any():
        return table
    order = np.argsort(start, kind="stable")
    taken = pa.array(order)
    cols = []
    for name in table.column_names:
        col = table[name]
        if pa.types.is_list(col.type) and col.null_count == 0:
            cols.append(_take_list(col.combine_chunks(), order))
        else:
            cols.append(col.take(taken))
    return pa.Table.from_arrays(cols, schema=table.schema)


def _take_list(arr: Any, order: Any) -> Any:
    import numpy as np
    import pyarrow as pa

    offsets = arr.offsets.to_numpy().astype(np.int64)
    values = arr.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    offsets = offsets - offsets[0]
    lengths = np.diff(offsets)[order]
    new_offsets = np.zeros(len(order) + 1, np.int64)
    np.cumsum(lengths, out=new_offsets[1:])
    total = int(new_offsets[-1])
    gather = np.repeat(offsets[:-1][order] - new_offsets[:-1], lengths) + np.arange(total, dtype=np.int64)
    off_type = np.int64 if pa.types.is_large_list(arr.type) else np.int32
    return pa.ListArray.from_arrays(pa.array(new_offsets.astype(off_type)), values.take(pa.array(gather)),
                                    type=arr.type)
