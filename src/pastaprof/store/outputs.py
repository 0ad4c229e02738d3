"""Every file pastaprof writes (JSON, Perfetto, HTML, plans), and the rules its outputs share.

The rule is that nothing the user did not name is replaced, and nothing is left
half-written.

Run directories are claimed in :mod:`pastaprof.store.run_dirs`.

Files (:func:`open_output`, :func:`write_output`) go to what the user named:

* ``-``, ``/dev/stdout``, ``/dev/stderr``, ``/dev/fd/N``, ``/proc/self/fd/N``:
  written to that open descriptor (what came before on it is kept; the CLI then
  prints its tables and messages to stderr, so stdout carries only the output);
* an existing FIFO or character device: opened and written into, never replaced (a FIFO
  that no reader opens within a few seconds is an error, not a hang);
* a symbolic link to a regular file: the file it points at is replaced
  (atomically), the link stays; a dangling link is refused;
* anything else: a temp file beside the target, renamed over it at the end, with
  the mode of the file it replaces, or ``0o666 & ~umask`` for a new file.

Any OSError of the output becomes one :class:`OutputError` line that names the
output path (never a temp file), and the temp file is removed.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from pastaprof.errors import OutputError

_FD_NAME = re.compile(r"^/(?:dev/fd|proc/self/fd|proc/thread-self/fd|proc/(?P<pid>\d+)/fd)/(?P<fd>\d+)$")
_STD_NAMES = {"-": 1, "/dev/stdout": 1, "/dev/stderr": 2}
FIFO_READER_WAIT = 5.0  # seconds an output FIFO without a reader is given to get one
_PROBLEMS = {
    errno.EFBIG: "file too large (the file size limit, ulimit -f, was reached)",
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
}


def problem(e: OSError) -> str:
    """The reason of an OSError, without the (possibly temporary) file name it carries."""
    if e.errno in _PROBLEMS:
        return _PROBLEMS[e.errno]
    return e.strerror.lower() if e.strerror else type(e).__name__


def _umask() -> int:
    """The process umask, read without changing it (os.umask would, racing other threads)."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def _std_fd(path: str) -> int | None:
    """The descriptor a path like ``-``, ``/dev/stdout`` or ``/proc/self/fd/3`` names, else None."""
    if path in _STD_NAMES:
        return _STD_NAMES[path]
    m = _FD_NAME.match(path)
    if m is None or (m["pid"] is not None and int(m["pid"]) != os.getpid()):
        return None
    return int(m["fd"])


def is_stdout(path: Path | str | None) -> bool:
    """Whether writing ``path`` writes standard output (``-``, ``/dev/stdout``, ``/dev/fd/1``...)."""
    return path is not None and _std_fd(str(path)) == 1


def _hidden(name: str, what: str) -> str:
    """A hidden sibling's name prefix: short enough that a legal target name keeps it legal, and
    one name's alone (a long name is cut and given a hash of the whole)."""
    if len(name) > 80:
        import hashlib

        name = name[:64] + "~" + hashlib.sha1(os.fsencode(name)).hexdigest()[:12]
    return f".{name}.{what}"


def _refuse_kernel_files(path: str) -> None:
    """/proc and /sys hold the kernel's files (writing one may change the system), never outputs;
    a pipe or terminal reached through them (a link to /dev/stdout) is still written into."""
    try:
        real = os.path.realpath(path)
    except OSError:  # a link /proc does not let us read: judge by the name
        real = os.path.abspath(path)
    if real not in ("/proc", "/sys") and not real.startswith(("/proc/", "/sys/")):
        return
    try:
        if stat.S_ISFIFO(os.stat(path).st_mode) or stat.S_ISCHR(os.stat(path).st_mode):
            return
    except OSError:
        pass
    raise OutputError(path, f"/{real.split('/')[1]} holds the kernel's files, not outputs")


def _ensure_dir(path: Path, output: Path | str) -> None:
    """Create ``path`` and its parents; a failure blames ``output``."""
    try:
        os.makedirs(path, exist_ok=True)
    except FileExistsError:
        raise OutputError(output, f"{path} is not a directory") from None
    except NotADirectoryError:
        raise OutputError(output, "a parent of it is not a directory") from None
    except OSError as e:
        raise OutputError(output, f"cannot create {path}: {problem(e)}") from None


# --- single files -------------------------------------------------------------------------

def _file_target(path: Path | str) -> tuple[str, int | str]:
    """What writing ``path`` means: ("fd", n), ("stream", path) or ("file", the file to replace)."""
    name = str(path)
    fd = _std_fd(name)
    if fd is not None:
        try:
            os.fstat(fd)
        except OSError:
            raise OutputError(name, f"descriptor {fd} is not open") from None
        return "fd", fd
    _refuse_kernel_files(name)
    try:
        st = os.lstat(name)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise OutputError(name, problem(e)) from None
    target = name
    if st is not None and stat.S_ISLNK(st.st_mode):
        try:
            st = os.stat(name)
        except FileNotFoundError:
            raise OutputError(name, "a dangling symbolic link (its target does not exist)") from None
        except OSError as e:
            raise OutputError(name, problem(e)) from None
        target = os.path.realpath(name)
    if st is None or stat.S_ISREG(st.st_mode):
        parent = os.path.dirname(os.path.abspath(target))
        if not os.path.isdir(parent):
            what = "directory does not exist" if not os.path.lexists(parent) else "is not a directory"
            raise OutputError(name, f"{parent}: {what}")
        return "file", target
    if stat.S_ISDIR(st.st_mode):
        raise OutputError(name, "is a directory")
    if stat.S_ISFIFO(st.st_mode) or stat.S_ISCHR(st.st_mode):
        return "stream", name
    raise OutputError(name, "not a regular file, FIFO or character device")


