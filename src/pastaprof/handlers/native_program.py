"""Native CUDA programs under ``pastaprof run``: the injection library's side in Python.

A program with no Python in it (``pastaprof run -- ./vecadd``, ``mpirun -np 2 ./app``) is
captured by native/inject.c, which CUDA loads through ``CUDA_INJECTION64_PATH`` at cuInit
and which writes CUPTI's records as fixed 128-byte records to
``<run>/native/rank-R-pid-P.{rec,str,json}`` (layout: native/inject.h).  This module

* prepares the program's environment before it starts (``prepare``): builds the library
  (once, cached), finds the system CUDA's libcupti, sets the injection variables; where that
  cannot be done it says so in one line and the program runs unchanged, uncaptured;
* turns each process's files into the run's Parquet parts and shard JSON (``convert``),
  before the run is compacted, so every tool reads a native program's run as any other:
  kernels (grid, block, registers, shared memory), copies, memsets, synchronizations, launch,
  copy, sync and allocation API calls, NVTX ranges (``range``, domain ``nvtx`` or
  ``nvtx:<domain>``), cudaMalloc-level allocations (``alloc`` / ``free``) and, with ``--uvm``,
  unified-memory counters (``uvm``, as the Python path's).

Decoding is columnar: one ``numpy.frombuffer`` over a process's records, then per-kind
column slices.  The files are the program's output, read as untrusted: a truncated or
damaged file loses its bad tail (or the process, with one status line), never the run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from pastaprof.events.schema import SCHEMA_VERSION, conform
from pastaprof.handlers import native_windows
from pastaprof.handlers.base import Handler, HandlerContext, Setting, boolean, integer
from pastaprof.handlers.cupti_memory import lookup_names, memory_tables
from pastaprof.handlers.cupti_records import _MEMCPY_KIND, _SYNC_KIND

NATIVE = "native"
#: What native capture adds to a program's environment besides PASTAPROF_* settings: hidden from a
#: Python program's os.environ, like pastaprof's other additions (live/launch.py).
ADDED_ENV = ("CUDA_INJECTION64_PATH", "NVTX_INJECTION64_PATH", "LD_PRELOAD", "ASAN_OPTIONS")
MAGIC = 0x31564954414E5050  # "PPNATIV1", native/inject.h
FORMAT_VERSION = 1
WORDS = 16
MAX_STRING = 4096
MAX_STRING_IDS = 1 << 17  # the library's string table (inject_util.c: STR_SLOTS / 2): a larger id is damage
K_KERNEL, K_MEMCPY, K_MEMSET, K_SYNC, K_API, K_MEMORY, K_MARKER, K_UVM = range(1, 9)
# a process's files; -exec-N: the N-th later image of a process that exec'd (same pid)
_FILE_RE = re.compile(r"^rank-(\d+)-pid-(\d+)(?:-exec-(\d+))?\.json$")
_PYTHON_RE = re.compile(r"^(python|pypy)[0-9.]*(-dbg)?$")
MARKER_INSTANT, MARKER_START, MARKER_END = 1, 2, 4


def _kinds(value: str) -> None:
    bad = [k for k in value.split(",") if k and k not in ("kernel", "memcpy", "memset", "sync", "memory", "marker",
                                                          "api", "none")]
    if bad:
        raise ValueError(f"unknown kind {bad[0]!r} (kernel, memcpy, memset, sync, memory, marker, api, none)")


def _api_mechanism(value: str) -> None:
    if value not in ("callbacks", "activity", "hybrid"):
        raise ValueError("expected callbacks, activity or hybrid")


def _library(value: str) -> None:
    if not os.path.isfile(value):
        raise ValueError("no such file")


class NativeProgram(Handler):
    """The native-program capture, registered like every handler so that ``pastaprof
    handlers`` lists it and its settings are checked before the program starts.  It records
    nothing inside a Python process (``create`` gives None: pastaprof's Python session captures
    there); the work is the launcher's two hooks below and the injection library."""

    name = "native"
    kinds = ("kernel", "memcpy", "memset", "sync", "api", "range", "alloc", "free", "access_launch",
             "access_summary", "access_pc", "uvm")
    settings = (
        Setting("NATIVE_INJECT", "0: no injection into native programs; 1: prepare it without an NVIDIA driver",
                boolean),
        Setting("NATIVE_CUPTI", "the libcupti native programs' capture uses (default: the CUDA toolkit's)",
                _library),
        Setting("NATIVE_FLUSH_MS", "native programs' CUPTI flush period in ms (0: none; default PASTAPROF_FLUSH_MS "
                                   "or 2000)", integer(0)),
        Setting("NATIVE_KINDS", "CUPTI kinds for native programs (kernel,memcpy,memset,sync,memory,marker,api; "
                                "default all)", _kinds),
        Setting("NATIVE_PRELOAD", "0: the injection library not in LD_PRELOAD (a native program that execs "
                                  "another image then loses its last CUPTI buffer)", boolean),
        Setting("NATIVE_BUFFER", "CUPTI buffer bytes in native programs (default 8 MiB)", integer(4096)),
        Setting("NATIVE_API_MECHANISM", "how native programs' API calls and syncs are recorded: callbacks "
                                        "(default), activity (CUPTI activity records, every kind enabled at start) "
                                        "or hybrid (launch calls as activity records, the rest by callbacks)",
                _api_mechanism),
    )
    mechanism = "cuda injection (native/inject.c)"

    @classmethod
    def create(cls, ctx: HandlerContext) -> NativeProgram | None:
        return None

    def drain(self) -> dict[str, pa.Table]:
        return {}


