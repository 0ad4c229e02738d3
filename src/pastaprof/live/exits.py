"""How a captured process may end, and what pastaprof does so its events survive it.

* A signal whose default action ends the process (SIGTERM, SIGHUP, SIGQUIT, SIGUSR1,
  SIGALRM, ... real-time signals) while the program has no handler for it: a minimal
  handler flushes this process's session, then restores the default action and sends
  the signal again, so the process still dies of it (exit status, core dump as bare).
  The handler is pastaprof's secret: ``signal.getsignal`` answers what it would bare
  (``SIG_DFL``) and ``signal.signal`` returns ``SIG_DFL`` as the previous handler; a
  handler the program installs replaces it and runs as installed (then a normal exit
  flushes through atexit); the program setting ``SIG_DFL`` back brings the flush back.
  The handler looks up the session of the process it runs in, so forked children
  (multiprocessing Pool workers, which ``Pool.terminate`` ends with SIGTERM) flush their
  own events, not the parent's copy.
* ``os._exit`` (a bare fork child's way out; multiprocessing children flush earlier, from
  a finalizer), ``os.abort`` and ``os.execv``/``os.execve`` (and so every ``os.exec*``): the
  session is flushed first; a Python program exec'd with the same environment starts a new session.
  If the exec fails, capture goes on in a new session of this process.
* The handler runs when the main thread next runs Python.  A main thread stuck in C code
  (a long native call that does not return on EINTR) would not die of the signal as it
  does bare: a watchdog thread reads the signal numbers Python's C-level handler writes
  to a wakeup fd (``signal.set_wakeup_fd``, which ``signal.set_wakeup_fd`` in the program
  replaces and gets back as ``-1`` would be) and, if the main thread has not handled
  the signal within ``_GRACE_S``, flushes and ends the process itself.  Around a fork
  these signals are blocked until the child has a wakeup fd of its own.
* SIGKILL cannot be caught: what the process recorded after its last flush is lost, and
  the run says so (live/supervise.py, the process's ``exit`` status).
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from typing import Any

from pastaprof.live import threads

_SKIPPED = {signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD, signal.SIGCONT, signal.SIGINT,  # SIGINT: Python's own
            signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL, signal.SIGTRAP, signal.SIGSYS,
            signal.SIGABRT,  # abort() resets SIGABRT to the default itself: a Python handler never runs
            signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU, signal.SIGWINCH, signal.SIGURG}  # stop or ignore
CAUGHT = frozenset(s for s in signal.valid_signals() if s not in _SKIPPED)

_real_signal = signal.signal
_real_getsignal = signal.getsignal
_real_exit = os._exit
_real_abort = os.abort
_real_execv = os.execv
_real_execve = os.execve
_real_set_wakeup_fd = signal.set_wakeup_fd
_real_close = os.close
_real_closerange = os.closerange
_GRACE_S = 0.5  # the main thread's time to run the handler before the watchdog acts
_watch: dict[str, int] = {}  # this process's wakeup pipe: r, w, pid; active: 1 while it is set
_handled: dict[int, float] = {}  # signal -> when the main-thread handler last ran
_fork_mask: list[set[int]] = []
_installed = False
_JOIN_S = 2.0  # os._exit/exec wait at most this long for a flush in progress


def _session() -> Any:
    import pastaprof.live

    s = pastaprof.live.current()
    return s if s is not None and s.pid == os.getpid() else None


def _stop_current(join_timeout: float = 10.0) -> None:
    s = _session()
    if s is not None:
        with contextlib.suppress(Exception):  # never in the way of the program's exit
            s.stop(join_timeout=join_timeout)


_pending: list[int] = []  # signals that came while this thread was in the final flush


def _on_signal(signum: int, frame: Any) -> None:
    """Flush, then die of the same signal as without us."""
    _handled[signum] = time.monotonic()
    s = _session()
    if s is not None and s.stopping_here():  # the final flush is below us (an exit, a finalizer)
        _pending.append(signum)  # it dies of this signal when that flush is done
        return
    try:
        _stop_current()
    finally:
        _die(signum)


def _die(signum: int) -> None:
    if threads.on_main_thread():
        _real_signal(signum, signal.SIG_DFL)
    else:  # the watchdog: Python sets handlers from the main thread only, libc from any
        import ctypes

        libc = ctypes.CDLL(None)
        libc.signal.argtypes, libc.signal.restype = [ctypes.c_int, ctypes.c_void_p], ctypes.c_void_p
        libc.signal(signum, None)  # SIG_DFL
    with contextlib.suppress(OSError, ValueError):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
    os.kill(os.getpid(), signum)


def _worker_term(signum: int, frame: Any) -> None:
    """A DataLoader worker's SIGTERM (multiprocessing ends persistent workers so at exit): torch's
    own handler ``_exit(0)``s in C, losing every event since the last flush.  Flush, then leave
    as it does for its parent's SIGTERM (which of the two senders it is cannot be told here)."""
    _handled[signum] = time.monotonic()
    _stop_current(_JOIN_S)
    _real_exit(0)


