"""Module paths of ops ("Sequential_0/Bottleneck_3/Conv2d_7"), kept per thread around
every ``nn.Module`` call.

With the native observer on CPython 3.11-3.13 the paths are read, not kept: at each top-level
op the observer walks the interpreter's frames (native/torch_frames.cpp, the walk that finds the
call site) and takes the module of every ``Module._call_impl`` frame on the way.  No hook is
registered, so module calls keep torch's fast path; ``_new_path`` names each new (parent path,
module) pair when the walk first meets it, and ``_forget`` tells the library when a module died.

Otherwise the bookkeeping runs from PyTorch's own global module hooks
(``register_module_forward_pre_hook`` / ``register_module_forward_hook(always_call=True)``):
``nn.Module.__call__`` stays torch's own function, so whatever introspects it (torch.profiler's
stack tracer, torch.compile, FSDP, ``inspect.signature``, pickling by qualified name, identity
checks against ``Module._wrapped_call_impl``) sees what it sees without pastaprof.  The price is
torch's slow module-call path while the hooks are registered (bench/module_hooks.py measures it
against a bare call).  ``always_call`` runs the post hook when the forward raises, so the stack
stays balanced; a post hook pops only the entry its own module pushed, so a gate change between
a module's pre and post hook cannot unbalance it either.

Outside the session's recording windows (``set_gate``) the hooks are unregistered, so modules
take torch's fast path again -- where that cannot lose a post hook (no module call is open on
any thread) and cannot make torch.compile recompile (dynamo, which guards on the global hooks,
has traced nothing yet).  Otherwise they stay registered and only return.

With the native observer each thread's current path is an id in the observer's thread state,
written through a ctypes cell; paths are found by (parent path, module) in one dict and the
string is built once per distinct path.  Without it (the Python op path) the ids are pastaprof's
own and ``current()`` gives the thread's path string.
"""

from __future__ import annotations

import inspect
import sys
import threading
import weakref
from typing import Any


