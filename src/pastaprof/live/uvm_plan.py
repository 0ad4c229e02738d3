"""Applying a uvm_advisor plan to a later run of the same program.

``pastaprof run --apply-uvm-plan plan.json -- python app.py`` (or
``pastaprof.apply_uvm_plan("plan.json")`` in the program) does what the plan says at the
points it names:

* ``prefetch`` actions run ``cudaMemPrefetchAsync`` (CUDA 13: a ``cudaMemLocation`` and
  flags) of the whole allocation when the named range begins (``range:NAME`` points:
  ``pastaprof.range``, ``record_function`` and NVTX ranges);
* ``advise`` actions run ``cudaMemAdvise`` once, right after the allocation is made;
* ``oversubscribed`` entries cannot be applied automatically; they are reported.

Allocations are matched by where they are made -- the call site (first frame outside
pastaprof, CuPy and cuda-bindings) and the ordinal among allocations from that site --,
not by address, which changes between runs.  Managed allocations are seen by wrapping
``cupy.cuda.malloc_managed`` and ``cuda.bindings.runtime.cudaMallocManaged``; each is
also recorded as an ``alloc`` event named by its site, which is how the advisor names
allocations in the first place.

A plan that does not fit the program is refused before the program starts when its
form is wrong (unknown action, a point that is not ``range:NAME``), and named at exit
when it names ranges the program never entered or allocations it never made.
``PASTAPROF_UVM_PLAN_DRY_RUN=1`` records the CUDA calls instead of making them.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from pastaprof.errors import UsageError
from pastaprof.handlers.base import Handler, HandlerContext, RangeAware, Setting, Summarized

SCHEMA = "pastaprof-uvm-plan/1"
ACTIONS = ("prefetch", "advise", "oversubscribed")
ADVICE = ("SetReadMostly", "SetPreferredLocation", "SetAccessedBy")
_LIB_PARTS = ("/pastaprof/", "/cupy/", "/cupy_backends/", "/cuda/bindings/", "/cuda/", "<frozen")


def load_plan(source: str | Path | dict) -> dict[str, Any]:
    """The plan, validated; a ``UsageError`` naming the first problem otherwise."""
    where = str(source) if not isinstance(source, dict) else "plan"
    if isinstance(source, dict):
        plan = source
    else:
        try:
            plan = json.loads(Path(source).read_text(encoding="utf-8"))
        except OSError as e:
            raise UsageError(f"{where}: cannot read the UVM plan ({e.strerror or e})") from None
        except json.JSONDecodeError as e:
            raise UsageError(f"{where}: not a UVM plan (invalid JSON at line {e.lineno})") from None
        except (ValueError, RecursionError):  # not UTF-8 text, or nested past any plan's depth
            raise UsageError(f"{where}: not a UVM plan (not JSON text)") from None
    if not isinstance(plan, dict) or plan.get("schema") != SCHEMA or not isinstance(plan.get("actions"), list):
        raise UsageError(f"{where}: not a UVM plan (expected schema {SCHEMA!r} and a list of actions)")
    for i, a in enumerate(plan["actions"]):
        what = f"{where}: action {i}"
        if not isinstance(a, dict) or a.get("action") not in ACTIONS:
            raise UsageError(f"{what}: unknown action {a.get('action') if isinstance(a, dict) else a!r}")
        if not isinstance(a.get("site"), str) or not isinstance(a.get("ordinal"), int):
            raise UsageError(f"{what}: no allocation site and ordinal")
        if a["action"] == "prefetch":
            before = a.get("before")
            if not (isinstance(before, str) and before.startswith("range:") and len(before) > 6):
                raise UsageError(f"{what}: point {before!r} cannot be applied (only range:NAME points)")
            if not (isinstance(a.get("to"), str) and (a["to"] == "cpu" or a["to"].startswith("device:"))):
                raise UsageError(f"{what}: prefetch target {a.get('to')!r} is not cpu or device:N")
        if a["action"] == "advise":
            bad = [x for x in a.get("advice") or [] if x not in ADVICE]
            if bad or not a.get("advice"):
                raise UsageError(f"{what}: unknown advice {bad or a.get('advice')!r}")
    return plan


def caller_site() -> str:
    """Where the program made the allocation: the first frame outside pastaprof, CuPy and
    cuda-bindings, as allocations are named."""
    f = sys._getframe(2)
    while f is not None:
        fn = f.f_code.co_filename
        if not any(p in fn for p in _LIB_PARTS):
            return f"{fn}({f.f_lineno}): {f.f_code.co_name}"
        f = f.f_back
    return "?"


class UvmPlanApplier(Handler, RangeAware, Summarized):
    """Registers managed allocations and applies the plan's actions at its points."""

    name = "uvm_plan"
    kinds = ("alloc",)
    order = 30
    status_line = False  # "uvm plan" says what it applies, and what did not fit
    settings = (Setting("UVM_PLAN_DRY_RUN", "anything but 0: log the plan's calls without making them"),)

    @classmethod
    def create(cls, ctx: HandlerContext) -> UvmPlanApplier | None:
        """The managed-allocation registry (names allocations by call site, for uvm_advisor and
        for plans), applying a plan if one was given; on where unified memory is captured or
        instruction-level accesses are (uvm_advisor names their managed allocations too)."""
        cfg = ctx.config
        if not (cfg.uvm_plan or cfg.uvm or "uvm" in ctx.consumed
                or any(k.startswith("access_") for k in ctx.consumed)):
            return None
        dry = os.environ.get("PASTAPROF_UVM_PLAN_DRY_RUN", "") not in ("", "0")
        plan = load_plan(cfg.uvm_plan) if cfg.uvm_plan else {"schema": SCHEMA, "actions": []}
        if cfg.uvm_plan:
            ctx.status["uvm plan"] = f"applying {cfg.uvm_plan}" + (" (dry run)" if dry else "")
        return cls(plan, dry_run=dry, rank=ctx.rank)

    def __init__(self, plan: dict[str, Any], dry_run: bool = False, rank: int = 0) -> None:
        self.plan = plan
        self.dry_run = dry_run
        self.rank = rank
        self.calls: list[tuple] = []          # (what, ptr, size, where) made or, dry run, not made
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._ordinals: dict[str, int] = {}
        self._allocs: dict[tuple[str, int], tuple[int, int]] = {}   # (site, ordinal) -> (ptr, size)
        self._rows: dict[str, list] = {"start_ns": [], "address": [], "bytes": [], "name": []}
        self._by_point: dict[str, list[dict]] = {}
        self._advise: dict[tuple[str, int], list[dict]] = {}
        self._reached: set[str] = set()
        for a in plan["actions"]:
            if a["action"] == "prefetch":
                self._by_point.setdefault(a["before"][len("range:"):], []).append(a)
            elif a["action"] == "advise":
                self._advise.setdefault((a["site"], a["ordinal"]), []).append(a)
        self.status: str | None = None

    # -- allocation registry -------------------------------------------------
    def install(self) -> None:
        from pastaprof.live.imports import after_import

        after_import("cupy", self._wrap_cupy)
        after_import("cuda.bindings.runtime", self._wrap_runtime)

    def _wrap_cupy(self, cupy: Any = None) -> None:
        import cupy

        orig = cupy.cuda.malloc_managed
        applier = self

        def malloc_managed(size: int, *a: Any, **k: Any) -> Any:
            mem = orig(size, *a, **k)
            applier.allocated(int(mem.ptr), int(size), caller_site())
            return mem

        for owner in (cupy.cuda, cupy.cuda.memory):
            if getattr(owner, "malloc_managed", None) is orig:
                owner.malloc_managed = malloc_managed

    def _wrap_runtime(self, runtime: Any = None) -> None:
        from cuda.bindings import runtime

        orig = runtime.cudaMallocManaged
        applier = self

        def cudaMallocManaged(size: int, *a: Any, **k: Any) -> Any:  # noqa: N802 - CUDA's name
            out = orig(size, *a, **k)
            if int(out[0]) == 0:
                applier.allocated(int(out[1]), int(size), caller_site())
            return out

        runtime.cudaMallocManaged = cudaMallocManaged

    def allocated(self, ptr: int, size: int, site: str) -> None:
        with self._lock:
            n = self._ordinals.get(site, 0)
            self._ordinals[site] = n + 1
            self._allocs[(site, n)] = (ptr, size)
            r = self._rows
            r["start_ns"].append(time.time_ns())
            r["address"].append(ptr)
            r["bytes"].append(size)
            r["name"].append(site)
        for a in self._advise.get((site, n), []):
            for advice in a["advice"]:
                self._cuda("advise:" + advice, ptr, size, a.get("location", "cpu"),
                           a.get("accessed_by") if advice == "SetAccessedBy" else None)

    # -- points ----------------------------------------------------------------
    def range_begin(self, name: str) -> None:
        actions = self._by_point.get(name)
        if not actions:
            return
        self._reached.add(name)
        for a in actions:
            got = self._allocs.get((a["site"], a["ordinal"]))
            if got is None:
                self._error(f"range:{name}: allocation {a['site']}#{a['ordinal']} not made (yet)")
                continue
            self._cuda("prefetch", got[0], got[1], a["to"], None)

    # -- CUDA -------------------------------------------------------------------
    def _cuda(self, what: str, ptr: int, size: int, where: str, accessed_by: str | None) -> None:
        target = accessed_by or where
        self.calls.append((what, ptr, size, target))
        if self.dry_run:
            return
        try:
            from cuda.bindings import runtime as rt

            loc = rt.cudaMemLocation()
            if target == "cpu":
                loc.type = rt.cudaMemLocationType.cudaMemLocationTypeHost
                loc.id = 0
            else:
                loc.type = rt.cudaMemLocationType.cudaMemLocationTypeDevice
                loc.id = int(target.split(":", 1)[1])
            if what == "prefetch":
                (err,) = rt.cudaMemPrefetchAsync(ptr, size, loc, 0, 0)
                if int(err) == 0 and target == "cpu":
                    # the CPU code of the range runs right after: without waiting, it faults
                    # on pages still in flight (stream order only helps GPU work)
                    (err,) = rt.cudaStreamSynchronize(0)
            else:
                advice = getattr(rt.cudaMemoryAdvise, "cudaMemAdvise" + what.split(":", 1)[1])
                (err,) = rt.cudaMemAdvise(ptr, size, advice, loc)
            if int(err) != 0:
                self._error(f"{what} of {size} B at {ptr:#x}: CUDA error {int(err)}")
        except Exception as e:  # never harm the program
            self._error(f"{what} of {size} B at {ptr:#x}: {type(e).__name__}: {e}")

    def _error(self, msg: str) -> None:
        with self._lock:
            if len(self.errors) < 100:
                self.errors.append(msg)

    # -- session protocol -------------------------------------------------------
    def start(self) -> None:
        self.install()

    def flush(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def late_status(self, final: bool) -> dict[str, str]:
        miss = self.mismatches() if final else []
        return {"uvm plan": "plan does not fit this run: " + "; ".join(miss[:5])} if miss else {}

    def mismatches(self) -> list[str]:
        """Plan entries that did not fit this run: ranges never entered, allocations never made."""
        out = [f"range:{p} never entered" for p in sorted(set(self._by_point) - self._reached)]
        made = set(self._allocs)
        wanted = {(a["site"], a["ordinal"]) for a in self.plan["actions"] if a["action"] in ("prefetch", "advise")}
        out += [f"allocation {s}#{o} never made" for s, o in sorted(wanted - made)]
        return out

    def summary(self) -> dict[str, Any]:
        kinds: dict[str, int] = {}
        for c in self.calls:
            kinds[c[0]] = kinds.get(c[0], 0) + 1
        return {"dry_run": self.dry_run, "calls": kinds, "errors": self.errors[:10], "mismatches": self.mismatches(),
                "oversubscribed": sum(a["action"] == "oversubscribed" for a in self.plan["actions"])}

    def drain(self) -> dict[str, pa.Table]:
        with self._lock:
            r, self._rows = self._rows, {k: [] for k in self._rows}
        n = len(r["start_ns"])
        if not n:
            return {}
        return {"alloc": pa.table({
            "start_ns": pa.array(r["start_ns"], pa.int64()), "end_ns": pa.array(r["start_ns"], pa.int64()),
            "rank": pa.array(np.full(n, self.rank, np.int32)), "address": pa.array(r["address"], pa.uint64()),
            "bytes": pa.array(r["bytes"], pa.int64()), "memory_kind": pa.array(["managed"] * n),
            "name": pa.array(r["name"], pa.string())})}
