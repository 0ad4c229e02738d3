"""Run directories pastaprof writes (``import -o``, ``analyze -o``, ``run -o``).

The rule is that nothing the user did not name is replaced, and nothing is left
half-written.

They are claimed with :class:`OutputDir`: the run is written into a hidden sibling directory and
published with one rename that fails when something appeared at the target in
the meantime (``renameat2(RENAME_NOREPLACE)``; where that is missing, a plain
``rename`` of a directory, which only ever replaces an empty directory).  Of two
writers racing for one path exactly one wins; the other fails with exit code 2
and the winner's run stays intact.  ``--force`` replaces only what is at the
path itself: a symbolic link is replaced as a link (its target is never
touched), a directory is first renamed aside and deleted only once the new run
is in place, so a failed publish puts it back.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import shutil
import signal
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pastaprof.errors import OutputError, UsageError
from pastaprof.store.outputs import _ensure_dir, _hidden, _refuse_kernel_files, _umask, problem
from pastaprof.store.safe_read import describe_mode

_RENAME_NOREPLACE = 1
#: Hidden run directories of this process not yet published or discarded: what a signal's
#: cleanup removes, whichever frame it interrupted (even one before a ``with`` was entered).
_UNPUBLISHED: set[str] = set()
_HELD_SIGNALS = {getattr(signal, n) for n in ("SIGTERM", "SIGHUP", "SIGINT") if hasattr(signal, n)}
_AT_FDCWD = -100


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
