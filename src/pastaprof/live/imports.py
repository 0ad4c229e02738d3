"""Run a callback right after a module is imported (for handlers that hook a
framework only if and when the program imports it)."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable
from types import ModuleType


class _AfterImport(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, callback: Callable[[ModuleType], None]) -> None:
        self.name = name
        self.callback = callback

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # find the real spec without ourselves
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        real_exec = spec.loader.exec_module
        callback = self.callback

        def exec_module(module: ModuleType) -> None:
            try:  # the loader's own method again: nothing of ours is left on the module's loader
                del spec.loader.exec_module
            except AttributeError:
                pass
            real_exec(module)
            try:
                callback(module)
            except Exception as e:  # never break the program's import
                sys.stderr.write(f"pastaprof: warning: {self.name} hook failed: {type(e).__name__}: {e}\n")

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def after_import(name: str, callback: Callable[[ModuleType], None]) -> None:
    """Call ``callback(module)`` once ``name`` has been imported (now if it already is)."""
    if name in sys.modules:
        callback(sys.modules[name])
        return
    sys.meta_path.insert(0, _AfterImport(name, callback))
