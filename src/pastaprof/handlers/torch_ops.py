"""PyTorch handler: framework ops (name, shapes, dtypes, module, call site) and
caching-allocator block events, linked to GPU kernels through CUPTI external
correlation (kind CUSTOM2; Kineto owns CUSTOM0/1).

Mechanisms (capture.md section 3):
* ops: by default a C++ RecordFunction observer (handlers/torch_native.py,
  native/torch_observer.cpp), compiled on first use.  Fallback, where it cannot be
  built: a ``TorchDispatchMode`` on the thread that starts capture (autograd's
  backward runs inside it too), a Python call per op (~4-8 us).  Either way each
  op gets an id, pushed as CUPTI's external correlation id around the call, so
  the kernels it launches carry it.
* modules: global forward pre/post hooks keep a per-thread stack of
  ``Class_k`` names (Kineto's naming), joined into the op's module path.
* call site: the innermost Python frame outside torch and pastaprof.
* tensors: the C++ allocator trace tracker (native path), else
  ``torch.cuda.memory._record_memory_history(context=None)`` (about 1 us per
  alloc+free), drained at each flush from the allocator's ring buffer.

Per-op data goes into preallocated-growth Python lists of ints and interned
string ids (no object per event beyond the list slots); ``drain`` turns them
into Arrow columns.  Input data pointers (``input_ptrs``, what the memory tool's
use patterns need) go into one flat list with a count per op.
"""

from __future__ import annotations

import functools
import itertools
import sys
import threading
import time
from typing import Any

import numpy as np
import pyarrow as pa

from pastaprof.handlers.base import Gated, Handler
from pastaprof.handlers.module_paths import ModulePaths

_LIB_PARTS = ("/torch/", "/pastaprof/", "<frozen", "/contextlib.py", "/functools.py")


class _Interner:
    def __init__(self) -> None:
        self.ids: dict[Any, int] = {}
        self.values: list[Any] = []

    def __call__(self, value: Any) -> int:
        i = self.ids.get(value)
        if i is None:
            i = self.ids[value] = len(self.values)
            self.values.append(value)
        return i

    def decode(self, codes: list[int]) -> pa.Array:
        return pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32()), pa.array(self.values, pa.string()))


def _shape_and_dtype(args: tuple, kwargs: dict) -> tuple[str, str]:
    shapes, dtypes = [], []
    for a in itertools.chain(args, kwargs.values()):
        try:
            if hasattr(a, "shape") and hasattr(a, "dtype"):
                shapes.append(list(a.shape))
                dtypes.append(str(a.dtype).replace("torch.", ""))
            elif isinstance(a, (list, tuple)) and a and hasattr(a[0], "shape"):
                shapes.append([list(t.shape) for t in a if hasattr(t, "shape")])
                dtypes.append("TensorList")
            else:
                shapes.append([])
                dtypes.append("Scalar" if isinstance(a, (int, float, bool)) else "")
        except Exception:  # sizes that cannot be read (nested tensors: .shape throws)
            del shapes[len(dtypes):]
            shapes.append("?")
            dtypes.append("")
    return str(shapes).replace(" ", "").replace("'", '"'), str(dtypes).replace("'", '"')


class _TensorKinds(dict):
    """type -> 0: not a tensor, 1: a tensor with storage of its own, 2: a wrapper subclass
    (FakeTensor, FunctionalTensor, ...: no data pointer; reading it warns or throws)."""

    def __init__(self, tensor: type | None = None) -> None:
        super().__init__()
        self.tensor = tensor

    def __missing__(self, t: type) -> int:
        base = self.tensor
        k = 0 if base is None or not issubclass(t, base) else 1 if t.__torch_dispatch__ is base.__torch_dispatch__ else 2
        self[t] = k
        return k


def _ptr(t: Any) -> int:
    try:
        return t.data_ptr()
    except Exception:  # nested, sparse, ...
        return 0