# ---- before the program starts ------------------------------------------------------------

def is_python_command(command: list[str]) -> bool:
    """Whether the program is a Python interpreter or a script run by one (its shebang): those
    are captured by the Python bootstrap, not by injection."""
    if not command:
        return False
    exe = shutil.which(command[0]) or command[0]
    if _PYTHON_RE.match(os.path.basename(exe)) or _PYTHON_RE.match(os.path.basename(os.path.realpath(exe))):
        return True
    try:
        with open(exe, "rb") as f:
            first = f.readline(256)
    except OSError:
        return False
    return first.startswith(b"#!") and b"python" in first


def prepare(env: dict[str, str], command: list[str], config: Any = None) -> str | None:
    """Set ``env`` up so that native CUDA processes of ``command`` are captured (``config``, the
    run's CaptureConfig: its tools decide whether the instruction-level sanitizer tool is
    loaded too).  Returns None, or one line saying why (part of) native capture is off; the
    program then runs unchanged."""
    setting = _switch(env, "PASTAPROF_NATIVE_INJECT")
    if setting is False or (setting is None and not has_nvidia_driver()):
        return None  # no CUDA program can run here: nothing to say
    from pastaprof import native

    if env.get("CUDA_INJECTION64_PATH"):
        return ("native capture off: CUDA_INJECTION64_PATH is already set (another tool injects into "
                "this program)")
    libcupti = native.system_libcupti()
    if libcupti is None:
        return "native capture off: no libcupti found (CUDA toolkit's extras/CUPTI, or PASTAPROF_NATIVE_CUPTI)"
    try:
        if shutil.which(native._compiler(False)) is None:
            raise RuntimeError(f"no C compiler ({native._compiler(False)}) to build it")
        lib = native.build_inject()
    except (OSError, RuntimeError) as e:
        return f"native capture off: the injection library could not be built: {e}"
    env["CUDA_INJECTION64_PATH"] = str(lib)
    env["PASTAPROF_NATIVE_CUPTI"] = libcupti
    preload_for_exec(env, lib)
    env.setdefault("NVTX_INJECTION64_PATH", str(lib))  # a user's own NVTX tool (nsys) keeps its place
    if config is not None and config.tools:
        from pastaprof.handlers.native_sanitizer import launcher_env

        consumed = _consumed(config)
        if "uvm" in consumed:  # as in a Python session: a tool that reads uvm turns the counters on
            env["PASTAPROF_UVM"] = "1"
        return launcher_env(env, config, consumed)
    return None


