"""Find the event array inside a Chrome-trace JSON file and stage it for DuckDB.

A Kineto trace is one JSON object; its ``traceEvents`` array holds nearly all of
its bytes, with small metadata before and after it.  We copy exactly that array
(decompressing ``.gz`` on the way) into a temporary file that DuckDB's JSON
reader then parses in parallel, in C++, straight into columns.  The metadata
around it is parsed with orjson.  Nothing here holds the trace in memory.
"""

from __future__ import annotations

import gzip
import os
import shutil
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from pastaprof.errors import InputError

CHUNK = 8 << 20
HEAD_LIMIT = 64 << 20
TAIL_WINDOW = 1 << 20


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
    magic = f.read(2)
    f.seek(0)
    if magic == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=f, mode="rb")  # type: ignore[return-value]
    return f


def _find_array_start(head: bytes) -> tuple[int, bool]:
    """Offset of the '[' that opens the event array (-1: read more) and whether the
    file is a bare array (Chrome's "JSON array format").  Scans JSON tokens only
    until the array starts; the metadata before it is small."""
    i = 0
    n = len(head)
    while i < n and head[i] in b" \t\r\n":
        i += 1
    if head.startswith(b"\xef\xbb\xbf", i):
        i += 3
    if i >= n:
        raise ValueError("empty file")
    if head[i : i + 1] == b"[":
        return i, True
    if head[i : i + 1] != b"{":
        raise ValueError("not JSON: does not start with '{' or '['")
    depth = 0
    in_str = False
    key_start = -1
    last_key = None
    j = i
    while j < n:
        c = head[j]
        if in_str:
            if c == 0x5C:  # backslash
                j += 2
                continue
            if c == 0x22:
                in_str = False
                if depth == 1:
                    last_key = head[key_start:j]
            j += 1
            continue
        if c == 0x22:
            in_str = True
            key_start = j + 1
        elif c in b"{[":
            if c == 0x5B and depth == 1 and last_key == b"traceEvents":
                return j, False
            depth += 1
        elif c in b"}]":
            depth -= 1
            if depth == 0:
                raise ValueError("no traceEvents array: not a Chrome/Kineto trace")
        elif c == 0x2C and depth == 1:
            last_key = None
        j += 1
    return -1, False  # need more bytes


def _parse_header(prefix: bytes) -> dict[str, Any]:
    """The metadata before ``"traceEvents":`` as a dict (best effort)."""
    text = prefix.rstrip()
    k = text.rfind(b'"traceEvents"')
    if k < 0:
        return {}
    body = text[:k].rstrip().rstrip(b",") + b"}"
    try:
        meta = orjson.loads(body)
    except orjson.JSONDecodeError:
        return {}
    return meta if isinstance(meta, dict) else {}


def _close_array(tail: bytes, bare: bool) -> tuple[int, dict[str, Any]]:
    """Position (in ``tail``) of the ']' that closes the event array, and the
    metadata that follows it.  Tries candidates from the end; a wrong one cannot
    parse, because what follows it is then not the rest of a JSON object."""
    pos = len(tail)
    while True:
        pos = tail.rfind(b"]", 0, pos)
        if pos < 0:
            raise ValueError("truncated: the traceEvents array is never closed")
        rest = tail[pos + 1 :].strip()
        if bare:
            if not rest:
                return pos, {}
            continue
        rest = rest.lstrip(b",").lstrip()
        try:
            meta = orjson.loads(b"{" + rest) if rest != b"}" else {}
        except orjson.JSONDecodeError:
            continue
        if isinstance(meta, dict):
            return pos, meta


class _Counting:
    """A reader that reports how many bytes went through it (for the progress bar)."""

    def __init__(self, f: BinaryIO, progress: Callable[[int], None] | None) -> None:
        self.f, self.progress = f, progress

    def read(self, n: int = -1) -> bytes:
        block = self.f.read(n)
        if self.progress and block:
            self.progress(len(block))
        return block


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


def _copy_range(src: BinaryIO, out: BinaryIO, start: int, progress: Callable[[int], None] | None) -> bool:
    """Copy ``src[start:]`` to ``out`` with copy_file_range.  False if unsupported."""
    if not hasattr(os, "copy_file_range"):
        return False
    try:
        _copy_bytes(src.fileno(), out.fileno(), start, os.fstat(src.fileno()).st_size, progress)
        return True
    except OSError:
        out.seek(0)
        out.truncate()
        return False


def stage_events(
    path: Path, dest: Path, progress: Callable[[int], None] | None = None
) -> dict[str, Any]:
    """Copy the event array of ``path`` to ``dest`` (a JSON array file) and return
    the trace's metadata (everything but ``traceEvents``).

    Raises InputError with a one-line reason for anything that is not a
    well-formed Chrome trace at this level (empty, not JSON, truncated, ...).
    """
    src = open_trace(path)
    try:
        try:
            head = b""
            start = -1
            while start < 0:
                block = src.read(CHUNK)
                head += block
                if not head.strip():
                    raise InputError(path, "empty file")
                try:
                    start, bare = _find_array_start(head)
                except ValueError as e:
                    raise InputError(path, str(e)) from None
                if start < 0 and (not block or len(head) >= HEAD_LIMIT):
                    raise InputError(path, "no traceEvents array found: not a Chrome/Kineto trace")
            meta = {} if bare else _parse_header(head[:start])
            with open(dest, "wb") as out:
                if isinstance(src, gzip.GzipFile) or not _copy_range(src, out, start, progress):
                    out.write(head[start:])
                    if progress:
                        progress(len(head))
                    shutil.copyfileobj(_Counting(src, progress), out, CHUNK)
            copied = os.path.getsize(dest) + start
        except (EOFError, zlib.error, gzip.BadGzipFile) as e:
            raise InputError(path, f"corrupt or truncated gzip data ({e})") from None
        except OSError as e:
            raise InputError(path, f"read error: {e}") from None
    finally:
        src.close()
    size = os.path.getsize(dest)
    with open(dest, "r+b") as f:
        off = max(0, size - TAIL_WINDOW)
        f.seek(off)
        tail = f.read()
        try:
            pos, trailer = _close_array(tail, bare)
        except ValueError as e:
            raise InputError(path, str(e)) from None
        f.truncate(off + pos + 1)
    meta.update(trailer)
    meta["_bytes"] = copied
    return meta


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
    cuts = []
    with open(path, "rb") as f:
        for k in range(1, parts):
            f.seek(size * k // parts)
            window = f.read(4 << 20)
            i = window.find(_KINETO_BOUNDARY)
            if i < 0:
                return [path]
            cuts.append(size * k // parts + i)
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