def _data_ptrs(args: tuple, kwargs: dict, out: list, kinds: _TensorKinds) -> int:
    """Append the data pointer of each argument to ``out`` (0 for a non-tensor or one without
    a pointer of its own; a tensor list gives one entry per element); return how many."""
    n = len(out)
    for a in itertools.chain(args, kwargs.values()):
        k = kinds[type(a)]
        if k == 1:
            out.append(_ptr(a))
        elif k == 0 and isinstance(a, (list, tuple)) and a and any(kinds[type(x)] for x in a):
            out.extend(_ptr(x) if kinds[type(x)] == 1 else 0 for x in a)
        else:
            out.append(0)
    return len(out) - n


class TorchHandler(Handler, Gated):
    """Records ops and allocator events of the process once torch is imported."""

    name = "torch"
    kinds = ("op", "tensor")
    native_library = "torch"
    order = 40
    starts_on_import = "torch"  # programs that never import torch pay nothing
    listed_when_unavailable = True
    gated_once_armed = True  # the session's gate reaches the observer from the first step on

    @classmethod
    def create(cls, ctx: Any) -> TorchHandler:
        """Wired to the live session (live/session.py): CUPTI's external correlation tags each
        op's launches, optimizer steps advance the step counter, torch's record_function and
        NVTX ranges are the session's ranges, torch.profiler hands CUPTI over and back."""
        cupti = ctx.handler("cupti")
        push, pop = cupti.external_correlation() if cupti is not None else (None, None)
        foreign = (lambda: ctx.foreign_profiler(True), lambda: ctx.foreign_profiler(False))
        off = ctx.config.is_off
        return cls(ctx.rank, push, pop, on_optimizer_step=lambda: ctx.next_step("optimizer"),
                   on_range=(ctx.range_begin, ctx.range_end), on_foreign_profiler=foreign,
                   native_external=cupti.native_external if cupti is not None else None,
                   shapes=ctx.config.shapes, call_sites=ctx.config.call_sites,
                   ops=not off("ops"), modules=not off("modules"), tensors=not off("tensors"))

    def __init__(self, rank: int = 0, push_external: Any = None, pop_external: Any = None,
                 on_optimizer_step: Any = None, on_range: Any = None, on_foreign_profiler: Any = None,
                 native_external: tuple[int, int, int] | None = None, shapes: bool | str = True,
                 call_sites: bool = True, ops: bool = True, modules: bool = True, tensors: bool = True) -> None:
        self.rank = rank
        # "sample" | "all" | "none" (live/config.py); the Python fallback records every op's
        self.shapes_mode = shapes if isinstance(shapes, str) else ("all" if shapes else "none")
        self.shapes, self.call_sites = self.shapes_mode != "none", call_sites
        self.ops, self.modules, self.tensors = ops, modules, tensors  # PASTAPROF_OFF switches
        self._native_ext = native_external  # (push fn pointer, pop fn pointer, kind) for the C++ observer
        self.native: Any = None  # NativeOps when the C++ observer runs
        self.mechanism = "python"
        self._on_foreign = on_foreign_profiler  # (before_start(), after_stop()) or None
        self._on_range = on_range  # (begin(name) -> token, end(name, token, domain)) or None
        self._restore: list[tuple[Any, str, Any]] = []
        self._on_step = on_optimizer_step
        self.status: str | None = None
        self.records = 0
        self.dropped = 0
        self.sampled_out = 0
        self.kernels_seen = 0
        self._push, self._pop = push_external, pop_external
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._names, self._strings = _Interner(), _Interner()
        self._cols: dict[str, list] = self._empty()
        self._site_cache: dict[Any, bool] = {}
        self._local = threading.local()
        self._modules = ModulePaths()
        self._mode: Any = None
        self._kinds = _TensorKinds()  # knows torch.Tensor once the dispatch mode is installed
        self._hooks: list[Any] = []
        self._mem_last_us = -1.0
        self._mem_on = False
        self.native_status: str | None = None
        self._gate_open = True
        self._installed = False
        self.gate_changes = 0

    @staticmethod
    def _empty() -> dict[str, list]:
        return {k: [] for k in ("start_ns", "end_ns", "tid", "id", "name", "shapes", "dtypes", "module", "site",
                                "backward", "ptrs", "nptrs")}

    # -- lifecycle -----------------------------------------------------------
    def start(self) -> None:
        try:
            self._install()
            self._installed = True
        except Exception as e:
            self.status = f"PyTorch ops not recorded ({type(e).__name__}: {e})"

    def _install(self) -> None:
        import torch

        memory = self.tensors and torch.cuda.is_available()
        if not self._install_native(memory) and self.ops:
            self._install_dispatch_mode()
        if self.modules:
            self._modules = ModulePaths(self.native)
            self._hooks.extend(self._modules.install(torch))  # torch's global module hooks
        if self._on_step is not None:  # steps for PASTAPROF_STEPS: optimizer.step() calls
            from torch.optim.optimizer import register_optimizer_step_post_hook

            on_step = self._on_step
            self._hooks.append(register_optimizer_step_post_hook(lambda optimizer, args, kwargs: on_step()))
        if self._on_range is not None:
            self._hook_ranges(torch)
        if self._on_foreign is not None:
            self._hook_torch_profiler(torch)
        if memory and not (self.native is not None and self.native.mem):
            try:
                torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python",
                                                         max_entries=1_000_000)
                self._mem_on = True
            except Exception as e:
                self.status = f"tensor events not recorded ({e})"

    def _install_native(self, memory: bool) -> bool:
        """The C++ RecordFunction observer (and allocator tracker), if it builds here."""
        from pastaprof import native
        from pastaprof.handlers.torch_native import NativeOps

        try:
            lib = native.load("torch")
        except RuntimeError as e:
            self.native_status = f"native op observer unavailable ({e}); using a Python dispatch mode"
            return False
        ops = NativeOps(lib, self.rank)
        push, pop, kind = self._native_ext or (None, None, 0)
        problem = ops.start(push, pop, kind, memory, self.shapes_mode, self.call_sites, observe=self.ops)
        if problem:
            self.native_status = problem
        self.native = ops
        self.mechanism = "native"
        return True

    def _install_dispatch_mode(self) -> None:
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode, _push_mode

        handler = self
        self._kinds = _TensorKinds(torch.Tensor)
        graph_task = getattr(torch._C, "_current_graph_task_id", lambda: -1)

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                op_id = next(handler._ids)
                if handler._push is not None:
                    handler._push(op_id)
                t0 = time.time_ns()
                try:
                    return func(*args, **kwargs)
                finally:
                    t1 = time.time_ns()
                    if handler._pop is not None:
                        handler._pop()
                    handler._record(op_id, func, args, kwargs, t0, t1, graph_task() != -1)

        self._mode = _Mode()
        _push_mode(self._mode)

    def _hook_ranges(self, torch: Any) -> None:
        """record_function and torch.cuda.nvtx ranges become pastaprof ranges (what
        PASTAPROF_RANGES selects), besides doing what they always do."""
        begin, end = self._on_range
        rf = torch.autograd.profiler.record_function
        rf_enter, rf_exit = rf.__enter__, rf.__exit__

        # wraps: the name, signature and source stay the originals', so that TorchScript, which
        # compiles record_function from its methods' source, still finds __enter__/__exit__
        @functools.wraps(rf_enter)
        def enter(self_rf):
            self_rf._pastaprof = (self_rf.name, begin(self_rf.name))
            return rf_enter(self_rf)

        @functools.wraps(rf_exit)
        def exit_(self_rf, *exc):
            try:
                return rf_exit(self_rf, *exc)
            finally:
                name, token = getattr(self_rf, "_pastaprof", (None, None))
                if name is not None:
                    end(name, token, "record_function")

        nvtx = torch.cuda.nvtx
        push, pop = nvtx.range_push, nvtx.range_pop
        local = self._local

        def range_push(msg):
            result = push(msg)  # first: if NVTX is unusable it fails exactly as without us
            local.__dict__.setdefault("nvtx", []).append((msg, begin(msg)))
            return result

        def range_pop():
            result = pop()
            stack = local.__dict__.get("nvtx")
            if stack:
                name, token = stack.pop()
                end(name, token, "nvtx")
            return result

        for owner, attr, new in ((rf, "__enter__", enter), (rf, "__exit__", exit_),
                                 (nvtx, "range_push", range_push), (nvtx, "range_pop", range_pop)):
            self._restore.append((owner, attr, getattr(owner, attr)))
            setattr(owner, attr, new)

    def _hook_torch_profiler(self, torch: Any) -> None:
        """torch.profiler (Kineto) takes CUPTI's activity callbacks for its session; we
        hand over before it starts and take them back after it stops."""
        before, after = self._on_foreign
        prof = torch.autograd.profiler.profile  # what torch.profiler.profile drives underneath
        prepare, exit_ = prof._prepare_trace, prof.__exit__

        def prepare_trace(self_p, *a, **k):
            before()
            return prepare(self_p, *a, **k)

        def exit_trace(self_p, *exc):
            try:
                return exit_(self_p, *exc)
            finally:
                after()

        for attr, new in (("_prepare_trace", prepare_trace), ("__exit__", exit_trace)):
            self._restore.append((prof, attr, getattr(prof, attr)))
            setattr(prof, attr, new)

    @property
    def shapes_summary(self) -> dict[str, Any]:
        """For run.json (handlers.torch.shapes): which ops' input shapes were recorded."""
        from pastaprof.handlers.torch_native import SAMPLE_RULE

        native = self.native is not None and self.native.observing
        mode = self.shapes_mode if native or self.shapes_mode == "none" else "all"  # the fallback: all
        info: dict[str, Any] = {"mode": mode}
        if mode == "sample":
            info["rule"] = SAMPLE_RULE
        if native and mode != "none":
            info.update(self.native.sampling())
        return info

    def set_gate(self, open_: bool) -> None:
        """Capture gated at the source: outside the selected steps and ranges (the session's
        gate) the op observer's callback leaves RecordFunction and the module hooks
        only return, so those steps cost (nearly) what they cost without pastaprof, not
        just unrecorded.  The allocator tracker stays on: tensors allocated outside a window and
        freed inside it are still understood.  Only the native observer is gated; the Python
        dispatch mode (the fallback) records throughout and the flush gates its ops.  A module
        path entered while the gate was closed is missing from the paths of ops inside it."""
        if open_ == self._gate_open or not self._installed or self.native is None:
            return
        self._gate_open = open_
        self.gate_changes += 1
        self.native.pause(not open_)
        self._modules.set_gate(open_)

    def start_notes(self) -> dict[str, str]:
        return {"torch native": self.native_status} if self.native_status else {}

    def late_status(self, final: bool) -> dict[str, str]:
        """Found after start (e.g. at CUDA's lazy init): the allocator tracker failing."""
        err = getattr(self.native, "mem_error", None)
        return {"tensors": err} if err else {}

    def stats(self) -> dict[str, Any]:
        return {**super().stats(), "gate_changes": self.gate_changes, "shapes": self.shapes_summary,
                "module_paths": self._modules.mechanism}

    def stop(self) -> None:
        self._installed = False
        for owner, attr, old in reversed(self._restore):
            setattr(owner, attr, old)
        self._restore.clear()
        if self.native is not None:
            self.native.stop()
            self.dropped = self.native.dropped
        try:
            from torch.utils._python_dispatch import _pop_mode

            if self._mode is not None:
                _pop_mode()
        except Exception:
            pass
        for h in self._hooks:
            h.remove()
        self._hooks.clear()

    def flush(self) -> None:
        pass

    # -- hot path --------------------------------------------------------------
    def _call_site(self) -> str | None:
        f = sys._getframe(3)
        cache = self._site_cache
        while f is not None:
            code = f.f_code
            lib = cache.get(code)
            if lib is None:
                fn = code.co_filename
                lib = cache[code] = any(p in fn for p in _LIB_PARTS)
            if not lib:
                return f"{code.co_filename}({f.f_lineno}): {code.co_name}"
            f = f.f_back
        return None

    def _record(self, op_id, func, args, kwargs, t0, t1, backward) -> None:
        shapes, dtypes = _shape_and_dtype(args, kwargs) if self.shapes else (None, None)
        module = self._modules.current()
        site = None if backward or not self.call_sites else self._call_site()
        s = self._strings
        with self._lock:
            c = self._cols
            c["start_ns"].append(t0)
            c["end_ns"].append(t1)
            c["tid"].append(threading.get_native_id())
            c["id"].append(op_id)
            c["name"].append(self._names(str(func)))
            c["shapes"].append(s(shapes) if shapes is not None else -1)
            c["dtypes"].append(s(dtypes) if dtypes is not None else -1)
            c["module"].append(s(module) if module else -1)
            c["site"].append(s(site) if site else -1)
            c["backward"].append(backward)
            c["nptrs"].append(_data_ptrs(args, kwargs, c["ptrs"], self._kinds))

    # -- flush thread ----------------------------------------------------------
    def drain(self) -> dict[str, pa.Table]:
        if self.native is not None:
            out = self.native.drain()
            if "op" in out:
                self.records += out["op"].num_rows
            if self._mem_on:
                t = self._drain_memory()
                if t is not None:
                    out["tensor"] = t
            return out
        with self._lock:
            c, self._cols = self._cols, self._empty()
            strings = list(self._strings.values)
        out: dict[str, pa.Table] = {}
        n = len(c["id"])
        if n:
            vals = pa.array(strings, pa.string())

            def decode(codes: list[int]) -> pa.Array:
                idx = np.asarray(codes, dtype=np.int64)
                return vals.take(pa.array(idx, pa.int64(), mask=idx < 0))

            ids = pa.array(c["id"], pa.int64())
            offsets = np.zeros(n + 1, np.int32)
            np.cumsum(c["nptrs"], out=offsets[1:])
            ptrs = pa.ListArray.from_arrays(pa.array(offsets), pa.array(c["ptrs"], pa.int64()))
            out["op"] = pa.table({
                "start_ns": pa.array(c["start_ns"], pa.int64()), "end_ns": pa.array(c["end_ns"], pa.int64()),
                "rank": pa.array(np.full(n, self.rank, np.int32)), "tid": pa.array(c["tid"], pa.int64()),
                "id": ids, "external_id": ids, "name": self._names.decode(c["name"]),
                "input_shapes": decode(c["shapes"]), "input_dtypes": decode(c["dtypes"]), "input_ptrs": ptrs,
                "module": decode(c["module"]), "call_site": decode(c["site"]),
                "is_backward": pa.array(c["backward"], pa.bool_()), "depth": pa.array(np.zeros(n, np.int32)),
            })
            self.records += n
        if self._mem_on:
            t = self._drain_memory()
            if t is not None:
                out["tensor"] = t
        return out

    def _drain_memory(self) -> pa.Table | None:
        import torch

        if not torch.cuda.is_initialized():
            return None
        snap = torch.cuda.memory._snapshot()
        rows = {"start_ns": [], "device": [], "stream": [], "address": [], "bytes": []}
        last = self._mem_last_us
        newest = last
        for dev, trace in enumerate(snap.get("device_traces", [])):
            for e in trace:
                t = e.get("time_us", 0)
                if t <= last or e.get("action") not in ("alloc", "free_completed"):
                    continue
                newest = max(newest, t)
                rows["start_ns"].append(int(t * 1000))
                rows["device"].append(dev)
                rows["stream"].append(e.get("stream", 0))
                rows["address"].append(e["addr"])
                rows["bytes"].append(e["size"] if e["action"] == "alloc" else -e["size"])
        self._mem_last_us = newest
        if not rows["start_ns"]:
            return None
        n = len(rows["start_ns"])
        t = pa.table({**rows, "end_ns": rows["start_ns"], "rank": pa.array(np.full(n, self.rank, np.int32)),
                      "name": pa.array(["[memory]"] * n), "device_type": pa.array(["cuda"] * n)})
        return t.set_column(t.schema.get_field_index("address"), "address", pa.array(rows["address"], pa.uint64()))
