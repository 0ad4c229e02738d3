"""pastaprof's threads in the program's processes, out of the program's sight.

A ``threading.Thread`` is listed by ``threading.enumerate()`` and counted by
``threading.active_count()``, gets the program's ``threading.settrace``/``setprofile``
functions, and its death by an exception goes to the program's ``threading.excepthook``.
The capture's threads (flush, deadline, spill, signal watchdog) are started with
``_thread.start_new_thread`` instead, so the program sees the threads it started and no
other.  Code running on them must not call ``threading.current_thread()`` (that would
register a ``_DummyThread``, listed like any other): ``on_main_thread()`` and
``threading.get_ident()`` answer what it is used for.
"""

from __future__ import annotations

import _thread
import os
import threading
from collections.abc import Callable
from typing import Any

_running: dict[int, str] = {}  # native id -> name, of this process's hidden threads now running


class HiddenThread:
    """A daemon thread with the few ``threading.Thread`` methods the capture uses."""

    def __init__(self, target: Callable[..., Any], name: str, args: tuple = ()) -> None:
        self.name = name
        self._target, self._args = target, args
        self._done = threading.Event()
        self._pid = os.getpid()
        self.ident: int | None = None

    def start(self) -> None:
        _thread.start_new_thread(self._run, ())

    def _run(self) -> None:
        self.ident = _thread.get_ident()
        native = threading.get_native_id()
        _running[native] = self.name
        _name_os_thread(self.name)
        try:
            self._target(*self._args)
        except BaseException:  # noqa: BLE001 -- a capture failure never reaches the program's hooks
            pass
        finally:
            _running.pop(native, None)
            self._done.set()

    def is_alive(self) -> bool:
        return self._pid == os.getpid() and self.ident is not None and not self._done.is_set()

    def join(self, timeout: float | None = None) -> None:
        if self._pid == os.getpid():  # a forked child has none of its parent's threads
            self._done.wait(timeout)


def _name_os_thread(name: str) -> None:
    """Give the running thread an OS name ("pastaprof-flush" -> "pp-flush": 15 bytes at most),
    so that ``top -H``, ``ps -L`` and /proc/PID/task/*/comm tell the capture's threads from the
    program's.  Calls only a function found by ``start`` on the starting thread: a new thread
    imports nothing while the program's thread may be importing."""
    if _prctl:
        short = "pp-" + name.removeprefix("pastaprof-")
        try:
            _prctl(15, short.encode()[:15], 0, 0, 0)  # PR_SET_NAME
        except Exception:  # noqa: BLE001 -- only a name
            pass


_prctl: Any = False  # libc's prctl once looked up (None where there is none)


def _find_prctl() -> Any:
    try:
        import ctypes

        return ctypes.CDLL(None).prctl
    except (OSError, AttributeError):
        return None


def start(target: Callable[..., Any], name: str, args: tuple = ()) -> HiddenThread:
    global _prctl
    if _prctl is False:
        _prctl = _find_prctl()
    th = HiddenThread(target, name, args)
    th.start()
    return th


def native_ids() -> set[int]:
    """Native thread ids of the hidden threads running in this process."""
    return set(_running)


def on_main_thread() -> bool:
    return threading.get_ident() == threading.main_thread().ident
