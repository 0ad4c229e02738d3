"""Instruction-level tools on native programs: the sanitizer tool's chunks, replayed.

In a native program the Compute Sanitizer tool (native/sanitizer_tool.cpp) is started by the
injection library (native/inject_sanitizer.c), which writes what a Python session's
SanitizerHandler would drain -- the tool's tables, raw request addresses and new kernel names
-- as chunks to ``rank-R-pid-P.san``.  Here each chunk is handed to the Python handler's own
``drain()`` through a stand-in for its ctypes library, so a native program's ``access_*``
tables are made by the same code as a Python program's (GPU or CPU reduction, PC -> source
lines from the kept module images).
"""

from __future__ import annotations

import ctypes
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

MAGIC = 0x31484E4153505050  # "PPPSANH1", native/inject.h
TABLES = 7
T_RAW = 4
MAX_NAME = 4096


def launcher_env(env: dict[str, str], config: Any, consumed: set[str]) -> str | None:
    """The sanitizer tool for a native program, when a chosen tool consumes access_* events:
    built, and its settings put in ``env`` for the injection library.  None, or why not."""
    if not any(k.startswith("access_") for k in consumed):
        return None
    from pastaprof import native
    from pastaprof.handlers.sanitizer import INSTRUCTIONS, _env_int, pc_slots

    try:
        lib, patch = native.build_sanitizer()
    except (OSError, RuntimeError) as e:
        return f"instruction-level accesses of native programs not recorded: {e}"
    flags = sum(INSTRUCTIONS.values())
    if env.get("PASTAPROF_SAN_UNPATCH", "1").lower() in ("0", "false", "no", "off"):
        flags |= 32
    args = (2 if config.process == "cpu" else 1, int(np.log2(config.page_bytes)), pc_slots("access_pc" in consumed),
            _env_int("PASTAPROF_SAN_PAGES", 1 << 22), _env_int("PASTAPROF_SAN_RAW_MB", 1024) * (1 << 20) // 288,
            flags, _env_int("PASTAPROF_SAN_SHARDS", 16))
    env["PASTAPROF_NATIVE_SANITIZER"] = str(lib)
    env["PASTAPROF_NATIVE_SANITIZER_PATCH"] = str(patch)
    env["PASTAPROF_NATIVE_SANITIZER_ARGS"] = ",".join(map(str, args))
    return None


def read_chunks(path: Path, ncols: tuple[int, ...]) -> tuple[list[dict[str, Any]], str | None]:
    """The chunks of a .san file: tables (lists of columns), addresses, new names.  A chunk that
    does not add up (cut short, damaged) ends the reading; the chunks before it are kept."""
    try:
        data = b"" if path.is_symlink() else path.read_bytes()
    except OSError:
        return [], None
    out: list[dict[str, Any]] = []
    pos, head_words = 0, 4 + 2 * TABLES
    while pos + head_words * 8 <= len(data):
        head = np.frombuffer(data, "<i8", head_words, pos)
        if head[0] != MAGIC or head[1] != TABLES or tuple(head[4:4 + TABLES]) != tuple(ncols):
            return out, "a sanitizer chunk with another layout: the rest was not read"
        rows = head[4 + TABLES:]
        nnames, first = int(head[2]), int(head[3])
        size = int(sum(int(c) * int(r) for c, r in zip(ncols, rows))) * 8 + int(rows[T_RAW]) * 256
        if (rows < 0).any() or nnames < 0 or first < 0 or pos + head_words * 8 + size > len(data):
            return out, "the sanitizer file ends in a partial chunk (cut short): that chunk is left out"
        p = pos + head_words * 8
        tables = []
        for c, r in zip(ncols, rows):
            cols = {}
            for j in range(c):
                cols[j] = np.frombuffer(data, "<i8", int(r), p).copy() if r else np.zeros(0, np.int64)
                p += int(r) * 8
            tables.append(cols)
        addrs = np.frombuffer(data, "<u8", int(rows[T_RAW]) * 32, p).reshape(-1, 32).copy()
        p += int(rows[T_RAW]) * 256
        names = []
        for _ in range(nnames):
            pair = []
            for _ in range(2):
                if p + 4 > len(data):
                    return out, "the sanitizer file ends in a partial chunk (cut short): that chunk is left out"
                (n,) = struct.unpack_from("<i", data, p)
                if n < 0 or n > MAX_NAME or p + 4 + n > len(data):
                    return out, "the sanitizer file ends in a partial chunk (cut short): that chunk is left out"
                pair.append(data[p + 4:p + 4 + n].decode("utf-8", "replace"))
                p += 4 + n
            names.append(tuple(pair))
        out.append({"tables": tables, "addrs": addrs, "names": names, "first": first})
        pos = p
    return out, None


