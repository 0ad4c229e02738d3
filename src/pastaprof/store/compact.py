"""Turning a live capture's shards into a regular run directory.

While a program runs, every process writes Parquet *parts*
(``<kind>/rank-R-pid-P-part-N.parquet``) and a small JSON of its own
(``shards/rank-R-pid-P.json``).  Compaction merges the parts of each kind and
rank into ``<kind>/rank-R.parquet`` (sorted by time) when there are more than
``KEEP_PARTS`` of them or they need re-linking -- a few parts are left as they
are: readers take every ``rank-*.parquet``, and merging cost a short run more
than its capture -- and the per-process JSONs into ``run.json``.  Each process
numbers its own ops, so where several processes of a rank recorded ops (a forked
DataLoader worker goes on from its parent's count, a spawned child starts again at 1)
their ids collide: the later processes' op ids -- and every op id that refers to
them -- are shifted past the earlier ones' (``RankLinker.process_shifts``), and that
rank's parts are merged, so no reader sees the parts' own numbering.  CUPTI's
correlation ids, numbered by each process from 1 too, are shifted the same way where
several processes of a rank recorded GPU work.  A process that exec'd keeps its pid,
and its new image numbers both from 1 again: its parts after the earlier image's are
taken as another process's.  Parts of a process killed mid-write are never half-read:
they are renamed into place only when complete.
"""

from __future__ import annotations

import bisect
import functools
import json
import os
import re
import shutil
import socket
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pastaprof.errors import InputError
from pastaprof.events.schema import KINDS, SCHEMA_VERSION
from pastaprof.store.parts import PART_RE as _PART_RE
from pastaprof.store.safe_read import load_json, part_columns, part_rows, read_part
from pastaprof.store.writer import MANIFEST, dictionary_columns


@functools.cache  # NVML's start-up takes tens of ms: asked once (``pastaprof run`` asks while the program runs)
def _gpus() -> list[dict[str, Any]]:
    """GPU names and memory through NVML, when available (never required)."""
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            out.append({"id": i, "name": name.decode() if isinstance(name, bytes) else name,
                        "totalGlobalMem": int(pynvml.nvmlDeviceGetMemoryInfo(h).total)})
        driver = pynvml.nvmlSystemGetDriverVersion()
        pynvml.nvmlShutdown()
        for d in out:
            d["driver"] = driver.decode() if isinstance(driver, bytes) else driver
        return out
    except Exception:
        return []


EXTERNAL = "_external"
LINKED = ("kernel", "memcpy", "memset", "api")
EXTERNAL_COLUMNS = ("pid", "correlation", "external_id")
# kinds whose correlation ids a process numbers itself (CUPTI from 1; the sanitizer its launches)
NUMBERED_BY_PROCESS = ("api", "kernel", "memcpy", "memset", "sync", "alloc", "free", "access_launch")
KEEP_PARTS = 8  # per kind and rank: up to this many parts are kept, more are merged into one file


def _images(metas: list[dict[str, Any]]) -> dict[tuple[int, int], list[int]]:
    """(rank, pid) -> the first parts of its later process images: a session started in a
    process that an exec gave a new image continues the earlier image's part numbers
    (``first_part`` of its shard), and numbers its ops and launches from 1 again."""
    out: dict[tuple[int, int], set[int]] = {}
    for m in metas:
        first, rank, pid = m.get("first_part"), m.get("rank"), m.get("pid")
        if all(isinstance(v, int) and not isinstance(v, bool) for v in (first, rank, pid)) and first > 0:
            out.setdefault((rank, pid), set()).add(first)
    return {k: sorted(v) for k, v in out.items()}


def _process(m: re.Match, images: dict[tuple[int, int], list[int]]) -> int:
    """The process a part (``_PART_RE`` match) is of, as ids are numbered: its pid, or for the
    n-th later image of an exec'd process, pid + n * 2**32 (a key only, never stored)."""
    rank, pid = int(m.group(1)), int(m.group(2))
    starts = images.get((rank, pid))
    return pid + (bisect.bisect_right(starts, int(m.group(3))) << 32) if starts else pid


