"""Every path pastaprof writes: run directories and single files (JSON, Perfetto, plans).

The rule is that nothing the user did not name is replaced, and nothing is left
half-written.

Run directories (``import -o``, ``analyze -o``, ``run -o``) are claimed with
:class:`OutputDir`: the run is written into a hidden sibling directory and
published with one rename that fails when something appeared at the target in
the meantime (``renameat2(RENAME_NOREPLACE)``; where that is missing, a plain
``rename`` of a directory, which only ever replaces an empty directory).  Of two
writers racing for one path exactly one wins; the other fails with exit code 2
and the winner's run stays intact.  ``--force`` replaces only what is at the
path itself: a symbolic link is replaced as a link (its target is never
touched), a directory is first renamed aside and deleted only once the new run
is in place, so a failed publish puts it back.

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

import ctypes
import errno
import fcntl
import os
import re
import shutil
import signal
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from pastaprof.errors import OutputError, UsageError
from pastaprof.store.safe_read import describe_mode

_FD_NAME = re.compile(r"^/(?:dev/fd|proc/self/fd|proc/thread-self/fd|proc/(?P<pid>\d+)/fd)/(?P<fd>\d+)$")
_STD_NAMES = {"-": 1, "/dev/stdout": 1, "/dev/stderr": 2}
_RENAME_NOREPLACE = 1
#: Hidden run directories of this process not yet published or discarded: what a signal's
#: cleanup removes, whichever frame it interrupted (even one before a ``with`` was entered).
_UNPUBLISHED: set[str] = set()
_HELD_SIGNALS = {getattr(signal, n) for n in ("SIGTERM", "SIGHUP", "SIGINT") if hasattr(signal, n)}
_AT_FDCWD = -100
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

def _libc_renameat2():
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_renameat2 = _libc_renameat2() if sys.platform.startswith("linux") else None


def rename_noreplace(src: str, dst: str) -> None:
    """Rename directory ``src`` to ``dst``; FileExistsError when anything but an empty
    directory is at ``dst`` (an empty one is replaced: nothing is lost)."""
    if _renameat2 is not None:
        if _renameat2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE) == 0:
            return
        err = ctypes.get_errno()
        # EINVAL/ENOSYS: not supported on this file system; EEXIST on an empty directory: rename below
        if err not in (errno.EINVAL, errno.ENOSYS, errno.EPERM) and not (err == errno.EEXIST and _is_empty_dir(dst)):
            raise OSError(err, os.strerror(err), dst)
    if os.path.lexists(dst) and not _is_empty_dir(dst):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), dst)
    try:
        os.rename(src, dst)  # a directory onto anything but an empty directory fails
    except OSError as e:
        if e.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), dst) from None
        raise


def _is_empty_dir(path: str) -> bool:
    """A real directory (not a link to one) with nothing in it."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode) and not os.listdir(path)
    except OSError:
        return False


