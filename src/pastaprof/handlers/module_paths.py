"""Module paths of ops ("Sequential_0/Bottleneck_3/Conv2d_7"), kept per thread by global
``nn.Module`` forward hooks.

The hooks run at the start and end of every module call (~200 calls per ResNet-50
forward), so their cost is paid in the step.  With global hooks installed torch takes its
slow module-call path (~3 us per call on the dev VM with no-op hooks); building the path
string and crossing ctypes in the hooks cost ~4 us more.  With the native observer each
thread's current path is an id in the observer's thread state, written through a ctypes
cell, and paths are found by (parent path, module) in one dict; the string is built once
per distinct path.  The Python op path (no native observer) keeps a stack of names.
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

    def hooks(self) -> tuple[Any, Any]:
        """(forward pre-hook, forward hook) to register globally."""
        if self.native is not None:
            return self._enter_native, self._exit_native
        return self._enter, self._exit

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
    def _enter_native(self, module: Any, args: Any) -> None:
        local = self._local
        try:
            ids = local.ids
        except AttributeError:
            ids = local.ids = []
            local.cell = self.native.module_cell()
        key = (ids[-1] if ids else -1, id(module))
        path = self._paths.get(key)
        if path is None:
            path = self._new_path(key, module)
        ids.append(path)
        local.cell.value = path

    def _exit_native(self, module: Any, args: Any, output: Any) -> None:
        ids = getattr(self._local, "ids", None)
        if ids:
            ids.pop()
            self._local.cell.value = ids[-1] if ids else -1

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
