"""Find the event array inside a Chrome-trace JSON file and stage it for DuckDB.

A Kineto trace is one JSON object; its ``traceEvents`` array holds nearly all of
its bytes, with metadata before and after it (``deviceProperties``, torch >= 2.4's
``"INFO"`` log array, ``traceName``; other writers add ``samples`` and more, in any
order).  A streaming scan of the JSON structure (jsonscan.py) finds the top-level
``traceEvents`` value and the ``]`` that closes it; we copy exactly that array
(decompressing ``.gz`` on the way) into a temporary file that DuckDB's JSON reader
then parses in parallel, in C++, straight into columns.  The members around it are
parsed with orjson.  Nothing here holds the trace in memory.  Chrome's bare-array
form (``[...]`` without an object) is read the same way.

A big uncompressed trace in Kineto's layout takes a shorter way (:func:`stage_plain`):
the end of its array is found from the file's tail and the same parts are copied inside
the kernel, the events never read by Python; the parse proves the guess or the caller
stages exactly.
"""

from __future__ import annotations

import gzip
import os
import re
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from pastaprof.errors import InputError
from pastaprof.importers.jsonscan import ArrayEnd, Scanner

CHUNK = 8 << 20
HEAD_LIMIT = 64 << 20     # metadata before the event array that we read to find it
TRAILER_LIMIT = 64 << 20  # metadata after it that we parse (beyond: counted, not read)
_EVENTS_KEY = b'"traceEvents"'
# gzip'd JSON traces expand ~5-20x; past BOMB_MIN_BYTES, a stream that has expanded more than
# BOMB_RATIO times the compressed bytes read is refused (a few MB of gzip can hold TBs of blanks)
BOMB_MIN_BYTES = 256 << 20
BOMB_RATIO = 200


def open_trace(path: Path) -> BinaryIO:
    """Open a trace, transparently gunzipping (detected by magic bytes, not name)."""
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise InputError(path, "no such file") from None
    except IsADirectoryError:
        raise InputError(path, "is a directory, expected a trace file") from None
    except OSError as e:
        raise InputError(path, f"cannot open: {e.strerror}") from None
    try:
        magic = f.read(2)
        f.seek(0)
    except OSError as e:  # EIO of /proc/self/mem, a file on a failing disk
        f.close()
        raise InputError(path, f"read error: {e.strerror or e}") from None
    if magic == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=f, mode="rb")  # type: ignore[return-value]
    return f


_NON_WS = re.compile(rb"[^ \t\r\n]")
# UTF-16/32 JSON: a byte-order mark, or a '{', '[' or blank next to NUL bytes
_WIDE_TEXT = re.compile(rb"\xff\xfe|\xfe\xff|\x00\x00\xfe\xff|\x00{1,3}[{\[ \t\r\n]|[{\[ \t\r\n]\x00")


def _top_level(head: bytes, path: Path) -> tuple[int, bool]:
    """Offset of the first byte of the JSON value and whether it is an array."""
    if _WIDE_TEXT.match(head):
        raise InputError(path, "UTF-16 or UTF-32 text: JSON traces are read as UTF-8 (re-encode it, e.g. iconv)")
    m = _NON_WS.search(head)
    i = m.start() if m else len(head)
    if head.startswith(b"\xef\xbb\xbf", i):
        m = _NON_WS.search(head, i + 3)
        i = m.start() if m else len(head)
    c = head[i : i + 1]
    if c == b"[":
        return i, True
    if c != b"{":
        raise InputError(path, "not JSON: does not start with '{' or '['")
    return i, False


def _find_events_key(head: bytes, first: int, path: Path) -> int:
    """Offset of the '[' of the top-level ``"traceEvents"`` value in ``head`` (-1: read
    more).  A real scan of the structure up to each candidate: the key must be a string
    that opens at depth 1 (not a name inside an event, not text inside another string)."""
    sc = Scanner()
    done = first
    k = head.find(_EVENTS_KEY, first)
    while k >= 0:
        blk = sc.scan(head[done:k])
        if len(blk.depth) and int(blk.depth.min()) <= 0:
            raise InputError(path, "no traceEvents array: not a Chrome/Kineto trace")
        done = k
        if not sc.in_string and not sc.odd_backslashes and sc.depth == 1:
            i = _skip_ws(head, k + len(_EVENTS_KEY))
            if i < len(head) and head[i : i + 1] == b":":
                i = _skip_ws(head, i + 1)
                if i >= len(head):
                    return -1
                if head[i : i + 1] != b"[":
                    raise InputError(path, "traceEvents is not an array")
                return i
        k = head.find(_EVENTS_KEY, k + 1)
    blk = sc.scan(head[done:])
    if len(blk.depth) and int(blk.depth.min()) <= 0:
        raise InputError(path, "no traceEvents array: not a Chrome/Kineto trace")
    return -1