class _ReplayLib:
    """What SanitizerHandler.drain() and summary() call of the tool's ctypes library, answered
    from one chunk at a time and the process's header."""

    def __init__(self, meta: dict[str, Any]) -> None:
        san = meta.get("sanitizer") if isinstance(meta.get("sanitizer"), dict) else {}
        stats = san.get("stats") if isinstance(san.get("stats"), list) else []
        self._stats = [int(v) if isinstance(v, int) else -1 for v in stats]
        self._error = str(san.get("error") or "").encode()
        self._notes = [str(n).encode() for n in san.get("notes", []) if isinstance(n, str)] \
            if isinstance(san.get("notes"), list) else []
        self.raw: list[str] = []
        self.readable: dict[str, str] = {}
        self.chunk: dict[str, Any] | None = None

    def load(self, chunk: dict[str, Any]) -> None:
        if chunk["first"] == len(self.raw):  # names arrive in order; a gap keeps the ones known
            for raw, readable in chunk["names"]:
                self.raw.append(raw)
                self.readable[raw] = readable
        self.chunk = chunk

    def pp_san_take(self, ptr: Any) -> None:
        n = np.array([len(t[0]) if t else 0 for t in self.chunk["tables"]], np.int64)
        ctypes.memmove(ptr, n.ctypes.data, n.nbytes)

    def pp_san_copy(self, table: int, col: int, ptr: Any) -> None:
        a = np.ascontiguousarray(self.chunk["tables"][table][col], np.int64)
        ctypes.memmove(ptr, a.ctypes.data, a.nbytes)

    def pp_san_copy_addresses(self, ptr: Any) -> None:
        a = np.ascontiguousarray(self.chunk["addrs"], np.uint64)
        ctypes.memmove(ptr, a.ctypes.data, a.nbytes)

    def pp_san_name_count(self) -> int:
        return len(self.raw)

    def pp_san_name(self, i: int) -> bytes:
        return self.raw[i].encode() if 0 <= i < len(self.raw) else b""

    def pp_san_stat(self, i: int) -> int:
        return self._stats[i] if 0 <= i < len(self._stats) else -1

    def pp_san_error(self) -> bytes:
        return self._error

    def pp_san_notes(self) -> int:
        return len(self._notes)

    def pp_san_note(self, i: int) -> bytes:
        return self._notes[i]


def tables(base: Path, meta: dict[str, Any], config: Any, rank: int, pid: int
           ) -> tuple[dict[str, pa.Table], dict[str, Any] | None, str | None]:
    """A native process's access_* tables, its sanitizer summary (run.json) and a status line."""
    from pastaprof.events.schema import merge
    from pastaprof.handlers.sanitizer import NCOLS, SanitizerHandler

    path = base.with_suffix(".san")
    status = meta.get("sanitizer_status") if isinstance(meta.get("sanitizer_status"), str) else None
    if not os.path.exists(path) or config is None:
        return {}, None, (f"instruction-level accesses not recorded: {status}" if status else None)
    chunks, trouble = read_chunks(path, NCOLS)
    lib = _ReplayLib(meta)

    class Replayed(SanitizerHandler):
        def demangle(self, name: str) -> str:
            return lib.readable.get(name, name)

    h = Replayed(config, rank, base.parent.parent, per_pc=True)
    h.lib, h.pid = lib, pid
    parts: dict[str, list[pa.Table]] = {}
    for chunk in chunks:
        lib.load(chunk)
        try:  # the handler's drain trusts its library; these tables come from a file
            drained = h.drain()
        except Exception as e:  # noqa: BLE001 -- a damaged chunk is left out, with one line
            trouble = trouble or f"a sanitizer chunk could not be decoded ({type(e).__name__}): left out"
            continue
        for kind, t in drained.items():
            parts.setdefault(kind, []).append(t)
    out = {kind: merge(kind, ts) if len(ts) > 1 else ts[0] for kind, ts in parts.items()}
    # the copies the tool saw through its API callbacks: CUPTI's, with GPU times, are stored
    # instead, unless CUPTI could not be had beside the sanitizer (the library's note says so)
    if "CUPTI records not taken" not in str(meta.get("note", "")):
        out = {k: v for k, v in out.items() if k.startswith("access_")}
    return out, h.summary(), trouble