def _switch(env: dict[str, str], name: str) -> bool | None:
    """A 0/1 setting's value (checked before the program starts), None where unset."""
    value = env.get(name, "")
    return boolean(value) if value else None


def preload_for_exec(env: dict[str, str], lib: Path) -> None:
    """The library in LD_PRELOAD too, after the user's own: a process that execs another image
    then writes what CUPTI holds first (native/inject_exec.c); without it that image's last
    buffer is lost.  Left out with PASTAPROF_NATIVE_PRELOAD=0, or where the path has a character
    LD_PRELOAD splits on."""
    if _switch(env, "PASTAPROF_NATIVE_PRELOAD") is False or any(c in str(lib) for c in " :\t\n"):
        return
    current = env.get("LD_PRELOAD", "").strip()
    if str(lib) not in current.replace(":", " ").split():
        env["LD_PRELOAD"] = f"{current} {lib}".strip()
    asan = env.get("ASAN_OPTIONS", "")
    if "verify_asan_link_order" not in asan:  # else an AddressSanitizer program refuses to start
        env["ASAN_OPTIONS"] = f"{asan}:verify_asan_link_order=0" if asan else "verify_asan_link_order=0"


def _consumed(config: Any, prefix: str | None = None) -> set[str]:
    """The kinds the run's tools need (not those they take only where present); with
    ``prefix``, those that start with it."""
    if config is None or not config.tools:
        return set()
    from pastaprof.tools.registry import resolve

    try:
        kinds = {k for cls in resolve(list(config.tools)) for k in getattr(cls, "consumes", ())
                 if k not in getattr(cls, "optional", ())}
    except Exception:  # noqa: BLE001 -- an unknown tool is the CLI's to report
        return set()
    return {k for k in kinds if k.startswith(prefix)} if prefix else kinds


def has_nvidia_driver() -> bool:
    """Whether this machine has NVIDIA's kernel driver (without it no CUDA program runs, and
    native capture is not prepared; PASTAPROF_NATIVE_INJECT=1 prepares it anyway)."""
    return os.path.exists("/proc/driver/nvidia/version") or os.path.exists("/dev/nvidiactl")


def launch_hook(env: dict[str, str], command: list[str], config: Any = None) -> None:
    """The launcher's step before the program starts: native capture prepared, so that every
    native CUDA process the command starts is captured (a shell script or ``mpirun`` may start
    them, and so may a Python program: its own process is the Python session's, and the library
    stays out of it; not with instruction-level tools, whose sanitizer the session runs).  Why
    it is off, where it is, in one line; for a Python program nothing is said (its own capture
    does not need it)."""
    python = is_python_command(command)
    if python and _consumed(config, "access_"):
        return  # the Python session runs its own sanitizer: the library stays out of its process
    try:  # a Python program's own settings (UVM counters) are its session's: its children get the defaults
        line = prepare(env, command, None if python else config)
    except Exception as e:  # noqa: BLE001 -- never keep the program from starting
        line = f"native capture off: {type(e).__name__}: {e}"
    if line and not python:
        note(line)


def finish_hook(run_dir: Path, config: Any = None) -> None:
    """The launcher's step after the program ended, before compaction: the native processes'
    files -> parts.  A failure (disk full) is one warning; the rest of the run is stored."""
    try:
        convert(run_dir, config=config)
    except Exception as e:  # noqa: BLE001 -- the Python processes' events are still stored
        note(f"warning: native programs' events not stored: {type(e).__name__}: {e}")


# ---- after the program ended: files -> parts -------------------------------------------------

