"""Reading what pastaprof is given -- run.json, Parquet parts, trace paths -- without trusting it.

Every reader of a run directory or a trace path goes through here, so that one rule holds for
all of them: a path is first ``stat``-ed (opening a FIFO blocks, opening some devices has side
effects), must be a regular file, and is then opened by descriptor with ``O_NONBLOCK`` and
checked again with ``fstat`` (the name may have changed in between).  Nothing is read without a
bound, no link is followed out of a run directory, and each failure is one ``InputError`` line
naming the file and the problem.  A pipe the user gave as a trace (``<(zcat t.json.gz)``,
``/dev/stdin``) is the one non-regular file read: it is copied into a bounded temporary file,
since the importer seeks.  run.json's fields are then type-checked by manifest_check.py.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from itertools import chain
from pathlib import Path
from typing import Any

import pyarrow as pa

from pastaprof.errors import InputError

MAX_MANIFEST_BYTES = 64 << 20  # a run.json is kilobytes; a 64-rank live run's is well under 1 MB
MAX_JSON_DEPTH = 64            # pastaprof's manifests nest 5 deep
PIPE_MAX_BYTES = 64 << 30      # a piped trace is copied to a temporary file up to this size
PIPE_FREE_MARGIN = 1 << 30     # ... and never closer than this to filling the temporary disk
FIFO_WRITER_WAIT = 2.0         # seconds a named FIFO without a writer is given to get one
_CHUNK = 8 << 20
_DEV_NULL = (1, 3)             # major, minor of /dev/null


def one_line(e: BaseException | str, limit: int = 300) -> str:
    """An exception's message as one short line (library messages may span lines)."""
    text = " ".join(str(e).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def printable(text: str) -> str:
    """A name from a file (a JSON key, a column) as it may appear in a one-line message."""
    return text if text.isprintable() and len(text) <= 60 else repr(text[:60])


def describe_mode(mode: int) -> str:
    """'a directory', 'a FIFO (named pipe)', ... for a file's ``st_mode``."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "not a regular file"


def os_problem(e: OSError) -> str:
    """What an OSError of reading says, as the end of a one-line message (no file name: the caller names it)."""
    if e.errno == errno.ENOENT:
        return "no such file"
    if e.errno == errno.ELOOP:
        return "a symbolic link loop"
    if e.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    if e.errno == errno.ENXIO:
        return "cannot be opened (a socket or a device without a driver)"
    return f"cannot be read ({e.strerror or one_line(e)})"


def check_inside(path: Path, root: Path) -> None:
    """Refuse ``path`` when it resolves (through links) to somewhere outside ``root``."""
    real, top = os.path.realpath(path), os.path.realpath(root)
    if real != top and not real.startswith(top.rstrip(os.sep) + os.sep):
        try:
            what = "" if stat.S_ISREG(mode := os.stat(real).st_mode) else f", {describe_mode(mode)}"
        except OSError:
            what = ", which does not exist"
        raise InputError(path, f"is a link out of the run directory (to {real}{what}); not followed")


def open_regular(path: Path, root: Path | None = None, what: str = "a regular file") -> tuple[int, os.stat_result]:
    """A read-only descriptor of ``path`` and its ``fstat``, after checking that it is a regular
    file (and, with ``root``, that it lies inside ``root``).  The caller closes the descriptor."""
    if root is not None:
        check_inside(path, root)
    try:
        st = os.stat(path)
    except OSError as e:
        raise InputError(path, os_problem(e)) from None
    if not stat.S_ISREG(st.st_mode):
        raise InputError(path, f"is {describe_mode(st.st_mode)}, expected {what}")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise InputError(path, os_problem(e)) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):  # replaced between the stat and the open
        os.close(fd)
        raise InputError(path, f"is {describe_mode(st.st_mode)}, expected {what}")
    return fd, st


def read_bounded(path: Path, limit: int, root: Path | None = None, what: str = "a regular file") -> bytes:
    """All bytes of a regular file of at most ``limit`` bytes (a file growing while read counts)."""
    fd, st = open_regular(path, root, what)
    try:
        if st.st_size > limit:
            raise InputError(path, f"too large ({st.st_size:,} bytes; at most {limit:,} expected)")
        chunks, total = [], 0
        while True:
            try:
                block = os.read(fd, min(_CHUNK, limit + 1 - total))
            except OSError as e:
                raise InputError(path, os_problem(e)) from None
            if not block:
                break
            chunks.append(block)
            total += len(block)
            if total > limit:
                raise InputError(path, f"too large (over {limit:,} bytes)")
        return b"".join(chunks)
    finally:
        os.close(fd)


def _too_deep(value: Any, limit: int) -> bool:
    """Whether ``value`` nests more than ``limit`` deep: level by level, without recursion (a
    hostile document must not exhaust the stack) and in comprehensions (a 64 MB one is fast)."""
    level = [value] if type(value) in (list, dict) else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        items = chain(chain.from_iterable(c for c in level if type(c) is list),
                      chain.from_iterable(map(dict.values, (c for c in level if type(c) is dict))))
        level = [x for x in items if type(x) in (list, dict)]
    return False


def load_json(path: Path, limit: int = MAX_MANIFEST_BYTES, root: Path | None = None, label: str = "") -> Any:
    """A small JSON document: bounded read, UTF-8, nesting at most ``MAX_JSON_DEPTH`` deep.
    ``label`` prefixes what is wrong with the content (e.g. "corrupt manifest: ")."""
    data = read_bounded(path, limit, root, "a JSON file")
    if not data.strip():
        raise InputError(path, f"{label}empty file, expected JSON")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise InputError(path, f"{label}not UTF-8 text (byte {e.start})") from None
    deep = f"{label}JSON nested too deeply (more than {MAX_JSON_DEPTH} levels)"
    try:
        value = json.loads(text, parse_constant=_no_constant, parse_int=_int64)
    except RecursionError:
        raise InputError(path, deep) from None
    except ValueError as e:  # JSONDecodeError, _int64, _no_constant, int() of over 4,300 digits
        raise InputError(path, f"{label}not valid JSON ({one_line(e)})") from None
    if _too_deep(value, MAX_JSON_DEPTH):
        raise InputError(path, deep)
    if _SURROGATE_ESCAPE.search(text):  # a lone "\\ud800": a str no UTF-8 writer (terminal, orjson) takes
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise InputError(path, f"{label}a string holds a lone UTF-16 surrogate (a \\uD800-\\uDFFF escape "
                                   "without its pair)") from None
    return value


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _int64(digits: str) -> int:
    """A JSON integer, which must fit int64 (pastaprof writes none larger; no reader takes one)."""
    v = int(digits)
    if not -(2**63) <= v < 2**63:
        raise ValueError(f"the integer {digits[:30]}{'...' if len(digits) > 30 else ''} does not fit 64 bits")
    return v


# --- trace paths -----------------------------------------------------------------------------

def check_trace_file(path: Path) -> Path:
    """``path`` if it is a regular file to import; else one line saying what it is.
    (Pipes are copied to a regular file by :func:`readable_trace` before this is asked.)"""
    try:
        st = os.stat(path)
    except OSError as e:
        raise InputError(path, os_problem(e)) from None
    if stat.S_ISREG(st.st_mode):
        return path
    if stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == _DEV_NULL:
        raise InputError(path, "empty file (/dev/null), expected a trace")
    raise InputError(path, f"is {describe_mode(st.st_mode)}, expected a trace file or a folder of them")


def _is_pipe(path: Path) -> bool:
    try:
        return stat.S_ISFIFO(os.stat(path).st_mode)
    except OSError:
        return False


@contextlib.contextmanager
def readable_trace(path: Path) -> Iterator[Path]:
    """``path`` itself, or for a pipe (a FIFO, ``<(zcat t.json.gz)``, ``/dev/stdin``) a bounded
    temporary copy of its bytes.  Errors that name the copy are re-raised naming ``path``."""
    if not _is_pipe(path):
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="pastaprof-pipe-") as tmp:
        copy = Path(tmp) / "trace"
        _copy_pipe(path, copy)
        try:
            yield copy
        except InputError as e:
            if e.path.startswith(tmp) or tmp in e.problem:
                raise InputError(path, e.problem.replace(str(copy), str(path)).replace(tmp, "")) from None
            raise


def _copy_pipe(path: Path, copy: Path) -> None:
    """Copy a pipe's bytes into ``copy``; refuse early what cannot be a trace (the first bytes
    are neither gzip nor JSON: ``<(yes)`` must not fill the disk)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise InputError(path, os_problem(e)) from None
    try:
        os.set_blocking(fd, True)  # a pipe with a writer: wait for its data, as `cat` would
        room = min(PIPE_MAX_BYTES, shutil.disk_usage(copy.parent).free - PIPE_FREE_MARGIN)
        # a named FIFO may get its writer a moment after us (`pastaprof analyze p & zcat t > p`);
        # an anonymous pipe at EOF has lost its writer for good
        wait_until = time.monotonic() + FIFO_WRITER_WAIT if stat.S_ISFIFO(os.lstat(path).st_mode) else 0.0
        with open(copy, "wb") as out:
            total, checked = 0, False
            while True:
                block = os.read(fd, _CHUNK)
                if not block and total == 0 and time.monotonic() < wait_until:
                    time.sleep(0.05)
                    continue
                if not block:
                    break
                if not checked and block.strip():
                    _check_trace_start(path, block)
                    checked = True
                total += len(block)
                if total > room:
                    raise InputError(path, f"the pipe gave more than {max(room, 0):,} bytes: too large to stage")
                out.write(block)
        if total == 0 or not checked:
            raise InputError(path, "empty file (the pipe gave no data), expected a trace")
    except OSError as e:
        raise InputError(path, os_problem(e)) from None
    finally:
        os.close(fd)