def _skip_ws(b: bytes, i: int) -> int:
    while i < len(b) and b[i] in b" \t\r\n":
        i += 1
    return i


def _parse_header(head: bytes, first: int, start: int, path: Path) -> dict[str, Any]:
    """The members before ``"traceEvents":`` as a dict."""
    body = head[first + 1 : head.rfind(_EVENTS_KEY, first, start)].strip()
    if not body:
        return {}
    if not body.endswith(b","):
        raise InputError(path, "malformed JSON before the traceEvents array")
    return _loads_object(b"{" + body[:-1] + b"}", path, "before")


def _parse_trailer(tail: bytes, bare: bool, path: Path) -> dict[str, Any]:
    """The members after the array's ']' (a bare array: nothing may follow)."""
    t = tail.strip()
    if bare:
        if t:
            raise InputError(path, "data after the top-level event array")
        return {}
    if t == b"}":
        return {}
    if not t.startswith(b","):
        raise InputError(path, "truncated or malformed JSON after the traceEvents array")
    meta = _loads_object(b"{" + t[1:], path, "after")
    if "traceEvents" in meta:
        raise InputError(path, "traceEvents appears twice")
    return meta


def _loads_object(text: bytes, path: Path, where: str) -> dict[str, Any]:
    try:
        meta = orjson.loads(text)
    except orjson.JSONDecodeError:
        raise InputError(path, f"malformed JSON {where} the traceEvents array") from None
    if not isinstance(meta, dict):
        raise InputError(path, f"malformed JSON {where} the traceEvents array")
    return meta


def _read_head(src: BinaryIO, path: Path) -> tuple[bytes, int, int, bool]:
    """Read until the event array starts: (bytes read, value start, '[' offset, bare)."""
    head = b""
    while True:
        block = src.read(CHUNK)
        head += block
        if not _NON_WS.search(head):
            if not block:
                raise InputError(path, "empty file")
            continue
        first, bare = _top_level(head, path)
        start = first if bare else _find_events_key(head, first, path)
        if start >= 0:
            return head, first, start, bare
        if not block or len(head) >= HEAD_LIMIT:
            raise InputError(path, "no traceEvents array found: not a Chrome/Kineto trace")


def _copy_array(src: BinaryIO, out: BinaryIO, head: bytes, start: int, bare: bool, path: Path,
                progress: Callable[[int], None] | None) -> tuple[bytes | None, int]:
    """Write the event array (its '[' to its ']') to ``out``; return what follows it
    (at most ``TRAILER_LIMIT`` bytes) and the number of bytes read in all."""
    end = ArrayEnd(1 if bare else 2)
    out.write(b"[")
    block: bytes = head[start + 1 :]
    done = 0  # bytes of the array fed before ``block``
    total = len(head)
    last = (b"[", 1)  # the last non-blank byte written and the offset after it
    if progress:
        progress(total)
    while block:
        _no_nul(block, total - len(block) if done else start + 1, path)
        pos = end.feed(block)
        if pos >= 0:
            cut = pos - done + 1
            out.write(block[:cut])
            return _read_trailer(src, block[cut:], total, progress)
        out.write(block)
        kept = block.rstrip(b" \t\r\n")
        if kept:
            last = (kept[-1:], out.tell() - (len(block) - len(kept)))
        done += len(block)
        block = src.read(CHUNK)
        total += len(block)
        _check_expansion(src, total, path)
        if progress and block:
            progress(len(block))
    if bare and not end.pending and not end.in_string and end.depth == 1 and last[0] in (b"[", b"}", b","):
        # Chrome's JSON Array Format may end without its ']' (a writer that streams events and
        # stops, or is stopped): after the last whole event, a trailing comma dropped
        if last[0] == b",":
            out.seek(last[1] - 1)
            out.truncate()
        out.write(b"]")
        return b"", total
    raise InputError(path, "truncated: the traceEvents array is never closed")


def _no_nul(block: bytes, offset: int, path: Path) -> None:
    """JSON text holds no NUL byte (not even inside a string): a file zero-filled past a crash,
    a sparse file, UTF-16 is refused at its first one, before gigabytes of it are staged."""
    i = block.find(b"\x00")
    if i >= 0:
        raise InputError(path, f"a NUL byte at byte {offset + i} of the JSON text: not JSON (a file zero-filled "
                               "past a crash? UTF-16?)")


