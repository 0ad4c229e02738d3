"""PyTorch memory snapshots (``torch.cuda.memory._dump_snapshot()`` pickles) as events.

A snapshot is a pickle, and loading a pickle can run any code it names (CWE-502).
This importer never does: :class:`SafeUnpickler` refuses EVERY class and global
(``find_class``) and every persistent id, so only what the pickle opcodes build
themselves comes out -- dicts, lists, tuples, str, bytes, int, float, bool, None.
That is all a real snapshot holds; anything else is one clear error line.

What is mapped (one rank, one process; device ``i`` is ``device_traces[i]``):

* ``tensor`` (caching-allocator blocks): one event per ``alloc`` (+block size: the
  request rounded as the allocator rounds it, ``block_size``) and per
  ``free_requested`` (-block size: where the allocator's ``allocated_bytes``, i.e.
  ``torch.cuda.memory_allocated()``, drops; ``free_completed`` only says the block is
  reusable, after the streams that used it are done), ``total_allocated`` and
  ``total_reserved`` rebuilt backwards from the segments' state at the dump, so the
  memory tool's replay and its "before the trace" offset are exact even when the
  history ring buffer (``max_entries``) dropped the start;
* ``alloc`` / ``free`` (``memory_kind`` device): ``segment_alloc`` / ``segment_free``
  (the allocator's cudaMalloc / cudaFree);
* ``op`` + ``frame``: every trace entry with a stack gets a one-tick op named by
  its innermost Python frame, inside nested frames (outermost first), so the linker
  gives it the call site (innermost frame outside torch) the memory tool names;
* ``range``: record_function annotations (``external_annotations``), domain ``user``,
  and each ``oom`` entry (domain ``oom``, name saying what was asked and what was free).

Times: ``time_us`` (the allocator's microsecond wall clock) in ns; entries that share
a microsecond are spread by at most a few hundred ns to keep their order and their
frame nests apart.  Dropped: ``snapshot`` / ``annotate`` actions, block-level state
the trace does not show (``requested_size``, pool ids), C++ frames beyond the first
``MAX_FRAMES`` of a stack.
"""

from __future__ import annotations

import io
import os
import pickle
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from pastaprof.errors import InputError
from pastaprof.importers.base import LIKELY, STRONG, Claim, Importer, Note, Progress, RankTables

MAX_BYTES = 1 << 30      # larger snapshots: refused (one line) rather than loaded into memory
MAX_FRAMES = 24          # innermost frames kept per stack
SNIFF_BYTES = 4096
TICK = 2 * MAX_FRAMES + 4  # ns between two entries of one microsecond: room for one frame nest each
KEYS = (b"segments", b"device_traces")
FREE_ACTIONS = ("free_requested",)
LIBRARY_PARTS = ("/torch/", "/site-packages/", "/dist-packages/", "/pastaprof/")