def _check_trace_start(path: Path, block: bytes) -> None:
    head = block.lstrip()
    if head.startswith(b"\xef\xbb\xbf"):
        head = head[3:].lstrip()
    if block[:2] != b"\x1f\x8b" and head[:1] not in (b"{", b"["):
        raise InputError(path, "not JSON: does not start with '{' or '[' (nor is it gzip data)")


# --- Parquet parts -----------------------------------------------------------------------------

def _string_like(t: pa.DataType) -> bool:
    if pa.types.is_dictionary(t):
        t = t.value_type
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _compatible(have: pa.DataType, want: pa.DataType) -> bool:
    """Whether a stored column of type ``have`` is read as ``want`` (a cast that cannot change
    what the values mean: text as text, integers as integers, numbers as floats)."""
    if have == want:
        return True
    if _string_like(want):
        return _string_like(have)
    if pa.types.is_integer(want):
        return pa.types.is_integer(have)
    if pa.types.is_floating(want):
        return pa.types.is_integer(have) or pa.types.is_floating(have)
    if (pa.types.is_list(want) or pa.types.is_fixed_size_list(want)) and (
            pa.types.is_list(have) or pa.types.is_large_list(have) or pa.types.is_fixed_size_list(have)):
        return _compatible(have.value_type, want.value_type)
    return False