def _check_expansion(src: BinaryIO, total: int, path: Path | None) -> None:
    """Refuse a gzip stream that expands like a decompression bomb (see BOMB_RATIO)."""
    raw = getattr(src, "fileobj", None)
    if raw is None or total < BOMB_MIN_BYTES:
        return
    read = max(raw.tell(), 1)
    if total > BOMB_RATIO * read:
        raise InputError(path or Path(getattr(raw, "name", "trace")),
                         f"gzip data expands more than {BOMB_RATIO}x ({total >> 20} MiB from {read >> 10} KiB):"
                         " refused as a decompression bomb")


def _read_trailer(src: BinaryIO, first: bytes, total: int,
                  progress: Callable[[int], None] | None) -> tuple[bytes | None, int]:
    """The rest of the stream after the array (None: more than ``TRAILER_LIMIT``
    bytes, which are only counted)."""
    parts, kept = [first], len(first)
    while True:
        block = src.read(CHUNK)
        if not block:
            break
        total += len(block)
        _check_expansion(src, total, None)
        if progress:
            progress(len(block))
        if kept < TRAILER_LIMIT:
            parts.append(block)
            kept += len(block)
    return (b"".join(parts) if kept <= TRAILER_LIMIT else None), total


def stage_events(
    path: Path, dest: Path, progress: Callable[[int], None] | None = None
) -> dict[str, Any]:
    """Copy the event array of ``path`` to ``dest`` (a JSON array file) and return
    the trace's metadata (every top-level member but ``traceEvents``, before and after
    it, in any order).

    Raises InputError with a one-line reason for anything that is not a
    well-formed Chrome trace at this level (empty, not JSON, truncated, ...).
    """
    src = open_trace(path)
    try:
        try:
            head, first, start, bare = _read_head(src, path)
            meta = {} if bare else _parse_header(head, first, start, path)
            with open(dest, "wb") as out:
                tail, total = _copy_array(src, out, head, start, bare, path, progress)
        except (EOFError, zlib.error, gzip.BadGzipFile) as e:
            raise InputError(path, f"corrupt or truncated gzip data ({_one_line(e)})") from None
        except OSError as e:
            raise InputError(path, f"read error: {_one_line(e)}") from None
    finally:
        src.close()
    if tail is not None:
        meta.update(_parse_trailer(tail, bare, path))
    elif bare:
        raise InputError(path, "data after the top-level event array")
    meta["_bytes"] = total
    return meta


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:200] or type(e).__name__


def _copy_bytes(src_fd: int, dst_fd: int, start: int, end: int,
                progress: Callable[[int], None] | None = None) -> None:
    """Append ``src[start:end]`` to ``dst`` (at its file offset) inside the kernel:
    copy_file_range moves no bytes through Python, ~5x faster than read/write."""
    offset = start
    while offset < end:
        n = os.copy_file_range(src_fd, dst_fd, min(end - offset, 1 << 26), offset)
        if n == 0:
            break
        offset += n
        if progress:
            progress(n)


# Kineto writes one event per block: "  {\n ... \n  }," -- a raw newline never occurs
# inside a JSON string, so this byte pattern only appears between top-level events.
_KINETO_BOUNDARY = b"\n  },\n  {"
SPLIT_MIN_BYTES = 64 << 20


def split_staged(path: Path, parts: int) -> list[Path]:
    """Cut a staged event array into ``parts`` arrays at event boundaries so DuckDB
    parses them in parallel (it reads one JSON file on one thread).  The first
    part is ``path`` itself, truncated; the others are copied out with
    copy_file_range.  Returns [path] when the file is small or not in Kineto's layout."""
    size = os.path.getsize(path)
    if parts < 2 or size < SPLIT_MIN_BYTES or not hasattr(os, "copy_file_range"):
        return [path]
    with open(path, "rb") as f:
        cuts = _cuts(lambda off, n: os.pread(f.fileno(), n, off), size, parts)
    if cuts is None:
        return [path]
    out = [path]
    pieces = []
    try:
        with open(path, "r+b") as f:
            for n, cut in enumerate(reversed(cuts)):  # from the end, so each cut is still valid
                piece = path.with_name(f"{path.stem}.part{len(cuts) - n}.json")
                first = cut + len(_KINETO_BOUNDARY) - 1  # the '{' of the next event
                end = os.path.getsize(path)
                with open(piece, "wb") as g:
                    g.write(b"[")
                    g.flush()  # before copy_file_range writes at the descriptor's offset
                    _copy_bytes(f.fileno(), g.fileno(), first, end)
                f.truncate(cut + 4)  # keep "\n  }"
                f.seek(0, os.SEEK_END)
                f.write(b"]")
                f.flush()  # the next (earlier) cut measures the file's size
                pieces.append(piece)
    except OSError:
        for p in pieces:
            p.unlink(missing_ok=True)
        raise
    return out + list(reversed(pieces))