def _external(run_dir: Path, shifts: dict[int, dict[int, int]], corr_shifts: dict[int, dict[int, int]],
              images: dict[tuple[int, int], list[int]]) -> dict[int, pa.Table]:
    """Per rank: all (pid, correlation, external_id) records of the live capture (the external
    id is an op id of the process: shifted as its ops are, ``shifts``; the correlation as the
    process's GPU work's, ``corr_shifts``)."""
    out: dict[int, list[pa.Table]] = {}
    d = run_dir / EXTERNAL
    if d.is_dir():
        for p in d.iterdir():
            m = _PART_RE.match(p.name)
            if m:
                try:
                    t = read_part(p, None, run_dir)
                except InputError:
                    continue
                if not all(c in t.column_names and pa.types.is_integer(t.schema.field(c).type) for c in EXTERNAL_COLUMNS):
                    continue  # not one of ours (a foreign or damaged part): no links from it
                t = pa.table({c: t[c].cast(pa.int64(), safe=False) for c in EXTERNAL_COLUMNS})
                rank, pid = int(m.group(1)), _process(m, images)
                shift = shifts.get(rank, {}).get(pid, 0)
                if shift:
                    from pastaprof.processor.link import shift_op_ids

                    t = shift_op_ids("external", t, shift)
                if corr_shifts.get(rank, {}).get(pid):
                    from pastaprof.processor.link import shift_correlation

                    t = shift_correlation(t, corr_shifts[rank][pid])
                out.setdefault(int(m.group(1)), []).append(t)
    return {r: pa.concat_tables(ts) for r, ts in out.items()}


def _parts_by_process(run_dir: Path, kinds: tuple[str, ...],
                      images: dict[tuple[int, int], list[int]]) -> dict[int, dict[int, list[Path]]]:
    """rank -> process (``_process``) -> the parts of ``kinds`` it wrote."""
    out: dict[int, dict[int, list[Path]]] = {}
    for kind in kinds:
        d = run_dir / kind
        if d.is_dir():
            for p in d.iterdir():
                m = _PART_RE.match(p.name)
                if m:
                    out.setdefault(int(m.group(1)), {}).setdefault(_process(m, images), []).append(p)
    return out


def _op_shifts(run_dir: Path, cache: dict[Path, pa.Table],
               images: dict[tuple[int, int], list[int]]) -> dict[int, dict[int, int]]:
    """Per rank whose processes' op ids collide: per pid, what its op ids get added
    (``RankLinker.process_shifts``).  The op parts of such ranks are read here once and kept in
    ``cache`` for their merge; a rank of one process reads nothing."""
    out: dict[int, dict[int, int]] = {}
    for rank, pids in _parts_by_process(run_dir, ("op",), images).items():
        if len(pids) < 2:
            continue
        from pastaprof.processor.link import RankLinker

        ops: dict[int, list[pa.Table]] = {}
        for pid, parts in pids.items():
            for p in parts:
                try:
                    cache[p] = read_part(p, "op", run_dir)
                except InputError:
                    continue
                ops.setdefault(pid, []).append(cache[p])
        shifts = RankLinker.process_shifts(ops)
        if shifts:
            out[rank] = shifts
        else:  # kept as they are: not merged, not read again
            for parts in pids.values():
                for p in parts:
                    cache.pop(p, None)
    return out


def _int_span(t: pa.Table, column: str, limit: int) -> tuple[int, int] | None:
    """(min, max) of an integer column whose values lie in [0, limit); None for a column that is
    missing, all null, not integers or out of that range (a foreign or damaged part)."""
    if column not in t.column_names or not pa.types.is_integer(t.schema.field(column).type):
        return None
    c = pc.min_max(t[column])
    lo, hi = c["min"].as_py(), c["max"].as_py()
    return (int(lo), int(hi)) if lo is not None and 0 <= lo and hi < limit else None


def _correlation_shifts(run_dir: Path, images: dict[tuple[int, int], list[int]]) -> dict[int, dict[int, int]]:
    """Per rank where several processes recorded GPU work (each numbers its correlation ids from
    1: CUPTI its launches, the sanitizer its instrumented launches): per process, what its
    correlation ids get added (``shifts_past``), so that a rank's (correlation) joins of API
    calls and accesses to kernels never pair one process's rows with another's.  Only the
    correlation and time columns of such ranks' parts are read."""
    out: dict[int, dict[int, int]] = {}
    for rank, pids in _parts_by_process(run_dir, NUMBERED_BY_PROCESS, images).items():
        if len(pids) < 2:
            continue
        spans: dict[int, tuple[int | None, int, int]] = {}
        for pid, paths in pids.items():
            first, lo, hi = None, None, None
            for p in paths:
                try:
                    t = part_columns(p, ["start_ns", "correlation"], run_dir)
                except InputError:
                    continue
                span = _int_span(t, "correlation", 1 << 40)  # CUPTI's ids are 32-bit: other values are damage
                if span is None:
                    continue
                lo, hi = (span if lo is None else (min(lo, span[0]), max(hi, span[1])))
                start = _int_span(t, "start_ns", 1 << 62)
                if start is not None and (first is None or start[0] < first):
                    first = start[0]
            if lo is not None:
                spans[pid] = (first, int(lo), int(hi))
        from pastaprof.processor.link import shifts_past

        shifts = shifts_past(spans)
        if shifts:
            out[rank] = shifts
    return out