def _remove(path: str) -> None:
    """Delete what is at ``path`` itself: a link or file is unlinked, a real directory deleted."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path, ignore_errors=True)
    else:
        os.unlink(path)


class OutputDir:
    """A run directory being written: ``tmp`` now, ``dest`` after :meth:`publish`.

    Creating one checks ``dest`` (it must not exist unless ``force`` or it is an empty
    directory), creates its parents, and makes the hidden sibling ``tmp``."""

    def __init__(self, dest: Path | str, force: bool = False) -> None:
        self.dest = Path(os.path.abspath(dest))  # the link itself, never what it points at
        self.force = force
        _refuse_kernel_files(str(self.dest))
        check_output_dir(self.dest, force)
        _ensure_dir(self.dest.parent, self.dest)
        self._lock: int | None = None
        prefix = _hidden(self.dest.name, "partial-")
        try:
            with _signals_held():  # created and registered for cleanup as one step
                # the time in the name orders the claims of writers racing for one dest
                self.tmp = Path(tempfile.mkdtemp(prefix=f"{prefix}{time.time_ns():016x}-", dir=self.dest.parent))
                _UNPUBLISHED.add(str(self.tmp))
            os.chmod(self.tmp, 0o777 & ~_umask())
        except OSError as e:
            self.discard()
            raise OutputError(self.dest, problem(e)) from None
        try:
            self._lock = _lock_dir(str(self.tmp), fcntl.LOCK_EX)
        except OSError:  # a file system without locks (some NFS): the publish's no-replace rename still decides
            pass
        if _earlier_writer(self.dest.parent, prefix, self.tmp.name, clean=self._lock is not None):
            self.discard()
            raise UsageError(f"{self.dest}: another pastaprof is writing a run there now; left it to that one "
                             "(choose another output)")

    def publish(self) -> Path:
        """Move the finished run to ``dest``; UsageError when something took ``dest`` meanwhile
        (without force), OutputError when the rename fails.  ``tmp`` is gone either way."""
        try:
            self._publish()
        except BaseException:
            self.discard()
            raise
        self._unlock()
        return self.dest

    def _publish(self) -> None:
        src, dst = str(self.tmp), str(self.dest)
        for _ in range(5):
            aside = None
            if self.force and os.path.lexists(dst):
                check_output_dir(dst, force=True)  # what is there now, not what was at the start
                aside = self._move_aside()
            try:
                with _signals_held():  # published and unregistered as one step
                    rename_noreplace(src, dst)
                    _UNPUBLISHED.discard(src)
            except FileExistsError:
                if aside is not None:
                    _remove(aside)  # it was replaced on request; what appeared since is the next one
                if self.force:
                    continue
                raise UsageError(f"{dst}: appeared while the run was being written; left it as it is "
                                 "(use --force to replace it)") from None
            except OSError as e:
                if aside is not None:
                    os.rename(aside, dst)
                raise OutputError(dst, problem(e)) from None
            if aside is not None:
                _remove(aside)
            return
        raise UsageError(f"{dst}: keeps being recreated by something else; left it as it is")

    def _move_aside(self) -> str | None:
        """Rename what is at ``dest`` to a hidden sibling (None: it vanished by itself)."""
        for _ in range(100):
            aside = str(self.dest.parent / (_hidden(self.dest.name, "replaced-") + os.urandom(4).hex()))
            try:
                rename_noreplace(str(self.dest), aside)
            except FileExistsError:
                continue
            except FileNotFoundError:
                return None
            except OSError as e:
                raise OutputError(self.dest, f"cannot replace it: {problem(e)}") from None
            return aside
        raise OutputError(self.dest, "cannot replace it")

    def discard(self) -> None:
        if getattr(self, "tmp", None) is None:
            return
        shutil.rmtree(self.tmp, ignore_errors=True)
        _UNPUBLISHED.discard(str(self.tmp))
        self._unlock()

    def _unlock(self) -> None:
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None


def _lock_dir(path: str, how: int) -> int:
    """A descriptor of directory ``path`` holding ``flock(how | LOCK_NB)`` (BlockingIOError when held)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    try:
        fcntl.flock(fd, how | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise
    return fd


STALE_CLAIM_S = 60  # an unlocked claim this old was left by a killed writer (a live one locks at once)


def _claim_age_s(name: str, prefix: str) -> float:
    """Seconds since the claim ``name`` was made (the time in its name); 0 when unreadable."""
    try:
        return (time.time_ns() - int(name[len(prefix):].split("-", 1)[0], 16)) / 1e9
    except ValueError:
        return 0.0


def _earlier_writer(parent: Path, prefix: str, mine: str, clean: bool = True) -> bool:
    """Whether a live writer (its claim locked) started on the same dest before this one.  A claim
    left by a killed writer is unlocked and does not count; with ``clean`` (this file system has
    locks), one older than ``STALE_CLAIM_S`` is removed (it is pastaprof's own hidden directory of
    a run that was never published, and it may hold gigabytes).  Two claims made in the same
    instant both go on; then the publish's no-replace rename lets one win."""
    try:
        names = [e.name for e in os.scandir(parent) if e.name.startswith(prefix) and e.name < mine]
    except OSError:
        return False
    for name in names:
        path = os.path.join(parent, name)
        try:
            os.close(_lock_dir(path, fcntl.LOCK_SH))  # (shared: two new writers checking at once both get it)
        except BlockingIOError:
            return True
        except OSError:
            continue  # gone meanwhile (published or discarded), or not a directory
        if clean and _claim_age_s(name, prefix) > STALE_CLAIM_S:  # only its writer ever locks it, at its start
            shutil.rmtree(path, ignore_errors=True)
    return False


def discard_unpublished() -> None:
    """Remove every run directory this process claimed and has not published: the cleanup of
    a SIGTERM/SIGHUP/Ctrl-C that may have interrupted a writer anywhere."""
    for tmp in list(_UNPUBLISHED):
        shutil.rmtree(tmp, ignore_errors=True)
        _UNPUBLISHED.discard(tmp)


@contextmanager
def _signals_held() -> Iterator[None]:
    """Hold SIGTERM, SIGHUP and SIGINT (delivered when the block ends), so that a signal never
    falls between creating a hidden directory and registering it, or publishing and unregistering."""
    try:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD_SIGNALS)
    except (AttributeError, OSError, ValueError):
        yield
        return
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def check_output_dir(dest: Path | str, force: bool = False) -> None:
    """UsageError when ``dest`` exists and may not be replaced.  An empty directory may always
    be; with ``force`` anything may but a non-empty directory that is not a pastaprof run (a
    typo like ``-o ~ --force`` must not delete a home directory)."""
    dest = str(dest)
    if not os.path.lexists(dest) or _is_empty_dir(dest):
        return
    try:
        mode = os.lstat(dest).st_mode
    except OSError as e:
        raise OutputError(dest, problem(e)) from None
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
        # a device node, FIFO or socket is the system's or another program's: /dev/null must stay a device
        raise UsageError(f"{dest}: is {describe_mode(mode)}, not a run directory; not replacing it"
                         + (", even with --force" if force else ""))
    real_dir = stat.S_ISDIR(mode)
    if force:
        if real_dir and not os.path.lexists(os.path.join(dest, "run.json")):
            raise UsageError(f"{dest}: a directory that is not a pastaprof run; not replacing it, even with --force")
        return
    what = "a symbolic link" if os.path.islink(dest) else "a directory" if real_dir else "a file"
    raise UsageError(f"{dest}: already exists ({what}; use --force to replace it)")