def _take_worker_sigterm(module: Any) -> None:
    """After torch's ``_set_worker_signal_handlers`` (a DataLoader worker's start): SIGTERM
    comes to ``_worker_term`` instead of torch's C handler."""
    real = getattr(module, "_set_worker_signal_handlers", None)
    if real is None or getattr(real, "_pastaprof", False):
        return

    def _set_worker_signal_handlers(*args: Any) -> Any:
        out = real(*args)
        if _session() is not None and threads.on_main_thread():
            with contextlib.suppress(OSError, ValueError):
                _real_signal(signal.SIGTERM, _worker_term)
        return out

    _set_worker_signal_handlers._pastaprof = True  # type: ignore[attr-defined]
    for attr in ("__name__", "__qualname__", "__doc__", "__module__"):
        with contextlib.suppress(AttributeError, TypeError):
            setattr(_set_worker_signal_handlers, attr, getattr(real, attr))
    module._set_worker_signal_handlers = _set_worker_signal_handlers


def die_if_pending() -> None:
    """After a final flush: end the process by the signal that interrupted it, if one did."""
    if _pending:
        _die(_pending.pop(0))


def _is_default(handler: Any) -> bool:
    return not callable(handler) and handler is not None and int(handler) == int(signal.SIG_DFL)


def getsignal(signalnum: Any) -> Any:
    handler = _real_getsignal(signalnum)
    if handler is _worker_term:  # torch's C handler in its place: Python shows None for one
        return None
    return signal.Handlers.SIG_DFL if handler is _on_signal else handler


def set_signal(signalnum: Any, handler: Any) -> Any:
    ours = _is_default(handler) and int(signalnum) in CAUGHT | {signal.SIGINT}
    previous = _real_signal(signalnum, _on_signal if ours else handler)
    return signal.Handlers.SIG_DFL if previous is _on_signal else previous


def set_wakeup_fd(fd: int, /, *, warn_on_full_buffer: bool = True) -> int:
    old = _real_set_wakeup_fd(fd, warn_on_full_buffer=warn_on_full_buffer)
    ours = _watch.get("active") and old == _watch.get("w")
    _watch["active"] = 0
    if fd == -1 and "w" in _watch:  # the program gave its own up: the watchdog's again
        _real_set_wakeup_fd(_watch["w"], warn_on_full_buffer=False)
        _watch["active"] = 1
    return -1 if ours else old


def _high_pipe() -> tuple[int, int]:
    """A non-blocking pipe at the top of the fd table: the program's next ``open`` gets the
    number it gets bare, and a program that closes every fd and opens files again does not
    get ours back (the wakeup fd would then write signal numbers into its file)."""
    import fcntl
    import resource

    r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        base = max(16, min(soft if soft > 0 else 1024, 1 << 16) - 32)
        hi = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, base) for fd in (r, w)]
    except (OSError, ValueError):
        return r, w
    for fd in (r, w):
        _real_close(fd)
    return hi[0], hi[1]


def _ours(fd: Any) -> bool:
    return fd in (_watch.get("r"), _watch.get("w")) and _watch.get("pid") == os.getpid()


def close(fd: int, /) -> None:
    """``os.close``, for which the wakeup pipe's fds do not exist (EBADF, as bare)."""
    if _ours(fd):
        raise OSError(errno.EBADF, os.strerror(errno.EBADF))
    _real_close(fd)


def closerange(fd_low: int, fd_high: int, /) -> None:
    """``os.closerange`` around the wakeup pipe's fds (a daemon closing every fd keeps its
    signals' flush)."""
    start = fd_low
    for fd in sorted(f for f in (_watch.get("r"), _watch.get("w")) if _ours(f) and fd_low <= f < fd_high):
        _real_closerange(start, fd)
        start = fd + 1
    _real_closerange(start, fd_high)


def _arm() -> None:
    """Main thread: a wakeup pipe of this process and its watchdog thread."""
    try:
        r, w = _high_pipe()
    except OSError:
        return
    try:
        old = _real_set_wakeup_fd(w, warn_on_full_buffer=False)
    except (ValueError, OSError):
        old = None
    if old != -1:  # not settable here, or the program's own is set: leave it
        if old is not None:
            _real_set_wakeup_fd(old)
        _real_close(r)
        _real_close(w)
        return
    _watch.update(r=r, w=w, pid=os.getpid(), active=1)
    threads.start(_watchdog, "pastaprof-signals", (r,))


def _watchdog(r: int) -> None:
    import select

    poller = select.poll()  # not select(): the pipe sits above FD_SETSIZE (_high_pipe)
    poller.register(r, select.POLLIN)
    try:
        pipe = os.fstat(r).st_ino
    except OSError:
        return
    while True:
        try:
            poller.poll()
            if os.fstat(r).st_ino != pipe:  # closed from C and the number reused: never read theirs
                return
            data = os.read(r, 512)
        except (BlockingIOError, InterruptedError):
            continue
        except (OSError, ValueError):
            return
        now = time.monotonic()
        for signum in set(data):
            with contextlib.suppress(Exception):
                if _real_getsignal(signum) in (_on_signal, _worker_term):
                    _grace(signum, now)


