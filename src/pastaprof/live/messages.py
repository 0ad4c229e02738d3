"""The two ways capture talks to the user: a warning (something went wrong, capture goes
on or stops) and a notice (a status line, printed once by `pastaprof run` at exit)."""

from __future__ import annotations

import errno
import os
import sys
import threading

_stop_lock = threading.Lock()
stop_reason: list[str] = []  # the line of stopped() once it has been said, for the run's status
# errors of the run directory's file system: the output is to blame, not the program or pastaprof
_OUTPUT_ERRNOS = {errno.EFBIG, errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO}


def warn(msg: str) -> None:
    try:
        from pastaprof.report.names import terminal_safe  # names in it cannot control the terminal

        line = f"pastaprof: warning: {terminal_safe(str(msg))}\n"
        if not _to_launcher(line):
            sys.stderr.write(line)
            sys.stderr.flush()
    except Exception:
        pass


def _to_launcher(line: str) -> bool:
    """Under `pastaprof run`: ``line`` where the launcher's own stderr is, never in a log file
    the program pointed its stderr at.  A terminal, pipe or socket is written through
    /proc/PID/fd/2; a regular file only through this process's fd 2 when that is the same file
    (the shared offset: the program only replaced ``sys.stderr``).  False otherwise (not under
    `pastaprof run`, no /proc): the caller writes ``sys.stderr``."""
    import stat

    pid = os.environ.get("PASTAPROF_LAUNCHER", "")
    if not pid.isdigit():
        return False
    data = line.encode("utf-8", "replace")
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:  # still the launcher, not a process given its pid since
            if b"pastaprof" not in f.read(4096):
                return False
        theirs = os.stat(f"/proc/{pid}/fd/2")
        if stat.S_ISREG(theirs.st_mode):
            ours = os.fstat(2)
            return (ours.st_dev, ours.st_ino) == (theirs.st_dev, theirs.st_ino) and os.write(2, data) == len(data)
        fd = os.open(f"/proc/{pid}/fd/2", os.O_WRONLY | os.O_NOCTTY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        return os.write(fd, data) == len(data)
    except OSError:
        return False
    finally:
        os.close(fd)


def notice(msg: str) -> None:
    """A status line for the user: printed here, unless `pastaprof run` prints the
    run's status lines itself when the program ends (each once)."""
    if not os.environ.get("PASTAPROF_RUN_PARENT"):
        warn(msg)


def capture_started() -> None:
    """A new session: its own first error is said again."""
    stop_reason.clear()


def stopped(e: BaseException) -> None:
    """Capture stopped on an error: one warning per process, whichever thread (periodic flush,
    deadline, spill, final flush) meets it first; the others stop quietly."""
    if isinstance(e, OSError) and e.errno in _OUTPUT_ERRNOS:
        line = (f"capture stopped: the run's output cannot be written ({e.strerror or e}); "
                "events recorded after the last flush are lost")
    else:
        line = f"capture stopped: {type(e).__name__}: {e}"
    with _stop_lock:
        if stop_reason:
            return
        stop_reason.append(line)
    notice(line)  # under `pastaprof run`, its status line at exit (once)
