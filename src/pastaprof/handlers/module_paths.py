"""Module paths of ops ("Sequential_0/Bottleneck_3/Conv2d_7"), kept per thread around
every ``nn.Module`` call.

The bookkeeping runs at the start and end of every module call (~200 per ResNet-50
forward), so its cost is paid in the step.  Global forward hooks (the first design) make
torch take its slow module-call path (~3.5 us per call on the dev VM even with no-op
hooks), so ``Module.__call__`` is wrapped instead (``wrap_call``): modules keep torch's
fast path, and an exception leaves the path stack balanced (a forward hook does not run
then).  With the native observer each thread's current path is an id in the observer's
thread state, written through a ctypes cell (a ctypes call and a joined path string per
call cost ~4 us), and paths are found by (parent path, module) in one dict; the string is
built once per distinct path.  Dev VM, per module call: global hooks 4.2-4.8 us, the
wrapper 1.4-1.5 us.  The Python op path (no native observer) keeps a stack of names.
"""

from __future__ import annotations

import threading
from typing import Any


class ModulePaths:
    def __init__(self, native: Any = None) -> None:
        self.native = native  # NativeOps, or None
        self._local = threading.local()
        self._names: dict[int, str] = {}  # id(module) -> "Conv2d_7" (class name, n-th seen)
        self._class_counts: dict[str, int] = {}
        self._paths: dict[tuple[int, int], int] = {}  # (parent path id, id(module)) -> path id
        self._text: dict[int, str] = {}  # path id -> path
        # [open]: the session's gate at the source (TorchHandler.set_gate).  A flag the wrapper
        # reads, not a swap of nn.Module.__call__: assigning a class attribute invalidates
        # Python's attribute caches of every Module subclass (dev VM: ~0.7 ms more per gated
        # region of a 75-module conv net, against ~0.1 us per module call for the flag).
        self.gate = [True]

    def wrap_call(self, module_cls: Any, is_compiling: Any) -> Any:
        """A ``module_cls.__call__`` that keeps the path around the original (returned).
        Under torch.compile's tracing it is the original alone: the compiled graph keeps no
        Python bookkeeping of ours.  The native version is written out in one function (each
        Python call it saves is ~0.1 us per module call)."""
        import functools

        original = module_cls.__call__
        if self.native is None:
            enter, exit_, gate = self._enter, self._exit, self.gate

            @functools.wraps(original)
            def call_python(module: Any, *args: Any, **kwargs: Any) -> Any:
                if not gate[0] or is_compiling():
                    return original(module, *args, **kwargs)
                enter(module, args)
                try:
                    return original(module, *args, **kwargs)
                finally:
                    exit_(module, args, None)

            return call_python

        local, paths, new_path, gate = self._local, self._paths, self._new_path, self.gate

        @functools.wraps(original)
        def call_native(module: Any, *args: Any, **kwargs: Any) -> Any:
            if not gate[0] or is_compiling():
                return original(module, *args, **kwargs)
            try:
                ids, cell = local.ids, local.cell
            except AttributeError:
                ids, cell = self._thread_state()
            key = (ids[-1] if ids else -1, id(module))
            path = paths.get(key)
            if path is None:
                path = new_path(key, module)
            ids.append(path)
            cell.value = path
            try:
                return original(module, *args, **kwargs)
            finally:
                ids.pop()
                cell.value = ids[-1] if ids else -1

        return call_native

    def _thread_state(self) -> tuple[list[int], Any]:
        local = self._local
        local.ids, local.cell = [], self.native.module_cell()
        return local.ids, local.cell

    def current(self) -> str | None:
        """The calling thread's path (Python op path)."""
        stack = getattr(self._local, "stack", None)
        return "/".join(stack) if stack else None

    def name_of(self, module: Any) -> str:
        key = id(module)
        name = self._names.get(key)
        if name is None:
            cls = type(module).__name__
            n = self._class_counts.get(cls, 0)
            self._class_counts[cls] = n + 1
            name = self._names[key] = f"{cls}_{n}"
        return name

    # -- native observer: path ids -------------------------------------------------
    def _new_path(self, key: tuple[int, int], module: Any) -> int:
        parent = self._text.get(key[0])
        text = f"{parent}/{self.name_of(module)}" if parent else self.name_of(module)
        path = self.native.intern(text)
        self._paths[key] = path
        self._text[path] = text
        return path

    # -- Python op path: names -------------------------------------------------------
    def _enter(self, module: Any, args: Any) -> None:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        stack.append(self.name_of(module))

    def _exit(self, module: Any, args: Any, output: Any) -> None:
        stack = getattr(self._local, "stack", None)
        if stack:
            stack.pop()