def convert(run_dir: Path, kernels: str | None = None, config: Any = None) -> dict[str, int]:
    """Every native process's files in ``run_dir/native`` -> Parquet parts and a shard JSON of
    the run (what a Python process's session writes), then the files are removed.  ``kernels``
    (default: ``config.kernels``): the PASTAPROF_KERNELS regex, applied here where the library's
    POSIX regex could not take it; ``config``: the run's CaptureConfig, for the instruction-level
    tables.  Returns rows per kind."""
    from pastaprof.store.parts import next_part_numbers, write_part

    if kernels is None and config is not None:
        kernels = config.kernels
    d = run_dir / NATIVE
    rows: dict[str, int] = {}
    if not d.is_dir() or d.is_symlink():
        return rows
    found = [(m, p) for p in d.iterdir() if (m := _FILE_RE.match(p.name))]
    found.sort(key=lambda e: (int(e[0][1]), int(e[0][2]), int(e[0][3] or 0)))  # a pid's images in exec order
    next_part = next_part_numbers(run_dir)
    for m, meta_path in found:
        base = meta_path.with_suffix("")
        meta, tables, status = read_process(base, kernels)
        tables, windowed_out = native_windows.gate(tables, config)  # --ranges: by NVTX range, at store time
        rank, pid = _int(meta.get("rank"), int(m.group(1))), _int(meta.get("pid"), int(m.group(2)))
        if meta:
            from pastaprof.handlers.native_sanitizer import tables as access_tables

            access, meta["_sanitizer"], trouble = access_tables(base, meta, config, rank, pid)
            tables.update(access)
            if trouble:
                status["sanitizer"] = trouble
        events: dict[str, int] = {}
        # after the parts of this pid's earlier images (an exec'd process; a Python session
        # that exec'd this program): compaction tells the images apart by their first part
        part = next_part.get((rank, pid), 0)
        next_part[(rank, pid)] = part + 1
        for kind, t in tables.items():
            if not t.num_rows:  # e.g. every copy outside the --ranges windows
                continue
            write_part(run_dir / kind / f"rank-{rank}-pid-{pid}-part-{part:05d}.parquet", t)
            events[kind] = t.num_rows
            rows[kind] = rows.get(kind, 0) + t.num_rows
        _write_shard(run_dir, rank, pid, meta, events, status, windowed_out, first_part=part)
    shutil.rmtree(d, ignore_errors=True)
    return rows


def _int(v: Any, default: int) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 31 else default


def _write_shard(run_dir: Path, rank: int, pid: int, meta: dict[str, Any], events: dict[str, int],
                 status: dict[str, str], windowed_out: dict[str, int] | None = None, first_part: int = 0) -> None:
    stats = meta.get("stats") if isinstance(meta.get("stats"), dict) else {}
    stat = {k: _int(v, 0) for k, v in stats.items()}
    shard = {
        "schema_version": SCHEMA_VERSION, "rank": rank, "pid": pid, "first_part": first_part,
        "argv": [a for a in meta.get("argv", []) if isinstance(a, str)] if isinstance(meta.get("argv"), list)
        else None,
        "started_ns": _int(meta.get("started_ns"), 0) if isinstance(meta.get("started_ns"), int) else None,
        "status": status, "events": events,
        "filtered_out": stat.get("sampled_out", 0) + sum((windowed_out or {}).values()),
        "filtered_by_kind": dict(windowed_out or {}),
        "handlers": {"native": {"records": stat.get("records", 0), "dropped": stat.get("dropped", 0),
                                "sampled_out": stat.get("sampled_out", 0),
                                "kernels_seen": stat.get("kernels_seen", 0),
                                "mechanism": str(meta.get("mode", "cuda_injection"))[:40],
                                # API calls and syncs: "callbacks", or "activity (why)" (native/inject_callbacks.c)
                                **{k: meta[k][:300] for k in ("api_mechanism", "lazy_kinds")
                                   if isinstance(meta.get(k), str)},
                                "buffers": {"completed": stat.get("buffers", 0)}}},
        "dropped_events": stat.get("dropped", 0), "relink_needed": False, "sanitizer": meta.get("_sanitizer"),
        "capture_overhead": {"flush_seconds": 0.0, "stop_seconds": 0.0},
    }
    write_shard(run_dir, rank, pid, shard)