def _check_schema(path: Path, kind: str | None, sch: pa.Schema) -> None:
    """Refuse a part that is not of ``kind``: another table's part, another event schema
    version, a column of a type its values cannot be read as, a required column missing."""
    from pastaprof.events.schema import SCHEMA_VERSION, schema

    meta = sch.metadata or {}
    stored = meta.get(b"pastaprof.kind")
    if kind is not None and stored is not None and stored != kind.encode():
        raise InputError(path, f"holds {printable(stored.decode('utf-8', 'replace'))} events, not {kind}: "
                               "a part of another table")
    version = meta.get(b"pastaprof.schema_version")
    if version is not None and version != str(SCHEMA_VERSION).encode():
        raise InputError(path, f"written with event schema version {printable(version.decode('utf-8', 'replace'))}, "
                               f"this pastaprof reads {SCHEMA_VERSION}")
    if len(set(sch.names)) != len(sch.names):
        twice = next(n for n in sch.names if sch.names.count(n) > 1)
        raise InputError(path, f"column '{printable(twice)}' appears twice")
    if kind is None:
        return
    for field in schema(kind):
        i = sch.get_field_index(field.name)
        if i < 0:
            if not field.nullable:
                raise InputError(path, f"no '{field.name}' column: not a {kind} part")
            continue
        have = sch.field(i).type
        if not _compatible(have, field.type):
            raise InputError(path, f"column '{field.name}' is {have}, expected {field.type}")


@contextlib.contextmanager
def _parquet(path: Path, root: Path | None) -> Iterator[Any]:
    """A ``pq.ParquetFile`` over a checked descriptor of ``path``; any failure of the Parquet
    library inside the block is one InputError naming the part."""
    import pyarrow.parquet as pq

    fd, st = open_regular(path, root, "a Parquet file")
    with contextlib.ExitStack() as stack:
        stack.callback(os.close, fd)
        if st.st_size == 0:
            raise InputError(path, "empty file, expected Parquet")
        try:
            with pq.ParquetFile(stack.enter_context(_native_file(fd, st))) as pf:
                yield pf
        except InputError:
            raise
        except MemoryError:
            raise InputError(path, "corrupt Parquet: it asks for more memory than there is") from None
        except Exception as e:  # noqa: BLE001 -- pyarrow raises many types on corrupt bytes
            raise InputError(path, f"corrupt or truncated Parquet ({one_line(e, 200)})") from None