class _Cell:
    """Stands in for the native observer's ctypes cell on the Python op path."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = -1


class ModulePaths:
    def __init__(self, native: Any = None) -> None:
        self.native = native  # NativeOps, or None
        self._local = threading.local()
        self._names: dict[int, str] = {}  # id(module) -> "Conv2d_7" (class name, n-th seen)
        self._class_counts: dict[str, int] = {}
        self._paths: dict[tuple[int, int], int] = {}  # (parent path id, id(module)) -> path id
        self._text: dict[int, str] = {}  # path id -> path
        # id(module) -> (weakref to it, its keys in _paths): a dead module's id can be reused by
        # a new module, which must not inherit its name and paths
        self._seen: dict[int, tuple[Any, list[tuple[int, int]]]] = {}
        # [open]: the session's gate at the source (set_gate), read by the pre hook
        self.gate = [True]
        self._stacks: dict[int, list[int]] = {}  # thread ident -> its module stack (set_gate reads them)
        self._nn: Any = None  # torch.nn.modules.module, once installed
        self._hook_pair: tuple[Any, Any] = (None, None)
        self._post_kw: dict[str, bool] = {}
        self._handles: list[Any] = []
        self._ours: set[int] = set()  # ids of the registered hooks (the compile warning skips them)
        self.from_frames = False  # paths read by the native observer's frame walk (no hooks)
        self.mechanism = "off"  # how paths were kept: "frames" or "hooks", once installed

    def install(self, torch: Any) -> list[Any]:
        """Register the global forward pre/post hooks; returns handles (``.remove()``) that
        unregister them and restore the quieted compile warning (``_quiet_compile_warning``)."""
        from torch.nn.modules import module as nn_module

        if self._read_from_frames(nn_module):
            self.mechanism = "frames"
            return [_FramesOff(self)]
        self.mechanism = "hooks"
        compiler = getattr(torch, "compiler", None)
        compiling = getattr(compiler, "is_compiling", None) or (lambda: False)
        self._nn, self._hook_pair = nn_module, self.hooks(compiling)
        if "always_call" in inspect.signature(nn_module.register_module_forward_hook).parameters:
            self._post_kw = {"always_call": True}
        self._register()
        return [_Unregister(self), *_quiet_compile_warning(nn_module, self._ours)]

    def _read_from_frames(self, nn_module: Any) -> bool:
        """Hand module paths to the native observer's frame walk, where it can read frames."""
        code = getattr(getattr(nn_module.Module, "_call_impl", None), "__code__", None)
        if self.native is None or code is None or "self" not in code.co_varnames[:1]:
            return False

        def name(parent: int, module: Any) -> int:
            key = (parent, id(module))
            path = self._paths.get(key)
            return path if path is not None else self._new_path(key, module)

        self.from_frames = bool(self.native.module_frames(code, name))
        return self.from_frames

    def set_gate(self, open_: bool) -> None:
        """The session's gate at the source: closed, the hooks record nothing, and are
        unregistered where that is safe (module docstring)."""
        self.gate[0] = open_
        if self._nn is None:
            return
        if open_:
            if not self._handles:
                self._register()
        elif self._handles and not _dynamo_traced() and not any(list(self._stacks.values())):
            self._unregister()

    def _register(self) -> None:
        pre, post = self._hook_pair
        self._handles = [self._nn.register_module_forward_pre_hook(pre),
                         self._nn.register_module_forward_hook(post, **self._post_kw)]
        self._ours.clear()
        self._ours.update(h.id for h in self._handles)

    def _unregister(self) -> None:
        handles, self._handles = self._handles, []
        for h in handles:
            h.remove()

    def hooks(self, is_compiling: Any) -> tuple[Any, Any]:
        """The (pre, post) hook pair.  Under torch.compile's tracing both return at once (the
        check comes first, so tracing reads nothing else of ours and guards on nothing of
        ours): the compiled graph keeps no Python bookkeeping.  Both return None: the
        program's arguments and outputs are untouched.  Each thread keeps its path ids and,
        beside them, the module each entry was pushed for: a post hook pops only its own
        module's entry."""
        local, paths, new_path, gate = self._local, self._paths, self._new_path, self.gate

        def pastaprof_module_enter(module: Any, args: Any) -> None:
            if is_compiling() or not gate[0]:
                return None
            try:
                try:
                    ids, mods, cell = local.ids, local.mods, local.cell
                except AttributeError:
                    ids, mods, cell = self._thread_state()
                key = (ids[-1] if ids else -1, id(module))
                path = paths.get(key)
                if path is None:
                    path = new_path(key, module)
                ids.append(path)
                mods.append(key[1])
                cell.value = path
            except Exception:  # noqa: BLE001 -- never the program's: RecursionError at its depth limit
                pass  # (its own frames then raise it, as bare), MemoryError; this module goes unnamed
            return None

        def pastaprof_module_exit(module: Any, args: Any, output: Any) -> None:
            if is_compiling():
                return None
            try:
                mods = local.mods
                if mods and mods[-1] == id(module):
                    mods.pop()
                    ids = local.ids
                    ids.pop()
                    local.cell.value = ids[-1] if ids else -1
            except Exception:  # noqa: BLE001 -- as in enter (AttributeError: this thread pushed nothing)
                pass
            return None

        return pastaprof_module_enter, pastaprof_module_exit

    def _thread_state(self) -> tuple[list[int], list[int], Any]:
        local = self._local
        local.ids, local.mods = [], []
        self._stacks[threading.get_ident()] = local.mods
        local.cell = self.native.module_cell() if self.native is not None else _Cell()
        return local.ids, local.mods, local.cell

    def current(self) -> str | None:
        """The calling thread's path (Python op path)."""
        ids = getattr(self._local, "ids", None)
        return self._text.get(ids[-1]) if ids else None

    def name_of(self, module: Any) -> str:
        key = id(module)
        name = self._names.get(key)
        if name is None:
            cls = type(module).__name__
            n = self._class_counts.get(cls, 0)
            self._class_counts[cls] = n + 1
            name = self._names[key] = f"{cls}_{n}"
        return name

    def _new_path(self, key: tuple[int, int], module: Any) -> int:
        """Once per (parent path, module): the path's id (its text built once)."""
        self._track(key, module)
        named = module
        if type(module).__name__ == "OptimizedModule":  # torch.compile(module)'s wrapper
            named = getattr(module, "_orig_mod", None)
            if named is None:
                path = self._paths[key] = key[0]
                return path
            # its compiled code runs no hook of the module it wraps: the wrapper's own call
            # stands for it, named as that module is named when called eagerly
        parent = self._text.get(key[0])
        text = f"{parent}/{self.name_of(named)}" if parent else self.name_of(named)
        path = self.native.intern(text) if self.native is not None else len(self._text)
        self._paths[key] = path
        self._text[path] = text
        return path

    def _track(self, key: tuple[int, int], module: Any) -> None:
        seen = self._seen.get(key[1])
        if seen is None:
            mid = key[1]
            try:
                ref = weakref.ref(module, lambda _r: self._forget(mid))
            except TypeError:  # a module class without weak references: keep it as it was
                ref = None
            seen = self._seen[mid] = (ref, [])
        seen[1].append(key)

    def _forget(self, mid: int) -> None:
        """A module died: its id may name another module from now on."""
        _ref, keys = self._seen.pop(mid, (None, ()))
        for key in keys:
            self._paths.pop(key, None)
        self._names.pop(mid, None)
        if self.from_frames:
            self.native.forget_module(mid)


def _dynamo_traced() -> bool:
    """Whether torch.compile has traced a frame in this process (its code then guards on the
    global hooks).  Read without creating dynamo's counter entries (a defaultdict)."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    frames = counters.get("frames") if isinstance(counters, dict) else None
    return bool(frames and frames.get("total"))


class _Unregister:
    def __init__(self, paths: ModulePaths) -> None:
        self.paths = paths

    def remove(self) -> None:
        self.paths._unregister()
        self.paths._nn = None  # a later set_gate registers nothing


class _FramesOff:
    def __init__(self, paths: ModulePaths) -> None:
        self.paths = paths

    def remove(self) -> None:
        if self.paths.from_frames:
            self.paths.native.module_frames(None, None)
            self.paths.from_frames = False


class _Restore:
    def __init__(self, owner: Any, attr: str, old: Any) -> None:
        self.owner, self.attr, self.old = owner, attr, old

    def remove(self) -> None:
        setattr(self.owner, self.attr, self.old)


def _quiet_compile_warning(nn_module: Any, ours: set[int]) -> list[Any]:
    """``torch.compile(module)`` warns on every call while any global module hook exists
    (``torch.nn.modules.module._has_any_global_hook``, read by the compiled module's
    ``__call__`` and nothing else): the program would see a warning it does not get bare.  The
    check is made to disregard pastaprof's own two hooks; the program's hooks still warn."""
    old = getattr(nn_module, "_has_any_global_hook", None)
    if old is None:
        return []
    import functools

    @functools.wraps(old)
    def _has_any_global_hook() -> bool:
        return bool(nn_module._global_backward_pre_hooks or nn_module._global_backward_hooks
                    or any(k not in ours for k in nn_module._global_forward_pre_hooks)
                    or any(k not in ours for k in nn_module._global_forward_hooks))

    nn_module._has_any_global_hook = _has_any_global_hook
    return [_Restore(nn_module, "_has_any_global_hook", old)]
