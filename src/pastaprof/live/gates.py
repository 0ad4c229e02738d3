"""The capture windows of a session: ranges, steps, and the gate at the source.

PASTAPROF_RANGES and PASTAPROF_STEPS select *recording windows*.  The store keeps only
what falls in them (live/linking.py), and handlers with the Gated capability
(handlers/base.py) are switched off between them, so unselected steps cost (nearly) what
they cost without pastaprof.  Handlers with the RangeAware capability are told of each
range entered and left.

A mixin of ``Session``: it uses the session's ``config``, ``handlers``, ``rank`` and locks.
"""

from __future__ import annotations

import threading
import time

from pastaprof.handlers.base import Gated, RangeAware


class Gates:
    # -- the gate ------------------------------------------------------------
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
            if not isinstance(h, Gated) or (store_only and not h.gate_is_instrumentation):
                continue
            # the op observer records everything until armed (see Session.__init__)
            h.set_gate(gate or (h.gated_once_armed and not self._source_armed))

    def _close_gate(self) -> None:
        with self._lock:
            if self._gate_open_since is not None:
                self._windows.append((self._gate_open_since, time.time_ns()))
                self._gate_open_since = None

    # -- ranges and steps ------------------------------------------------------
    def range_begin(self, name: str) -> int:
        self._open_ranges.append(name)
        self._update_gate()
        for h in self.handlers:
            if isinstance(h, RangeAware):
                h.range_begin(name)
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
        for h in self.handlers:
            if isinstance(h, RangeAware):
                h.range_end(name)

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
