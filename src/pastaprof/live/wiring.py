"""What pastaprof's own handlers need of each other and of the session, once started.

* CUPTI beside the Compute Sanitizer: the driver allows one callback subscriber, so
  the sanitizer records copies instead;
* unified-memory counters (``--uvm`` or a tool consuming ``uvm``): CUPTI configures them
  only once a CUDA context exists, so the primary context is retained first;
* the hand-over of CUPTI to a foreign profiler (torch.profiler) and back.

Third-party handlers need none of this (handlers/base.py): it is the coupling of the
built-in ones.  A mixin of ``Session``: it uses its ``config``, ``status`` and handlers.
"""

from __future__ import annotations

import os
from typing import Any

from pastaprof.handlers.cupti_activity import CuptiActivityHandler
from pastaprof.live.messages import notice as _notice


def _consumed_kinds(tools: list[Any], names: tuple[str, ...]) -> set[str]:
    """Event kinds the live tools and the tools named for the report (PASTAPROF_TOOLS,
    run by the launcher at exit) consume: they decide which handlers start."""
    kinds = {k for t in tools for k in getattr(t, "consumes", ()) if k not in getattr(t, "optional", ())}
    if names:
        try:
            from pastaprof.tools.registry import resolve

            kinds |= {k for cls in resolve(list(names)) for k in getattr(cls, "consumes", ())
                      if k not in getattr(cls, "optional", ())}
        except Exception:  # an unknown tool is the launcher's error to report, not ours
            pass
    return kinds


class Wiring:
    def _wire(self, h: Any) -> None:
        """What pastaprof's own handlers need of each other once started."""
        if isinstance(h, CuptiActivityHandler):
            self._wire_cupti(h)

    def _wire_cupti(self, cupti: CuptiActivityHandler) -> None:
        san = self.handler("sanitizer")
        if cupti.status and san is not None:
            # Measured on the H200 (driver 580): with the Compute Sanitizer subscribed,
            # cuptiActivityRegisterCallbacks fails with 39 (MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED).
            cupti.status = (f"{cupti.status}: CUPTI cannot run alongside the Compute Sanitizer (the driver "
                            "allows one callback subscriber), so kernel GPU times are not recorded in this "
                            "run; ops, tensors, instruction-level accesses and memcpy/memset calls (host "
                            "times, from the sanitizer) are")
            san.record_copies()
        if self._uvm_pending and cupti.status is None:
            self._start_uvm(cupti)
        elif self._uvm_pending:
            self.status["uvm"] = "unified-memory counters not recorded: CUPTI is not available"
            _notice(self.status["uvm"])

    def foreign_profiler(self, starting: bool) -> None:
        self._foreign_profiler(self.handler("cupti"), starting)

    def _enable_uvm(self, cupti: CuptiActivityHandler, device: int) -> None:
        if not self._uvm_pending:
            return
        self._uvm_pending = False
        problem = cupti.enable_uvm(device)
        self.status["uvm"] = problem or "ok"
        if problem:
            _notice(problem)

    def _start_uvm(self, cupti: CuptiActivityHandler) -> None:
        """CUPTI takes the unified-memory counter configuration only once a CUDA context
        exists, and the program may not create one before it faults: retain the device's
        primary context (the one torch, CuPy and the runtime API use) now, then configure.
        Only with --uvm: it initializes CUDA in this process."""
        device = int(os.environ.get("LOCAL_RANK", "0") or 0)
        try:
            from cuda.bindings import driver

            (err,) = driver.cuInit(0)
            if int(err) == 0:
                err, dev = driver.cuDeviceGet(device)
            if int(err) == 0:
                err, _ctx = driver.cuDevicePrimaryCtxRetain(dev)
            if int(err) != 0:
                raise RuntimeError(f"CUDA error {int(err)}")
        except Exception as e:
            self._uvm_pending = False
            self.status["uvm"] = f"unified-memory counters not recorded: no CUDA context on device {device} ({e})"
            _notice(self.status["uvm"])
            return
        self._enable_uvm(cupti, device)

    def _foreign_profiler(self, cupti: CuptiActivityHandler | None, starting: bool) -> None:
        """torch.profiler in the program: CUPTI serves one activity client at a time
        (driver 580), so GPU activity during its session goes to torch.profiler.  We
        flush before it starts and re-register (callbacks, clock, kinds) after it stops;
        on the H200 every kernel after the session is recorded again
        (scripts/gpu_coexist_check.py).  The warning says what the session took."""
        key = "torch.profiler"
        if starting:
            if key not in self.status:
                self.status[key] = ("torch.profiler ran in the program: CUPTI serves one client at a time, so GPU "
                                    "activity during its sessions is missing here (ops and tensors are not)")
                _notice(self.status[key])
            if cupti is not None:
                cupti.reattach_flushes = 0
                cupti.release()
        elif cupti is not None:
            cupti.reattach()
            # again at the next flushes: a foreign client may disable kinds after its session
            # object has exited (e.g. from its own thread)
            cupti.reattach_flushes = 2