def write_shard(run_dir: Path, rank: int, pid: int, shard: dict[str, Any]) -> None:
    """A process's shard header, written whole or not at all (compaction reads every one), for a
    process whose events the launcher stores (native programs, probed ones); beside, never over,
    the shard of an earlier image of the same pid (-exec-N)."""
    from pastaprof.store.parts import free_shard

    (run_dir / "shards").mkdir(parents=True, exist_ok=True)
    path = free_shard(run_dir, rank, pid)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(shard), encoding="utf-8")
    os.replace(tmp, path)


def read_process(base: Path, kernels: str | None = None) -> tuple[dict[str, Any], dict[str, pa.Table], dict[str, str]]:
    """One process's files (``base`` + .json/.rec/.str) -> (its JSON, event tables, status)."""
    status: dict[str, str] = {}
    meta = _read_meta(base.with_suffix(".json"))
    if meta is None:
        status["native"] = "its native capture header is unreadable: nothing of it was stored"
        return {}, {}, status
    if meta.get("status") not in (None, "ok"):
        status["native"] = f"native capture: {str(meta['status'])[:300]}"
    if isinstance(meta.get("uvm"), str):  # --uvm: "ok", or why the counters are not recorded
        status["uvm"] = meta["uvm"][:300]
    if isinstance(meta.get("note"), str):
        status["native_note"] = f"native capture: {meta['note'][:300]}"
    records, trouble = _read_records(base.with_suffix(".rec"))
    if trouble:
        status["native_records"] = trouble
    strings = _read_strings(base.with_suffix(".str"))
    rank = _int(meta.get("rank"), 0)
    pid = _int(meta.get("pid"), 0)
    ended = str(meta.get("ended", ""))
    if meta.get("complete") is not True and not status.get("native"):
        status["native_end"] = (f"ended by {ended}: events up to then are in the run" if ended.startswith("signal")
                                else "ended without its final flush (SIGKILL, a crash, or _exit): the events of "
                                     "its last CUPTI buffer are not in the run")
    pattern = kernels if meta.get("kernel_filter") == "python" else None
    tables = decode(records, strings, rank, pid, pattern)
    return meta, tables, status


def _read_meta(path: Path) -> dict[str, Any] | None:
    try:
        if path.is_symlink() or path.stat().st_size > 1 << 20:
            return None
        meta = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(meta, dict) or meta.get("format") != "pastaprof-native" or meta.get("version") != FORMAT_VERSION:
        return None
    return meta


def _read_records(path: Path) -> tuple[np.ndarray, str | None]:
    empty = np.zeros((0, WORDS), np.int64)
    try:
        if path.is_symlink():
            return empty, "its record file is a symbolic link: not read"
        raw = np.fromfile(path, dtype="<i8")
    except (OSError, ValueError):
        return empty, "its record file is missing or unreadable"
    n = len(raw) // WORDS
    if n == 0 or raw[0] != MAGIC or raw[1] != FORMAT_VERSION or raw[2] != WORDS * 8:
        return empty, "its record file is not one this pastaprof reads (header)"
    trouble = None
    if len(raw) % WORDS:
        trouble = "its record file ends in a partial record (cut short): that record is left out"
    return raw[:n * WORDS].reshape(n, WORDS)[1:], trouble


def _read_strings(path: Path) -> dict[int, str]:
    out: dict[int, str] = {}
    try:
        data = b"" if path.is_symlink() else path.read_bytes()
    except OSError:
        return out
    pos = 0
    while pos + 8 <= len(data):
        sid, n = struct.unpack_from("<ii", data, pos)
        if not 0 <= sid < MAX_STRING_IDS or n < 0 or n > MAX_STRING or pos + 8 + n > len(data):
            break  # damaged or cut short: what came before is kept
        out[sid] = data[pos + 8:pos + 8 + n].decode("utf-8", "replace")
        pos += 8 + n
    return out


