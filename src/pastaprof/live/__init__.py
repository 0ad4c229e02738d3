"""Live capture from Python: a few verbs, in the spirit of Triton Proton.

    with pastaprof.profile(tools=["kernels"], out="runs/a") as prof:
        train()
    prof.reports, prof.run          # tool reports, the stored Run

    pastaprof.start(out="runs/b"); ...; pastaprof.stop()

    with pastaprof.range("forward"): ...      # also a decorator
    pastaprof.step()                          # advance the step counter (PASTAPROF_STEPS)

Under ``pastaprof run`` a session already exists (started by the bootstrap);
these verbs then use it instead of starting another.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pastaprof.errors import UsageError

if TYPE_CHECKING:  # the session (pyarrow, numpy, handlers) loads only when capture starts:
    # `pastaprof.range` in a program that never captures costs nothing at first use
    from pastaprof.live.session import Session
    from pastaprof.tools.base import Report, Tool

F = TypeVar("F", bound=Callable[..., Any])

_session: Session | None = None
# Under `pastaprof run`, set by the bootstrap when one of pastaprof's own modules imported this
# package first (not the program): capture then starts at the program's first range or step.
# It is the bootstrap's import hook that still waits for a framework's import.
_start_on_first_use: Any = None
#: keyword arguments of start() / profile(), besides the settings handlers declare
CONTROLS = ("ranges", "kernels", "sample", "steps", "ranks", "flush_ms")
OWNED_BY_PARENT = "PASTAPROF_RUN_PARENT"  # set by `pastaprof run`: the CLI compacts the run


def _deferred_start() -> None:
    global _start_on_first_use
    import sys

    finder, _start_on_first_use = _start_on_first_use, None
    if finder in sys.meta_path:  # a framework's import during start() must not start another session
        sys.meta_path.remove(finder)
    try:
        start()
    except Exception as e:  # never harm the profiled program
        from pastaprof.live.messages import warn

        warn(f"capture not started: {type(e).__name__}: {e}")


def current() -> Session | None:
    """The session of this process, if capture is on."""
    return _session


def start(tools: Sequence[str | Tool] | None = None, out: str | Path | None = None, **controls: Any) -> Session:
    """Start capture in this process (no-op returning the session if already on).

    ``controls``: ranges, kernels, sample, steps ('10:20'), ranks ('0,1'), flush_ms, and the
    settings handlers declare, lower-cased (san_pcs=0 is PASTAPROF_SAN_PCS=0) --
    the same vocabulary as the PASTAPROF_* variables, which fill what is not given.
    """
    global _session
    if _session is not None:
        return _session
    env = {k: v for k, v in os.environ.items() if k.startswith("PASTAPROF_")}
    if out is not None:
        env["PASTAPROF_OUT"] = str(out)
    if controls:
        allowed = set(CONTROLS)
        if not allowed.issuperset(controls):  # the settings handlers declare (handlers/registry.py)
            from pastaprof.handlers.registry import settings

            allowed |= {name.lower() for name in settings()}
        for key, value in controls.items():
            if key not in allowed:
                raise UsageError(f"unknown capture setting {key!r} (known: {', '.join(sorted(allowed))})")
            env[f"PASTAPROF_{key.upper()}"] = (",".join(map(str, value)) if isinstance(value, (list, tuple))
                                               else str(value))
    from pastaprof.live.config import CaptureConfig
    from pastaprof.live.session import Session

    config = CaptureConfig.from_env(env)
    instances: list[Tool] = []
    if tools:  # the tool registry (and DuckDB) only when live tools are asked for
        from pastaprof.api import _instances

        instances = _instances(tools)
    _session = Session(config, instances).start()
    _register_exit_hooks()
    return _session


class _Anchor:
    """A weak-referenceable object multiprocessing's after-fork registry can hold."""


_ANCHOR = _Anchor()
_hooks_registered = False


def _stop_current() -> None:
    if _session is not None:
        _session.stop()


def _register_exit_hooks() -> None:
    """Flush at the exit of every process of the program.  multiprocessing children
    (DataLoader workers, Pool workers) leave through os._exit -- no atexit -- but run
    multiprocessing's finalizers, which it clears right after fork: re-register then."""
    global _hooks_registered
    if _hooks_registered:
        return
    _hooks_registered = True
    from multiprocessing import util as mp_util

    def finalize(_: object = None) -> None:
        mp_util.Finalize(None, _stop_current, exitpriority=100)

    finalize()
    mp_util.register_after_fork(_ANCHOR, finalize)
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_restart_in_child)