class SafeUnpickler(pickle.Unpickler):
    """Loads plain data only: every global (a class, a function) and every persistent
    id is refused, so nothing in the file is imported or called."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"it asks to load {_short(module)}.{_short(name)}; a memory snapshot "
                                     "holds only plain data, so nothing in it was loaded or run")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("it holds a persistent id; a memory snapshot holds only plain data")


def _short(s: Any, n: int = 60) -> str:
    text = "".join(ch if ch.isprintable() else "?" for ch in str(s))
    return text if len(text) <= n else text[: n - 3] + "..."


def safe_load(path: Path) -> Any:
    """The pickle at ``path`` loaded with :class:`SafeUnpickler`; one InputError line
    for anything else (a class in it, truncation, junk, too large)."""
    try:
        size = os.stat(path).st_size
        if size > MAX_BYTES:
            raise InputError(path, f"is {size >> 20} MiB; memory snapshots over {MAX_BYTES >> 20} MiB are not read")
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise InputError(path, f"cannot be read ({e.strerror or e})") from None
    if not _survives_loading(data):
        raise InputError(path, "is refused as a memory snapshot: loading it crashes Python (a structure nested "
                               "far deeper than a snapshot's?)")
    # a failed huge length claim prints "SystemError: deallocated bytearray..." through sys.stderr
    hook, err, sys.unraisablehook, sys.stderr = sys.unraisablehook, sys.stderr, lambda _: None, io.StringIO()
    try:
        return SafeUnpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError as e:
        raise InputError(path, f"is refused as a memory snapshot: {_short(e, 200)}") from None
    except (EOFError, ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError,
            MemoryError, RecursionError, UnicodeDecodeError, SystemError) as e:
        why = "it ends early" if isinstance(e, EOFError) else _short(f"{type(e).__name__}: {e}", 120)
        raise InputError(path, f"is not a readable pickle ({why})") from None
    finally:
        sys.unraisablehook, sys.stderr = hook, err


def _survives_loading(data: bytes) -> bool:
    """Whether unpickling ``data`` ends, tried first in a forked child: a pickle can crash the
    interpreter in C, where no exception is raised (a tuple nested 200,000 deep, hashed as a
    dict key, overflows the C stack).  The child only unpickles; a C unpickle is quick."""
    if not hasattr(os, "fork"):
        return True
    pid = os.fork()
    if pid == 0:  # pragma: no cover -- the child
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)  # its own messages are the parent's to give
        try:
            SafeUnpickler(io.BytesIO(data)).load()
        except BaseException:  # noqa: BLE001 -- the parent's load reports it, in one line
            pass
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.WIFEXITED(status)


def _text(v: Any, n: int) -> str:
    """A snapshot's text field: a string (lone surrogates replaced: Arrow takes only UTF-8) or a
    number, at most ``n`` characters; anything else reads as empty (str() of a list nested
    100,000 deep raised RecursionError)."""
    if isinstance(v, str):
        v = v[:n]
        return v.encode("utf-8", "replace").decode("utf-8") if not v.isascii() else v
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return str(v)[:n]
    return ""


def _pickle_head(path: Path) -> bytes | None:
    try:
        with open(path, "rb") as f:
            head = f.read(SNIFF_BYTES)
    except OSError:
        return None
    return head if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5 else None


class MemorySnapshotImporter(Importer):
    name = "memory_snapshot"
    description = "PyTorch CUDA memory snapshots (torch.cuda.memory._dump_snapshot pickles), loaded without running code"
    formats = ("memory_snapshot",)
    looks_for = ".pickle PyTorch memory snapshots"

    def sniff(self, path: Path) -> Claim | None:
        if path.is_dir():
            return None
        head = _pickle_head(path)
        if head is None or KEYS[0] not in head:
            return None
        score = STRONG if all(k in head for k in KEYS) else LIKELY
        return Claim(self.name, "memory_snapshot", score, f"pickle protocol {head[1]}",
                     f"a PyTorch memory snapshot (pickle protocol {head[1]})")

    def import_ranks(self, path: Path, ranks: list[int] | None = None, *, progress: Progress | None = None,
                     kinds: set[str] | None = None, note: Note | None = None) -> Iterator[RankTables]:
        snap = safe_load(path)
        tables, meta = snapshot_tables(snap, path)
        if progress is not None:
            progress(meta["bytes"])
        if ranks is not None and 0 not in ranks:
            return
        yield 0, tables, meta
        if note is not None:
            for line in meta["notes"]:
                note(line)

    def manifest_fields(self, path: Path, metas: list[dict[str, Any]]) -> dict[str, Any]:
        m = metas[0] if metas else {}
        return {"source": str(path), "format": "memory_snapshot", "format_version": m.get("format_version"),
                "command": None, "host": None, "devices": m.get("devices", []),
                "versions": {"memory_snapshot": m.get("format_version")},
                "ranks": sorted({x["rank"] for x in metas}), "rank_source": {},
                "notes": list(m.get("notes", [])), "skipped": {},
                "clock": {"domain": "unix_epoch_ns", "source": "the allocator's time_us"},
                "capture_overhead": None, "dropped_events": None, "category_counts": {},
                "unknown_categories": {}, "trace_bytes": sum(x.get("bytes", 0) for x in metas),
                "snapshot": {k: m[k] for k in ("trace_entries", "actions", "ooms", "segments") if k in m}}


# ---------------------------------------------------------------- mapping
def _int(v: Any, default: int = 0) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return default
    try:
        x = int(v)
    except (OverflowError, ValueError):
        return default
    return x if -(1 << 63) <= x < (1 << 63) else default


def _list(v: Any) -> list:
    return v if isinstance(v, (list, tuple)) else []


def _frames(v: Any) -> list[tuple[str, int, str]]:
    """(file, line, function) innermost first, at most MAX_FRAMES; junk entries skipped."""
    out = []
    for f in _list(v)[:MAX_FRAMES]:
        if isinstance(f, dict):
            line = _int(f.get("line"), 0)
            out.append((_text(f.get("filename"), 500), line if 0 <= line < 1 << 31 else 0, _text(f.get("name"), 200)))
    return out


def _check(snap: Any, path: Path) -> tuple[list, list]:
    if not isinstance(snap, dict):
        raise InputError(path, f"is a pickle of a {type(snap).__name__}, not a memory snapshot (a dict with segments)")
    if "segments" not in snap and "device_traces" not in snap:
        keys = ", ".join(_short(k, 20) for k in list(snap)[:5])
        raise InputError(path, f"is a pickle of a dict without segments or device_traces ({keys}): not a memory snapshot")
    segs, traces = snap.get("segments", []), snap.get("device_traces", [])
    if not isinstance(segs, (list, tuple)) or not isinstance(traces, (list, tuple)):
        raise InputError(path, "has segments or device_traces that are not lists: not a memory snapshot")
    return list(segs), list(traces)


def _end_state(segs: list) -> tuple[dict[int, int], dict[int, int], int]:
    """Per device: bytes allocated (blocks in use, not awaiting free) and reserved (segments) at the dump."""
    alloc: dict[int, int] = {}
    reserved: dict[int, int] = {}
    n = 0
    for s in segs:
        if not isinstance(s, dict):
            continue
        n += 1
        d = _int(s.get("device"), 0)
        reserved[d] = reserved.get(d, 0) + max(_int(s.get("total_size")), 0)
        for b in _list(s.get("blocks")):
            if isinstance(b, dict) and b.get("state") == "active_allocated":  # awaiting_free: freed already
                alloc[d] = alloc.get(d, 0) + max(_int(b.get("size")), 0)
    return alloc, reserved, n


class _Cols:
    """Column lists of one kind (plain Python lists, turned into Arrow once)."""

    def __init__(self, *names: str) -> None:
        self.c: dict[str, list] = {n: [] for n in names}

    def add(self, **kw: Any) -> None:
        for k, v in kw.items():
            self.c[k].append(v)

    def table(self, types: dict[str, pa.DataType]) -> pa.Table:
        return pa.table({k: pa.array(v, types.get(k, pa.int64())) for k, v in self.c.items()})


MIN_BLOCK = 512  # the CUDA caching allocator's kMinBlockSize
_INTERVALS = 16  # roundup_power2_divisions: one setting per power of two from 1 MiB (the last for the rest)


def _roundup_divisions(snap: Any) -> list[int]:
    """``allocator_settings.roundup_power2_divisions`` (PYTORCH_CUDA_ALLOC_CONF), 0 where unset."""
    settings = snap.get("allocator_settings") if isinstance(snap, dict) else None
    given = settings.get("roundup_power2_divisions") if isinstance(settings, dict) else None
    out = [0] * _INTERVALS
    if isinstance(given, dict):
        for k, v in given.items():
            mb = int(k) if isinstance(k, str) and k.isascii() and k.isdigit() and len(k) < 8 else _int(k, -1)  # keys are MiB as text
            n = _int(v, 0)
            if mb > 0 and mb & (mb - 1) == 0 and mb.bit_length() - 1 < _INTERVALS and 0 <= n <= 1 << 20:
                out[mb.bit_length() - 1] = n
    return out


def block_size(size: int, divisions: list[int]) -> int:
    """The block the caching allocator hands out for a request of ``size`` bytes (its
    ``round_size``): what ``memory_allocated()`` counts, where a trace entry says the request
    (two 4-byte tensors are 1,024 bytes of blocks)."""
    if size < MIN_BLOCK:
        return MIN_BLOCK
    mb_log = (size >> 20).bit_length() - 1  # -1 below 1 MiB: the allocator's index wraps to the last
    n = divisions[mb_log if 0 <= mb_log < _INTERVALS else _INTERVALS - 1]
    if n > 1 and size > MIN_BLOCK * n:
        if size & (size - 1) == 0:
            return size
        floor = 1 << (size.bit_length() - 1)
        step = floor >> (n.bit_length() - 1)
        if step == 0:
            return floor << 1
        low = size & ~(step - 1)
        return size if low == size else low + step
    return MIN_BLOCK * ((size + MIN_BLOCK - 1) // MIN_BLOCK)


def snapshot_tables(snap: Any, path: Path) -> tuple[dict[str, pa.Table], dict[str, Any]]:
    """Raw tables (see module docstring) and metadata of one loaded snapshot."""
    segs, traces = _check(snap, path)
    divisions = _roundup_divisions(snap)
    end_alloc, end_reserved, nseg = _end_state(segs)
    tensor = _Cols("start_ns", "device", "address", "bytes", "total_allocated", "total_reserved")
    seg = {"alloc": _Cols("start_ns", "device", "address", "bytes"), "free": _Cols("start_ns", "device", "address", "bytes")}
    op = _Cols("start_ns", "end_ns", "name")
    frame = _Cols("start_ns", "end_ns", "name", "file", "line", "function")
    rng = _Cols("start_ns", "end_ns", "name", "domain", "device")
    actions: dict[str, int] = {}
    ooms: list[dict[str, Any]] = []
    last = -(1 << 62)
    entries = 0
    for dev, trace in enumerate(traces):
        trace = _list(trace)
        dev_tensor_start = len(tensor.c["bytes"])
        for e in trace:
            if not isinstance(e, dict):
                continue
            entries += 1
            action = _text(e.get("action"), 40)
            actions[action] = actions.get(action, 0) + 1
            t = max(_int(e.get("time_us"), 0) * 1000, last + TICK)
            last = t
            size, addr = max(_int(e.get("size")), 0), _int(e.get("addr"), 0) & ((1 << 64) - 1)
            if action == "alloc" or action in FREE_ACTIONS:
                block = block_size(size, divisions)  # the trace says what was asked; the allocator counts blocks
                tensor.add(start_ns=t, device=dev, address=addr, bytes=block if action == "alloc" else -block,
                           total_allocated=None, total_reserved=None)
            elif action in ("segment_alloc", "segment_free"):
                seg["alloc" if action == "segment_alloc" else "free"].add(start_ns=t, device=dev, address=addr, bytes=size)
            elif action == "oom":
                free = _int(e.get("device_free"), -1)
                ooms.append({"device": dev, "time_ns": t, "requested_bytes": size, "device_free_bytes": free})
                rng.add(start_ns=t, end_ns=t, name=f"OOM: cuda:{dev} asked for {_fmt(size)}, "
                        f"{_fmt(free) if free >= 0 else 'unknown'} free", domain="oom", device=dev)
            else:
                continue
            if action in ("alloc", "oom") or action in FREE_ACTIONS:
                _stack(op, frame, t, _frames(e.get("frames")))
        _totals(tensor, dev_tensor_start, end_alloc.get(dev, 0), seg, dev, end_reserved.get(dev, 0))
    _annotations(rng, snap.get("external_annotations"))
    n = len(tensor.c["bytes"])
    common = {"rank": 0, "pid": 0, "tid": 0}
    tables = {
        "tensor": _with(tensor.table({"address": pa.uint64()}), common | {"device_type": "cuda", "name": "[memory]"},
                        end=True),
        "alloc": _with(seg["alloc"].table({"address": pa.uint64()}), common | {"memory_kind": "device", "name": "segment_alloc"}, end=True),
        "free": _with(seg["free"].table({"address": pa.uint64()}), common | {"memory_kind": "device", "name": "segment_free"}, end=True),
        "op": _with(op.table({"name": pa.string()}), common),
        "frame": _with(frame.table({"name": pa.string(), "file": pa.string(), "line": pa.int32(), "function": pa.string()}),
                       common | {"is_module": False}),
        "range": _with(rng.table({"name": pa.string(), "domain": pa.string(), "device": pa.int32()}), common),
    }
    notes = []
    if not n:
        notes.append(f"{path.name}: the snapshot holds no allocator history (record it with "
                     "torch.cuda.memory._record_memory_history() before the code of interest)")
    for o in ooms:
        notes.append(f"{path.name}: out of memory on cuda:{o['device']}: asked for {_fmt(o['requested_bytes'])} "
                     f"with {_fmt(o['device_free_bytes']) if o['device_free_bytes'] >= 0 else 'unknown'} free on the device")
    proto = _pickle_head(path)
    meta = {"rank": 0, "file": path.name, "bytes": _size(path), "format": "memory_snapshot",
            "format_version": f"pickle protocol {proto[1]}" if proto else None,
            "devices": [{"id": d, "name": f"cuda:{d}"} for d in range(len(traces))],
            "trace_entries": entries, "actions": actions, "ooms": ooms, "segments": nseg, "notes": notes}
    return tables, meta


def _stack(op: _Cols, frame: _Cols, t: int, frames: list[tuple[str, int, str]]) -> None:
    """A one-tick op at ``t`` named by its innermost Python frame, nested in its frames."""
    py = [f for f in frames if f[0].endswith(".py")]
    inner = py[0] if py else frames[0] if frames else None
    name = f"{Path(inner[0]).stem}.{inner[2]}" if inner and inner[0] else inner[2] if inner else ""
    op.add(start_ns=t, end_ns=t + 1, name=name or "<no stack>")
    k = len(frames)
    for depth, (file, line, func) in enumerate(reversed(frames)):  # outermost first
        pad = k - depth
        frame.add(start_ns=t - pad, end_ns=t + 1 + pad, name=f"{file}({line}): {func}", file=file, line=line,
                  function=func)


def _totals(tensor: _Cols, start: int, alloc_end: int, seg: dict[str, _Cols], dev: int, reserved_end: int) -> None:
    """Fill total_allocated / total_reserved of one device's tensor events, backwards from
    the state at the dump (the ring buffer may have dropped the trace's start)."""
    b = np.asarray(tensor.c["bytes"][start:], dtype=np.int64)
    if not len(b):
        return
    after = alloc_end - (np.cumsum(b[::-1])[::-1] - b)     # allocated just after each event
    t = np.asarray(tensor.c["start_ns"][start:], dtype=np.int64)
    st = np.asarray(seg["alloc"].c["start_ns"] + seg["free"].c["start_ns"], dtype=np.int64)
    sb = np.asarray(seg["alloc"].c["bytes"] + [-x for x in seg["free"].c["bytes"]], dtype=np.int64)
    sd = np.asarray(seg["alloc"].c["device"] + seg["free"].c["device"], dtype=np.int64)
    mine = sd == dev
    st, sb = st[mine], sb[mine]
    order = np.argsort(st, kind="stable")
    st, sb = st[order], sb[order]
    later = np.concatenate([np.cumsum(sb[::-1])[::-1], [0]])  # segment bytes at or after each index
    reserved = reserved_end - later[np.searchsorted(st, t, side="right")]
    tensor.c["total_allocated"][start:] = [int(x) for x in after]
    tensor.c["total_reserved"][start:] = [int(x) for x in reserved]


def _annotations(rng: _Cols, ann: Any) -> None:
    """record_function START/END pairs (``external_annotations``) as user ranges."""
    open_: dict[tuple[Any, str], list[int]] = {}
    for a in _list(ann):
        if not isinstance(a, dict):
            continue
        name, stage = _text(a.get("name"), 300), _text(a.get("stage"), 20).upper()
        t = _int(a.get("time_us"), 0) * 1000
        key = (_int(a.get("device"), -1), name)  # a device that is no integer (a list, a deep tuple): none
        if stage == "START":
            open_.setdefault(key, []).append(t)
        elif stage == "END" and open_.get(key):
            s = open_[key].pop()
            rng.add(start_ns=s, end_ns=max(t, s), name=name, domain="user", device=None)


def _with(t: pa.Table, consts: dict[str, Any], end: bool = False) -> pa.Table:
    """Add constant columns (and end_ns = start_ns for instants)."""
    n = t.num_rows
    if end:
        t = t.append_column("end_ns", t["start_ns"])
    for k, v in consts.items():
        if k not in t.column_names:
            t = t.append_column(k, pa.array([v] * n))
    return t


def _size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _fmt(b: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(b) >= size:
            return f"{b / size:.1f} {unit}"
    return f"{b} B"