def _names(ids: np.ndarray, strings: dict[int, str]) -> pa.DictionaryArray:
    """String ids -> a dictionary-encoded name column of the names used (an unknown id: null).
    Ids are small (the library's table holds at most 2^17), so a bincount finds the ones used
    in one pass instead of a sort."""
    ids = np.asarray(ids, np.int64)
    top = max(strings, default=-1) + 1
    known = (ids >= 0) & (ids < top)
    if len(ids) and known.any():
        used = np.flatnonzero(np.bincount(ids[known], minlength=top))
        used = used[[int(u) in strings for u in used]]
    else:
        used = np.zeros(0, np.int64)
    lookup = np.full(top + 1, -1, np.int64)
    lookup[used] = np.arange(len(used))
    idx = lookup[np.where(known, ids, top)]
    indices = pa.array(idx.astype(np.int32), mask=idx < 0)
    return pa.DictionaryArray.from_arrays(indices, pa.array([strings[int(u)] for u in used], pa.string()))


def decode(records: np.ndarray, strings: dict[int, str], rank: int, pid: int,
           kernels: str | None = None) -> dict[str, pa.Table]:
    """Fixed records (one row each, word 0 the kind) -> event tables of the run's schema."""
    out: dict[str, pa.Table] = {}
    if not len(records):
        return out
    kind = records[:, 0]

    def cols(k: int, names: tuple[str, ...]) -> dict[str, np.ndarray]:
        idx = np.flatnonzero(kind == k)  # the kind's rows, only the words it uses (no 128-byte row copies)
        return {n: records[idx, i + 1] for i, n in enumerate(names)}

    def i32(a: np.ndarray) -> np.ndarray:
        return a.astype(np.int32)

    def common(c: dict[str, np.ndarray], n: int) -> dict[str, Any]:
        return {"rank": np.full(n, rank, np.int32), "pid": np.full(n, pid, np.int64)}

    k = cols(K_KERNEL, ("start_ns", "end_ns", "device", "stream", "correlation", "name", "grid_x", "grid_y",
                        "grid_z", "block_x", "block_y", "block_z", "registers", "shared_bytes"))
    if len(k["name"]) and kernels:
        rx = re.compile(kernels)
        uniq = np.unique(k["name"])
        ok = [int(u) for u in uniq if rx.search(strings.get(int(u), "")) is not None]
        keep = np.isin(k["name"], ok)
        k = {c: v[keep] for c, v in k.items()}
    if len(k["name"]):
        n = len(k["name"])
        t = {c: (i32(v) if c in ("device", "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z",
                                 "registers") else v) for c, v in k.items() if c != "name"}
        out["kernel"] = pa.table({**t, "name": _names(k["name"], strings), **common(k, n)})
    m = cols(K_MEMCPY, ("start_ns", "end_ns", "device", "stream", "correlation", "bytes", "copy_kind"))
    if len(m["bytes"]):
        ck = m.pop("copy_kind")
        out["memcpy"] = pa.table({**m, "device": i32(m["device"]), "direction": lookup_names(ck, _MEMCPY_KIND),
                                  **common(m, len(ck))})
    s = cols(K_MEMSET, ("start_ns", "end_ns", "device", "stream", "correlation", "bytes"))
    if len(s["bytes"]):
        out["memset"] = pa.table({**s, "device": i32(s["device"]), **common(s, len(s["bytes"]))})
    y = cols(K_SYNC, ("start_ns", "end_ns", "stream", "correlation", "sync_type"))
    if len(y["stream"]):
        st = y.pop("sync_type")
        out["sync"] = pa.table({**y, "sync_kind": lookup_names(st, _SYNC_KIND),
                                **common(y, len(st))})
    a = cols(K_API, ("start_ns", "end_ns", "pid", "tid", "correlation", "cbid", "is_driver", "name"))
    if len(a["cbid"]):
        driver = (a["is_driver"] != 0).astype(np.int32)
        out["api"] = pa.table({
            "start_ns": a["start_ns"], "end_ns": a["end_ns"], "pid": np.full(len(driver), pid, np.int64),
            "tid": a["tid"], "correlation": a["correlation"], "name": _names(a["name"], strings),
            "api_kind": pa.DictionaryArray.from_arrays(pa.array(driver), pa.array(["runtime", "driver"])),
            "rank": np.full(len(driver), rank, np.int32)})
    mem = cols(K_MEMORY, ("start_ns", "device", "stream", "correlation", "address", "bytes", "memory_kind",
                          "operation", "pid", "is_async"))
    if len(mem["bytes"]):
        out.update(memory_tables("memory", mem, rank))
    uvm = cols(K_UVM, ("start_ns", "end_ns", "counter_kind", "value", "address", "src_device", "dst_device",
                       "stream", "flags"))
    if len(uvm["value"]):
        out.update(memory_tables("uvm", uvm, rank))
    rng = _ranges(cols(K_MARKER, ("start_ns", "flags", "id", "object_kind", "pid", "tid", "name", "domain")),
                  strings, rank, pid, _last_ns(records))
    if rng is not None:
        out["range"] = rng
    return {kind: _sorted(conform(kind, t)) for kind, t in out.items()}