_FORK_HELD: list[Session] = []


def _before_fork() -> None:
    """Let the flush thread finish what it is doing (at most a flush, bounded) so that the
    child does not inherit its locks held -- an import lock held there hung the child."""
    s = _session
    if s is not None and s.fork_guard.acquire(timeout=5):
        _FORK_HELD.append(s)


def _after_fork_in_parent() -> None:
    while _FORK_HELD:
        _FORK_HELD.pop().fork_guard.release()


def _restart_in_child() -> None:
    """A forked child (DataLoader worker) records into its own shard of the same run."""
    global _session
    _FORK_HELD.clear()  # the parent's guard, held in this copy, is never used here
    parent = _session
    if parent is None:
        return
    _session = None
    parent._stopped = True  # the copy of the parent's session must not write in its name
    try:
        from pastaprof.live.session import Session

        _session = Session(parent.config, [], gpu=False).start()
    except Exception:
        _session = None


def stop() -> list[Report]:
    """Stop capture, write the run (unless ``pastaprof run`` will), return live reports."""
    global _session
    s = _session
    if s is None:
        return []
    reports = s.stop()
    if not os.environ.get(OWNED_BY_PARENT):
        from pastaprof.store.compact import compact

        compact(s.out)
    _session = None
    return reports


class profile:
    """Context manager: capture inside the block; ``.reports`` and ``.run`` after it."""

    def __init__(self, tools: Sequence[str | Tool] | None = None, out: str | Path | None = None,
                 **controls: Any) -> None:
        self._args = (tools, out, controls)
        self.session: Session | None = None
        self.reports: list[Report] = []
        self._own = False

    def __enter__(self) -> profile:
        tools, out, controls = self._args
        self._own = _session is None
        self.session = start(tools, out, **controls)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._own:
            self.reports = stop()

    @property
    def run(self):
        """The stored run (after the block)."""
        from pastaprof.api import load

        assert self.session is not None
        return load(self.session.out)


class range:  # noqa: A001 - the vocabulary's word; shadows the builtin only inside pastaprof
    """A named range: recorded as a ``range`` event, and what PASTAPROF_RANGES selects.
    Use ``with pastaprof.range("fwd"):`` or ``@pastaprof.range("fwd")``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._start = 0

    def __enter__(self) -> range:
        if _start_on_first_use is not None and _session is None:
            _deferred_start()
        if _session is not None:
            self._start = _session.range_begin(self.name)
        else:
            for listener in _range_listeners:
                listener.range_begin(self.name)
        return self

    def __exit__(self, *exc: Any) -> None:
        if _session is not None:
            _session.range_end(self.name, self._start)

    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with range(self.name):
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]


_range_listeners: list[Any] = []  # plan appliers started without a capture session


def apply_uvm_plan(plan: str | Path | dict, dry_run: bool = False) -> Any:
    """Apply a uvm_advisor plan in this program (see live/uvm_plan.py): prefetches when
    the named ranges begin, advice when the named allocations are made.  Works with or
    without a capture session; returns the applier (``.calls``, ``.mismatches()``)."""
    from pastaprof.live.uvm_plan import UvmPlanApplier, load_plan

    applier = UvmPlanApplier(load_plan(plan), dry_run=dry_run)
    applier.start()
    if _session is not None:
        _session.handlers.append(applier)
    else:
        _range_listeners.append(applier)
    return applier


def track_managed(ptr: int, size: int) -> None:
    """Tell pastaprof about a managed allocation it cannot see being made -- e.g. one from a
    PyTorch pluggable allocator calling cudaMallocManaged -- so that uvm_advisor names it by
    this call site (``file(line): function#ordinal``) and a plan can prefetch or advise it.
    CuPy's and cuda-bindings' managed allocations are tracked without this.  A no-op when
    neither unified-memory capture (``--uvm``) nor a plan is on."""
    from pastaprof.live.uvm_plan import UvmPlanApplier, caller_site

    where = caller_site()
    targets = [h for h in (_session.handlers if _session is not None else []) if isinstance(h, UvmPlanApplier)]
    targets += [h for h in _range_listeners if isinstance(h, UvmPlanApplier)]
    for registry in targets[:1]:  # one registry per process names and applies
        registry.allocated(int(ptr), int(size), where)


def step() -> int:
    """Advance the step counter that PASTAPROF_STEPS windows refer to."""
    if _start_on_first_use is not None and _session is None:
        _deferred_start()
    return _session.next_step() if _session is not None else 0
