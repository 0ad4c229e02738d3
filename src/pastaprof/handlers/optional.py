"""The session's optional handlers: what starts only when a tool or a flag asks for it.

* the Compute Sanitizer (tools consuming ``access_*``), before anything initializes CUDA;
* unified-memory counters (``--uvm`` or a tool consuming ``uvm``), after retaining the
  primary context, and the managed-allocation registry / plan applier;
* the hand-over to a foreign profiler (torch.profiler) and back.

A mixin of ``Session``: the methods use its ``config``, ``status``, ``handlers``, ``out``
and ``rank``.
"""

from __future__ import annotations

import os
from typing import Any

from pastaprof.handlers.cupti_activity import CuptiActivityHandler
from pastaprof.handlers.messages import notice as _notice


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


class OptionalHandlers:
    def _start_sanitizer(self) -> None:
        """Instruction-level accesses (tools consuming access_* events): the Compute
        Sanitizer tool, loaded before CUDA initializes."""
        from pastaprof.handlers.sanitizer import SanitizerHandler

        san = SanitizerHandler(self.config, self.rank, self.out, per_pc=self._per_pc_wanted)
        san.start()
        if san.lib is None:
            self.status["sanitizer"] = san.status or "not available"
            _notice(self.status["sanitizer"])
            return
        self.handlers.append(san)
        self.status["sanitizer"] = "ok"
        if "heatmap" in self.config.tools and self.config.process != "cpu":
            self.status["heatmap"] = ("the heatmap tool needs raw access records: run with --process cpu "
                                      "(PASTAPROF_PROCESS=cpu); PASTAPROF_HEATMAP_CTA picks the CTA (default 0)")
            _notice(self.status["heatmap"])

    def _start_uvm_plan(self) -> None:
        """The managed-allocation registry (names allocations by call site, for uvm_advisor and
        for plans), applying a plan if one was given."""
        from pastaprof.handlers.uvm_plan import SCHEMA, UvmPlanApplier, load_plan

        dry = os.environ.get("PASTAPROF_UVM_PLAN_DRY_RUN", "") not in ("", "0")
        plan = load_plan(self.config.uvm_plan) if self.config.uvm_plan else {"schema": SCHEMA, "actions": []}
        applier = UvmPlanApplier(plan, dry_run=dry, rank=self.rank)
        applier.start()
        self.handlers.append(applier)
        if self.config.uvm_plan:
            self.status["uvm plan"] = f"applying {self.config.uvm_plan}" + (" (dry run)" if dry else "")

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
            self._reattach_flushes = 0
            if cupti is not None:
                cupti.release()
        elif cupti is not None:
            cupti.reattach()
            # again at the next flushes: a foreign client may disable kinds after its session
            # object has exited (e.g. from its own thread)
            self._reattach_flushes = 2