def _last_ns(records: np.ndarray) -> int:
    """The process's last event time: word 1 is every kind's start, word 2 the end of the
    kinds with one (kernel, memcpy, memset, sync, api, uvm)."""
    kind = records[:, 0]
    timed = ((kind >= K_KERNEL) & (kind <= K_API)) | (kind == K_UVM)
    return int(max(records[:, 1].max(), np.max(records[:, 2], where=timed, initial=0)))


def _ranges(c: dict[str, np.ndarray], strings: dict[int, str], rank: int, pid: int, last_ns: int) -> pa.Table | None:
    """NVTX markers -> ranges: a start record and the end record of the same id make one; an
    instant marker is a range of no length; a range never ended ends at the process's last event."""
    flags = c["flags"]
    if not len(flags):
        return None
    starts = np.flatnonzero((flags & (MARKER_START | MARKER_INSTANT)) != 0)
    ends = np.flatnonzero((flags & MARKER_END) != 0)
    order = np.argsort(c["id"][ends], kind="stable")
    end_ids, end_t = c["id"][ends][order], c["start_ns"][ends][order]
    pos = np.searchsorted(end_ids, c["id"][starts])
    found = (pos < len(end_ids)) & (end_ids[np.minimum(pos, max(len(end_ids) - 1, 0))] == c["id"][starts]) \
        if len(end_ids) else np.zeros(len(starts), bool)
    t0 = c["start_ns"][starts]
    end = np.where(found, end_t[np.minimum(pos, max(len(end_ids) - 1, 0))] if len(end_ids) else 0, max(last_ns, 0))
    end = np.where((flags[starts] & MARKER_INSTANT) != 0, t0, np.maximum(end, t0))
    dom_ids = c["domain"][starts]
    dom_names = {int(u): ("nvtx" if u < 0 or int(u) not in strings else f"nvtx:{strings[int(u)]}")
                 for u in np.unique(dom_ids)}
    n = len(starts)
    return pa.table({"start_ns": t0, "end_ns": end, "rank": np.full(n, rank, np.int32),
                     "pid": np.full(n, pid, np.int64), "tid": c["tid"][starts],
                     "name": _names(c["name"][starts], strings), "domain": lookup_names(dom_ids, dom_names),
                     "id": c["id"][starts]})


def _sorted(t: pa.Table) -> pa.Table:
    start = t["start_ns"].to_numpy()
    if len(start) > 1 and (np.diff(start) < 0).any():
        return t.take(pa.array(np.argsort(start, kind="stable")))
    return t


def note(line: str) -> None:
    """One line on stderr, as the launcher's other notes."""
    sys.stderr.write(f"pastaprof: {line}\n")