def _grace(signum: int, arrived: float) -> None:
    """The main thread did not run Python for _GRACE_S: it is in C code; end as bare would."""
    while time.monotonic() < arrived + _GRACE_S:
        if _handled.get(signum, 0.0) >= arrived:
            return
        time.sleep(0.02)
    if _handled.get(signum, 0.0) >= arrived:
        return
    worker = _real_getsignal(signum) is _worker_term
    try:
        _stop_current(_JOIN_S)
    finally:
        if worker:
            _real_exit(0)
        _die(signum)


def _before_fork() -> None:
    with contextlib.suppress(OSError, ValueError):
        _fork_mask.append(signal.pthread_sigmask(signal.SIG_BLOCK, CAUGHT))


def _after_fork_in_parent() -> None:
    if _fork_mask:
        signal.pthread_sigmask(signal.SIG_SETMASK, _fork_mask.pop())


def _after_fork_in_child() -> None:
    """The parent's wakeup pipe is not this process's: signals stay blocked until it has one."""
    if _watch.get("active"):
        for fd in (_watch["r"], _watch["w"]):
            with contextlib.suppress(OSError):
                _real_close(fd)
        _watch.clear()
        with contextlib.suppress(ValueError, OSError):
            _real_set_wakeup_fd(-1)
        _arm()
    if _fork_mask:
        signal.pthread_sigmask(signal.SIG_SETMASK, _fork_mask.pop())


def _exit(n: int) -> None:
    _stop_current(_JOIN_S)
    _real_exit(n)


def abort() -> None:
    _stop_current(_JOIN_S)
    _real_abort()


def _before_exec(path: Any) -> bool:
    """Flush before an exec that can succeed (os.execvp tries each PATH entry in turn)."""
    if not isinstance(path, int):
        try:
            if not (os.path.isfile(path) and os.access(path, os.X_OK)):
                return False
        except (TypeError, ValueError, OSError):
            return False
    _stop_current(_JOIN_S)
    return True


def _after_failed_exec() -> None:
    """The exec failed: this process goes on, and so does its capture (a new session)."""
    import pastaprof.live

    s = pastaprof.live.current()
    if s is None or s.pid != os.getpid():
        return
    with contextlib.suppress(Exception):
        pastaprof.live._session = None
        pastaprof.live.start()


def execv(path: Any, argv: Any) -> None:
    flushed = _before_exec(path)
    try:
        _real_execv(path, argv)
    except BaseException:
        if flushed:
            _after_failed_exec()
        raise


def execve(path: Any, argv: Any, env: Any) -> None:
    flushed = _before_exec(path)
    try:
        _real_execve(path, argv, env)
    except BaseException:
        if flushed:
            _after_failed_exec()
        raise


# (pastaprof's function, the one it stands in for): named as that one, installed by install()
_WRAPPED = ((getsignal, _real_getsignal), (set_signal, _real_signal), (_exit, _real_exit), (abort, _real_abort),
            (set_wakeup_fd, _real_set_wakeup_fd), (close, _real_close), (closerange, _real_closerange),
            (execv, _real_execv), (execve, _real_execve))
for _f, _real in _WRAPPED:
    for _attr in ("__name__", "__qualname__", "__doc__", "__module__"):
        with contextlib.suppress(AttributeError, TypeError):
            setattr(_f, _attr, getattr(_real, _attr))


def _where_pickle_looks(wrapper: Any, real: Any) -> None:
    """``real``'s own module (``posix``, ``_signal``) names ``wrapper`` too: pickle finds a function
    by its ``__module__`` and name and checks it is the same object (the bytes stay as bare)."""
    import sys

    mod = sys.modules.get(getattr(real, "__module__", None) or "")
    if mod is not None and getattr(mod, real.__name__, None) is real:
        setattr(mod, real.__name__, wrapper)


def install() -> None:
    """Once per process tree (fork children inherit all of it): wrap the functions above and
    take the terminating signals the program has no handler for.  Main thread only."""
    global _installed
    if _installed:
        return
    if not threads.on_main_thread():
        return
    _installed = True
    signal.signal, signal.getsignal, signal.set_wakeup_fd = set_signal, getsignal, set_wakeup_fd
    os._exit, os.abort, os.execv, os.execve = _exit, abort, execv, execve
    os.close, os.closerange = close, closerange
    for wrapper, real in _WRAPPED:
        _where_pickle_looks(wrapper, real)
    for sig in CAUGHT:
        with contextlib.suppress(OSError, ValueError, RuntimeError):
            if _is_default(_real_getsignal(sig)):
                _real_signal(sig, _on_signal)
    _arm()
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                        after_in_child=_after_fork_in_child)
    from pastaprof.live.imports import after_import

    after_import("torch.utils.data._utils.signal_handling", _take_worker_sigterm)
