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
  a finalizer) and ``os.execv``/``os.execve`` (and so every ``os.exec*``): the session is
  flushed first; a Python program exec'd with the same environment starts a new session.
  If the exec fails, capture goes on in a new session of this process.
* SIGKILL cannot be caught: what the process recorded after its last flush is lost, and
  the run says so (handlers/supervise.py, the process's ``exit`` status).
"""

from __future__ import annotations

import contextlib
import os
import signal
from typing import Any

_SKIPPED = {signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD, signal.SIGCONT, signal.SIGINT,  # SIGINT: Python's own
            signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL, signal.SIGTRAP, signal.SIGSYS,
            signal.SIGABRT,  # abort() resets SIGABRT to the default itself: a Python handler never runs
            signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU, signal.SIGWINCH, signal.SIGURG}  # stop or ignore
CAUGHT = frozenset(s for s in signal.valid_signals() if s not in _SKIPPED)

_real_signal = signal.signal
_real_getsignal = signal.getsignal
_real_exit = os._exit
_real_execv = os.execv
_real_execve = os.execve
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
    s = _session()
    if s is not None and s.stopping_here():  # the final flush is below us (an exit, a finalizer)
        _pending.append(signum)  # it dies of this signal when that flush is done
        return
    try:
        _stop_current()
    finally:
        _die(signum)


def _die(signum: int) -> None:
    _real_signal(signum, signal.SIG_DFL)
    with contextlib.suppress(OSError, ValueError):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
    os.kill(os.getpid(), signum)


def die_if_pending() -> None:
    """After a final flush: end the process by the signal that interrupted it, if one did."""
    if _pending:
        _die(_pending.pop(0))


def _is_default(handler: Any) -> bool:
    return not callable(handler) and handler is not None and int(handler) == int(signal.SIG_DFL)


def getsignal(signalnum: Any) -> Any:
    handler = _real_getsignal(signalnum)
    return signal.Handlers.SIG_DFL if handler is _on_signal else handler


def set_signal(signalnum: Any, handler: Any) -> Any:
    ours = _is_default(handler) and int(signalnum) in CAUGHT | {signal.SIGINT}
    previous = _real_signal(signalnum, _on_signal if ours else handler)
    return signal.Handlers.SIG_DFL if previous is _on_signal else previous


def _exit(n: int) -> None:
    _stop_current(_JOIN_S)
    _real_exit(n)


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


for _f, _real in ((getsignal, _real_getsignal), (set_signal, _real_signal), (_exit, _real_exit),
                  (execv, _real_execv), (execve, _real_execve)):
    for _attr in ("__name__", "__qualname__", "__doc__"):
        with contextlib.suppress(AttributeError, TypeError):
            setattr(_f, _attr, getattr(_real, _attr))


def install() -> None:
    """Once per process tree (fork children inherit all of it): wrap the functions above and
    take the terminating signals the program has no handler for.  Main thread only."""
    global _installed
    if _installed:
        return
    import threading

    if threading.current_thread() is not threading.main_thread():
        return
    _installed = True
    signal.signal, signal.getsignal = set_signal, getsignal
    os._exit, os.execv, os.execve = _exit, execv, execve
    for sig in CAUGHT:
        with contextlib.suppress(OSError, ValueError, RuntimeError):
            if _is_default(_real_getsignal(sig)):
                _real_signal(sig, _on_signal)