def _link(t: pa.Table, ext: pa.Table | None) -> pa.Table:
    """Fill op_id from the external-correlation records (per process: CUPTI's
    correlation ids are per process)."""
    if ext is None or "op_id" not in t.column_names or t.num_rows == 0:
        return t
    import numpy as np

    from pastaprof.processor.link import map_keys

    def key(pid, corr):
        return (np.asarray(pid.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64) << 32) + \
            np.asarray(corr.fill_null(-1).to_numpy(zero_copy_only=False), dtype=np.int64)

    found = map_keys(key(t["pid"], t["correlation"]), key(ext["pid"], ext["correlation"]),
                     np.asarray(ext["external_id"].to_numpy(zero_copy_only=False), dtype=np.int64))
    have = np.asarray(t["op_id"].fill_null(-1).to_numpy(zero_copy_only=False), dtype=np.int64)
    op = np.where(have >= 0, have, found)
    return t.set_column(t.schema.get_field_index("op_id"), "op_id", pa.array(op, pa.int64(), mask=op < 0))


def warm_up() -> None:
    """Load and first-call what compaction uses (pyarrow, the Parquet footer reader: ~0.1 s,
    and ~1 ms more at the first footer read), for ``pastaprof run`` to call while the program
    runs rather than after it ended."""
    try:
        buf = pa.BufferOutputStream()  # (no table from Python values: pyarrow's first one imports pandas)
        pq.write_table(pa.Table.from_arrays([pa.nulls(1, pa.int64())], names=["a"]), buf)
        pq.read_metadata(pa.BufferReader(buf.getvalue()))
        _dumps({"a": [1]})
        _gpus()
    except Exception:  # noqa: BLE001 -- only a warm-up
        pass


def _dumps(manifest: dict[str, Any]) -> bytes:
    """The manifest as indented JSON: orjson (0.1 ms) where it can, else the standard library
    (indented output takes its pure-Python encoder: ~1 ms for one process's manifest)."""
    try:
        import orjson

        return orjson.dumps(manifest, default=str, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS)
    except (ImportError, TypeError):  # orjson.JSONEncodeError is a TypeError (e.g. an int over 64 bits)
        return json.dumps(manifest, indent=1, default=str).encode()


def _read_metas(run_dir: Path) -> list[dict[str, Any]]:
    """The processes' shard headers; one a process died rewriting is skipped (its parts still count)."""
    metas = []
    for p in sorted((run_dir / "shards").glob("rank-*-pid-*.json")):
        try:
            meta = load_json(p, root=run_dir)
        except InputError:
            continue
        if isinstance(meta, dict):
            metas.append(meta)
    return metas


def _compact_kind(d: Path, kind: str, external: dict[int, Any], ranks: set[int], rows: dict[str, int],
                  shifts: dict[int, dict[int, int]], cache: dict[Path, pa.Table],
                  corr_shifts: dict[int, dict[int, int]], images: dict[tuple[int, int], list[int]]) -> None:
    """One kind's parts into one file per rank (re-linked where ``external`` has the rank; op
    ids of the rank's later processes shifted where ``shifts`` has it, their correlation ids
    where ``corr_shifts`` has it; ``cache``: parts read)."""
    by_rank: dict[int, list[Path]] = {}
    for p in d.iterdir():
        m = _PART_RE.match(p.name)
        if m:
            by_rank.setdefault(int(m.group(1)), []).append(p)
        elif p.name.startswith("."):
            p.unlink(missing_ok=True)  # a part whose writer died before the rename
    for rank, parts in sorted(by_rank.items()):
        ranks.add(rank)
        if (len(parts) <= KEEP_PARTS and not (kind in LINKED and rank in external) and rank not in shifts
                and rank not in corr_shifts):
            # a few parts stay as they are (readers take every rank-*.parquet): merging
            # them was most of a short run's store time (20,000 tiny kernels: 67 ms);
            # one that cannot be read is dropped, as merging would skip it
            kept = []
            for p in parts:
                try:
                    rows[kind] = rows.get(kind, 0) + part_rows(p, kind, d.parent)
                    kept.append(p)
                except InputError:
                    p.unlink(missing_ok=True)
            if len(kept) == 1:  # already the final file
                os.replace(kept[0], d / f"rank-{rank}.parquet")
            continue
        tables = []
        for p in sorted(parts):
            try:
                t = cache.pop(p) if p in cache else read_part(p, kind, d.parent)
            except InputError:
                continue
            m = _PART_RE.match(p.name)
            pid = _process(m, images) if m else -1
            if shifts.get(rank, {}).get(pid):
                from pastaprof.processor.link import shift_op_ids

                t = shift_op_ids(kind, t, shifts[rank][pid])
            if corr_shifts.get(rank, {}).get(pid):
                from pastaprof.processor.link import shift_correlation

                t = shift_correlation(t, corr_shifts[rank][pid])
            tables.append(t)
        if tables:
            t = pa.concat_tables(tables).sort_by([("start_ns", "ascending")])
            t = _link(t, external.get(rank))
            tmp = d / f".rank-{rank}.parquet.tmp"
            pq.write_table(t, tmp, compression="zstd", use_dictionary=dictionary_columns(t.schema))
            os.replace(tmp, d / f"rank-{rank}.parquet")
            rows[kind] = rows.get(kind, 0) + t.num_rows
        for p in parts:
            p.unlink(missing_ok=True)