def _cuts(read: Callable[[int, int], bytes], size: int, parts: int) -> list[int] | None:
    """Offsets (in a staged array of ``size`` bytes, read through ``read(offset, n)``) of
    the event boundaries that cut it into ``parts`` (None: no boundary near a cut)."""
    cuts = []
    for k in range(1, parts):
        at = size * k // parts
        i = read(at, min(4 << 20, size - at)).find(_KINETO_BOUNDARY)
        if i < 0:
            return None
        cuts.append(at + i)
    return cuts


TAIL_WINDOW = 4 << 20  # the end of a plain trace read to find where its event array closes


def stage_plain(path: Path, dest: Path, parts: int,
                progress: Callable[[int], None] | None = None) -> tuple[dict[str, Any], list[Path]] | None:
    """Stage a big uncompressed trace in Kineto's layout without reading its events: the
    parts :func:`split_staged` would cut from :func:`stage_events`' copy, byte for byte,
    copied inside the kernel (copy_file_range).  None: not such a trace (gzip, small, no
    Kineto boundary near the end or a cut, the array does not close in the last
    ``TAIL_WINDOW`` bytes, a malformed head or trailer); the caller stages exactly.

    Where the array closes is found by an exact scan from the last event boundary in the
    tail, assumed to lie between two events of the array.  Whether it does is proven by
    the parse: the staged bytes form one valid JSON array (DuckDB rejects anything else,
    content after the closing bracket included) only if the bracket found closes the
    array that ``traceEvents`` opens.  A caller whose parse fails stages exactly and
    parses again, so errors are those of the exact path."""
    if parts < 2 or not hasattr(os, "copy_file_range"):
        return None
    try:
        with open(path, "rb") as src:
            size = os.fstat(src.fileno()).st_size
            if size < SPLIT_MIN_BYTES or src.read(2) == b"\x1f\x8b":
                return None
            src.seek(0)
            head, first, start, bare = _read_head(src, path)
            close = _close_from_tail(src.fileno(), size, start, bare)
            if close is None:
                return None
            meta = {} if bare else _parse_header(head, first, start, path)
            meta.update(_parse_trailer(os.pread(src.fileno(), size - close - 1, close + 1), bare, path))
            copied = [0]

            def count(n: int) -> None:
                copied[0] += n
                if progress:
                    progress(n)

            files = _write_parts(src.fileno(), start, close + 1, dest, parts, count)
    except (InputError, OSError):
        return None
    if files is None:
        return None
    if progress:
        progress(size - copied[0])  # the bytes around the copied parts: all of the file in all
    meta["_bytes"] = size
    return meta, files


def _close_from_tail(fd: int, size: int, start: int, bare: bool) -> int | None:
    """Offset of the ']' that closes the event array, scanned from the last Kineto event
    boundary within the file's last ``TAIL_WINDOW`` bytes (None: none found)."""
    lo = max(start + 1, size - TAIL_WINDOW)
    tail = os.pread(fd, size - lo, lo)
    j = tail.rfind(_KINETO_BOUNDARY)
    if j < 0:
        return None
    after = j + 4  # just past the '}' that ends an event ("\n  }")
    end = ArrayEnd(1 if bare else 2)
    pos = end.feed(tail[after:])
    return lo + after + pos if pos >= 0 else None


def _write_parts(fd: int, start: int, stop: int, dest: Path, parts: int,
                 progress: Callable[[int], None] | None) -> list[Path] | None:
    """Write the array ``src[start:stop]`` as :func:`split_staged`'s parts of it."""
    size = stop - start
    cuts = _cuts(lambda off, n: os.pread(fd, n, start + off), size, parts)
    if cuts is None:
        return None
    bounds = [0, *[c + len(_KINETO_BOUNDARY) - 1 for c in cuts]]
    ends = [*[c + 4 for c in cuts], size]
    files = [dest] + [dest.with_name(f"{dest.stem}.part{k}.json") for k in range(1, len(bounds))]
    for k, (lo, hi, out) in enumerate(zip(bounds, ends, files)):
        with open(out, "wb") as g:
            if k:
                g.write(b"[")
                g.flush()  # before copy_file_range writes at the descriptor's offset
            _copy_bytes(fd, g.fileno(), start + lo, start + hi, progress)
            if k < len(files) - 1:
                g.write(b"]")
    return files