def check_not_input(target: Path | str | None, inputs: tuple[Path | str | None, ...]) -> None:
    """Refuse an output that is one of the inputs, lies inside an input run directory or holds
    an input: writing it would destroy what is being read (``analyze T --json T`` replaced the
    trace with its findings).  A new file or run inside a folder of traces harms none of them."""
    from pastaprof.errors import UsageError

    if target is None or is_stdout(target):
        return
    t = os.path.realpath(str(target))  # what a write replaces, through links
    for given in inputs:
        if given is None:
            continue
        s = os.path.realpath(str(given))
        same = t == s or (os.path.exists(t) and os.path.exists(s) and os.path.samefile(t, s))
        inside = t.startswith(s.rstrip(os.sep) + os.sep) and os.path.exists(os.path.join(s, "run.json"))
        holds = s.startswith(t.rstrip(os.sep) + os.sep)
        if same or inside or holds:
            how = "is" if same else "is inside" if inside else "holds"
            raise UsageError(f"{target}: {how} the input {given}; not writing there")


def check_output_file(path: Path | str) -> None:
    """Refuse early (before a long analysis) an output file that cannot be written."""
    kind, target = _file_target(path)
    if kind == "file":
        parent = os.path.dirname(os.path.abspath(str(target)))
        if not os.access(parent, os.W_OK | os.X_OK):
            raise OutputError(path, f"{parent}: permission denied")


class _Output:
    """A binary file whose OSErrors blame the output path (gzip and others wrap it)."""

    def __init__(self, f: BinaryIO, name: str) -> None:
        self._f = f
        self.name = name
        self._gone = False  # the reader of a pipe went away: the rest is discarded

    def write(self, data: bytes) -> int:
        if self._gone:
            return len(data)
        try:
            return self._f.write(data)
        except BrokenPipeError:
            self._reader_left()
            return len(data)
        except OSError as e:
            raise OutputError(self.name, problem(e)) from None

    def flush(self) -> None:
        if self._gone:
            return
        try:
            self._f.flush()
        except BrokenPipeError:
            self._reader_left()
        except OSError as e:
            raise OutputError(self.name, problem(e)) from None

    def close(self) -> None:
        try:
            self._f.close()
        except BrokenPipeError:
            self._reader_left()
        except OSError as e:
            raise OutputError(self.name, problem(e)) from None

    def _reader_left(self) -> None:
        """``--json - | head``: the command ends as any Unix tool whose reader left, by SIGPIPE
        once its other outputs are written (cli.main), not with an error line."""
        from pastaprof.report.pipes import silence

        self._gone = True
        try:
            silence(self._f.fileno())
        except (OSError, ValueError):
            pass

    def writable(self) -> bool:
        return True

    @property
    def closed(self) -> bool:
        return self._f.closed


def _open_stream(name: str) -> int:
    """A blocking write descriptor of an existing FIFO or character device.  A FIFO gets
    ``FIFO_READER_WAIT`` seconds for a reader to open it (``pastaprof analyze --json p & cat p``
    may start the reader a moment later); a FIFO nobody reads is one error, not a hang."""
    flags = os.O_WRONLY | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)
    deadline = time.monotonic() + FIFO_READER_WAIT
    while True:
        try:
            fd = os.open(name, flags | os.O_NONBLOCK)  # no truncation: FIFOs and devices have none
        except OSError as e:
            if e.errno == errno.ENXIO and time.monotonic() < deadline:
                time.sleep(0.05)  # a FIFO without a reader yet
                continue
            if e.errno == errno.ENXIO:
                raise OutputError(name, f"a FIFO that nothing reads (no reader opened it within "
                                        f"{FIFO_READER_WAIT:g} s)") from None
            raise OutputError(name, problem(e)) from None
        os.set_blocking(fd, True)
        return fd


@contextmanager
def open_output(path: Path | str) -> Iterator[_Output]:
    """A binary file to write ``path`` with (see the module doc for what each kind of path gets)."""
    name = str(path)
    kind, target = _file_target(name)
    if kind == "fd":
        sys.stdout.flush()
        sys.stderr.flush()
        out = _Output(os.fdopen(os.dup(int(target)), "wb"), name)
        try:
            yield out
        finally:
            out.close()
        return
    if kind == "stream":
        out = _Output(os.fdopen(_open_stream(name), "wb"), name)
        try:
            yield out
        finally:
            out.close()
        return
    dest = str(target)
    try:
        mode = stat.S_IMODE(os.stat(dest).st_mode) & 0o777  # its permissions, never set-id bits
    except OSError:
        mode = 0o666 & ~_umask()
    try:
        fd, tmp = tempfile.mkstemp(prefix=_hidden(os.path.basename(dest), ""), suffix=".partial",
                                   dir=os.path.dirname(os.path.abspath(dest)))
    except OSError as e:
        raise OutputError(name, problem(e)) from None
    try:
        out = _Output(os.fdopen(fd, "wb"), name)
        try:
            os.fchmod(fd, mode)
            yield out
        finally:
            out.close()
        os.replace(tmp, dest)
    except OSError as e:
        raise OutputError(name, problem(e)) from None
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass  # renamed into place (or never there)


def write_output(path: Path | str, data: bytes) -> None:
    """Write ``data`` to ``path`` whole, or not at all."""
    with open_output(path) as f:
        f.write(data)


# --- run directories ----------------------------------------------------------------------