def _manifest(metas: list[dict[str, Any]], ranks: set[int], rows: dict[str, int], command: list[str] | None,
              exit_code: int | None, wall_seconds: float | None) -> dict[str, Any]:
    status: dict[str, str] = {}
    for m in metas:
        for k, v in (m.get("status") or {}).items():
            status[f"rank {m.get('rank')} pid {m.get('pid')}: {k}"] = v

    def overhead_sum(key: str) -> float:
        return round(sum((m.get("capture_overhead") or {}).get(key, 0) for m in metas), 6)

    return {
        "schema_version": SCHEMA_VERSION,
        "format": "pastaprof-live",
        "source": "pastaprof run",
        "command": command if command is not None else (metas[0].get("argv") if metas else None),
        "exit_code": exit_code,
        "host": socket.gethostname(),
        "devices": next((m["devices"] for m in metas if m.get("devices")), None) or _gpus(),
        "versions": metas[0].get("versions", {}) if metas else {},
        "ranks": sorted(ranks) or [0],
        "processes": [{k: m.get(k) for k in ("rank", "pid", "argv", "events", "handlers", "status", "steps_seen",
                                              "filtered_out", "filtered_by_kind", "capture_overhead", "uvm_plan",
                                              "sanitizer", "summaries")}
                      for m in metas],
        "clock": {"domain": "unix_epoch_ns", "anchors": {f"{m.get('rank')}/{m.get('pid')}": m.get("started_ns")
                                                         for m in metas}},
        "capture_overhead": {"flush_seconds": overhead_sum("flush_seconds"),
                             "stop_seconds": overhead_sum("stop_seconds"), "wall_seconds": wall_seconds},
        "dropped_events": sum(int(m.get("dropped_events") or 0) for m in metas),
        "status": status,
        "rows": rows,
        "finished_ns": time.time_ns(),
    }


def compact(run_dir: Path, command: list[str] | None = None, exit_code: int | None = None,
            wall_seconds: float | None = None) -> dict[str, Any]:
    """Merge shards in ``run_dir`` in place; returns the manifest written."""
    t0 = time.perf_counter()
    metas = _read_metas(run_dir)
    ranks: set[int] = {m["rank"] for m in metas if isinstance(m.get("rank"), int)}
    rows: dict[str, int] = {}
    # Re-linking reads every GPU-activity part again; it is needed only where a process saw a
    # correlation record after it had stored the kernel it belongs to, or died before saying.
    relink = not metas or any(m.get("relink_needed", True) for m in metas)
    cache: dict[Path, pa.Table] = {}
    images = _images(metas)
    shifts = _op_shifts(run_dir, cache, images)  # a rank's processes each number their ops: made unique
    corr_shifts = _correlation_shifts(run_dir, images)  # ... and their CUPTI correlation ids
    external = _external(run_dir, shifts, corr_shifts, images) if relink else {}
    for kind in KINDS:
        d = run_dir / kind
        if d.is_dir():
            _compact_kind(d, kind, external, ranks, rows, shifts, cache, corr_shifts, images)
    cache.clear()
    manifest = _manifest(metas, ranks, rows, command, exit_code, wall_seconds)
    manifest["capture_overhead"]["compact_seconds"] = round(time.perf_counter() - t0, 6)
    (run_dir / MANIFEST).write_bytes(_dumps(manifest))
    shutil.rmtree(run_dir / "shards", ignore_errors=True)
    shutil.rmtree(run_dir / EXTERNAL, ignore_errors=True)
    return manifest