def _memory_bytes() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 1 << 62


def _check_footer(path: Path, kind: str | None, pf: Any) -> int:
    """The schema check, and a bound on what reading the part would take: a small file can
    claim billions of rows (run-length-encoded nulls) or terabytes once decompressed."""
    _check_schema(path, kind, pf.schema_arrow)
    md = pf.metadata
    rows = md.num_rows
    if rows < 0:
        raise InputError(path, f"corrupt Parquet footer ({rows} rows)")
    claimed = max(rows * max(md.num_columns, 1) * 8,
                  sum(md.row_group(i).total_byte_size for i in range(md.num_row_groups)))
    if claimed > _memory_bytes():
        raise InputError(path, f"claims {rows:,} rows ({claimed:,} bytes once read): more than this "
                               "machine's memory; a damaged or hostile part")
    return rows


def part_rows(path: Path, kind: str | None, root: Path | None = None) -> int:
    """Rows of a part, from its footer, after checking that it is a part of ``kind``."""
    with _parquet(path, root) as pf:
        return _check_footer(path, kind, pf)


def part_columns(path: Path, columns: list[str], root: Path | None = None) -> pa.Table:
    """Only ``columns`` of a part (those it has), checked as :func:`read_part` checks a part."""
    with _parquet(path, root) as pf:
        _check_footer(path, None, pf)
        t = pf.read(columns=[c for c in columns if c in pf.schema_arrow.names])
        try:
            t.validate(full=True)
        except pa.ArrowInvalid as e:
            raise InputError(path, f"corrupt Parquet data ({one_line(e, 200)})") from None
        return t


def read_part(path: Path, kind: str | None, root: Path | None = None) -> pa.Table:
    """A part's events, checked (see ``part_rows``) and, with ``kind``, conformed to its schema."""
    from pastaprof.events.limits import check_sizes, check_time_range
    from pastaprof.events.schema import conform

    with _parquet(path, root) as pf:
        _check_footer(path, kind, pf)
        t = pf.read()
        try:  # offsets, dictionary indices, UTF-8 of text: Parquet decoding checks none of them (~15 ns a row)
            t.validate(full=True)
        except pa.ArrowInvalid as e:
            raise InputError(path, f"corrupt Parquet data ({one_line(e, 200)})") from None
        if kind is None:
            return t
        try:
            t = conform(kind, t)
        except Exception as e:  # noqa: BLE001 -- a cast that does not fit (an integer out of range)
            raise InputError(path, f"cannot be read as {kind} events ({one_line(e, 200)})") from None
    for field in t.schema:  # conform keeps a null in a column the schema declares non-nullable
        n = t[field.name].null_count
        if n and not field.nullable:
            raise InputError(path, f"column '{printable(field.name)}' holds {n:,} nulls; {kind} events have none")
    # times a part can hold but no tool's int64 arithmetic takes (-2**63 beside today): as on import
    check_time_range({kind: t}, path)
    check_sizes({kind: t}, path)
    return t


def native_buffer(data: bytes) -> pa.Buffer:
    """``data`` copied into memory Arrow owns.  Arrow's reader threads must never hold the last
    reference to Python-owned memory: the one that drops it takes the GIL, and when that happens
    while the interpreter finalizes, the thread is unwound through a ``noexcept`` destructor and
    the whole process aborts ("terminate called without an active exception")."""
    buf = pa.allocate_buffer(len(data))
    memoryview(buf).cast("B")[:] = data
    return buf


def _native_file(fd: int, st: os.stat_result) -> pa.NativeFile:
    """An Arrow-native reader of the checked descriptor ``fd`` (see ``native_buffer`` for why
    not a Python file object): the same file reopened through ``/proc/self/fd``, else its bytes
    (a regular file of ``st.st_size`` bytes) read into Arrow's memory."""
    try:
        f = pa.OSFile(f"/proc/self/fd/{fd}")
        same = os.fstat(f.fileno())
        if (same.st_dev, same.st_ino) == (st.st_dev, st.st_ino):
            return f
        f.close()
    except (OSError, pa.ArrowException):
        pass
    chunks, left = [], st.st_size  # (a file growing meanwhile is read as it was)
    while left > 0 and (chunk := os.read(fd, min(left, _CHUNK))):
        chunks.append(chunk)
        left -= len(chunk)
    return pa.BufferReader(native_buffer(b"".join(chunks)))
