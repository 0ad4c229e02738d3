"""Normalization: link ops, API calls and GPU work, and place ops in their
module and source line.  Pure functions over whole per-rank tables, all
vectorized (NumPy + Arrow); the processor calls them before fan-out.

Links computed:
* ``op.id`` (0..n-1 within a rank), ``op.parent_id`` / ``op.depth`` (nesting per thread);
  a rank read from several capture files (a profiler ``schedule`` writes one per cycle) is
  linked file by file, each later file's ids following the earlier files' (:class:`RankLinker`);
  a live rank's processes (a forked DataLoader worker, a spawned child) number their own ops,
  so at compaction each later process's ids are shifted past the earlier ones'
  (:meth:`RankLinker.process_shifts`, :func:`shift_op_ids`), and their CUPTI correlation ids,
  which each process also numbers from 1, likewise (:func:`shift_correlation`);
* ``api.op_id``: the op whose external id the call carries, else the innermost op
  on the same thread whose interval contains the call;
* ``kernel|memcpy|memset.op_id``: the op of the API call with the same
  correlation id, else the op with the activity's external id;
* ``op.module``: the innermost ``nn.Module`` frame around a forward op, joined to
  its root module into a path; backward ops inherit the module of the forward op
  with the same sequence number (autograd's link);
* ``op.call_site``: the innermost Python frame outside torch/pastaprof.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pastaprof.events.schema import conform, empty
from pastaprof.processor.intervals import group_codes, innermost_enclosing, parents

LIBRARY_PREFIXES = ("torch/", "pastaprof/", "<", "threading.py", "contextlib.py", "functools.py", "runpy.py")
BACKWARD_PREFIX = "autograd::engine::evaluate_function: "


def _np(col: pa.ChunkedArray | pa.Array, fill: int = -1) -> np.ndarray:
    return np.asarray(pc.fill_null(col, fill).to_numpy(zero_copy_only=False), dtype=np.int64)


def _col(t: pa.Table, name: str) -> np.ndarray:
    """An integer column as int64 NumPy (null -> -1); a column the table lacks reads as all -1."""
    return _np(t[name]) if name in t.column_names else np.full(t.num_rows, -1, dtype=np.int64)


def _set(t: pa.Table, name: str, values: pa.Array) -> pa.Table:
    i = t.schema.get_field_index(name)
    return t.set_column(i, name, values) if i >= 0 else t.append_column(name, values)


def _ids_to_arrow(idx: np.ndarray) -> pa.Array:
    return pa.array(idx, pa.int64(), mask=idx < 0)


def _gather(values: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """values[idx] where idx >= 0, else -1 (``values`` may be empty)."""
    out = np.full(len(idx), -1, dtype=np.int64)
    ok = idx >= 0
    if ok.any():
        out[ok] = values[idx[ok]]
    return out


def map_keys(keys: np.ndarray, table_keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    """values[j] where table_keys[j] == keys[i] (first match), else -1; keys < 0 never match."""
    out = np.full(len(keys), -1, dtype=np.int64)
    valid_t = table_keys >= 0
    if not valid_t.any() or len(keys) == 0:
        return out
    tk = table_keys[valid_t]
    tv = values[valid_t]
    if len(tk) > 1 and not (tk[1:] >= tk[:-1]).all():  # correlation ids mostly come in order:
        order = np.argsort(tk, kind="stable")          # the sort is then skipped (1M keys: 49 -> ~5 ms)
        tk, tv = tk[order], tv[order]
    pos = np.searchsorted(tk, keys)
    posc = np.clip(pos, 0, len(tk) - 1)
    hit = (keys >= 0) & (tk[posc] == keys)
    out[hit] = tv[posc[hit]]
    return out


def _thread_groups(*tables: pa.Table) -> list[np.ndarray]:
    """Shared (pid, tid) group codes across several tables: the codes
    ``group_codes(concatenated pids, concatenated tids)`` gives (each pair's rank among
    the distinct pairs), found per table by hashing one packed key and ranking only the
    few distinct pairs of all tables together."""
    pids = [_col(t, "pid") for t in tables]
    tids = [_col(t, "tid") for t in tables]
    lo, hi = -(1 << 31), 1 << 31
    if not all(len(a) == 0 or (int(a.min()) >= lo and int(a.max()) < hi) for a in (*pids, *tids)):
        codes = group_codes(np.concatenate(pids), np.concatenate(tids))
        bounds = np.cumsum([0, *[len(p) for p in pids]])
        return [codes[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
    uniq, inv = [], []
    for p, t in zip(pids, tids):  # (pid, tid) order is the packed key's order
        enc = pc.dictionary_encode(pa.array((p << 32) + (t - lo)))
        uniq.append(enc.dictionary.to_numpy())
        inv.append(enc.indices.to_numpy())
    distinct = np.unique(np.concatenate(uniq)) if uniq else np.zeros(0, np.int64)
    return [np.searchsorted(distinct, u)[i].astype(np.int64) for u, i in zip(uniq, inv)]


def link_ops(op: pa.Table, first_id: int = 0) -> pa.Table:
    """Assign ids (``first_id``, ``first_id`` + 1, ...), parents and depths to ops."""
    n = op.num_rows
    op = _set(op, "id", pa.array(np.arange(first_id, first_id + n, dtype=np.int64)))
    (g,) = _thread_groups(op)
    parent, depth = parents(g, _np(op["start_ns"]), _np(op["end_ns"]))
    op = _set(op, "parent_id", _ids_to_arrow(np.where(parent >= 0, parent + first_id, -1)))
    op = _set(op, "depth", pa.array(depth, pa.int32()))
    return op


#: How far an API call may start outside the op its external id names and still be that op's
#: (integer-microsecond traces round both ends).
EXTERNAL_SLACK_NS = 1_000


def link_api(api: pa.Table, op: pa.Table) -> pa.Table:
    """op_id of API calls: the op with their external id where that op (of the same process)
    is open when the call starts, else the innermost op around them on their thread.  The
    check matters where a trace numbers its calls' external ids apart from its ops' (ROCm
    traces: a call's is its correlation id): once the two counters meet, an id names an op
    the call has nothing to do with."""
    op_start, op_end, api_start = _np(op["start_ns"]), _np(op["end_ns"]), _np(api["start_ns"])
    ext = map_keys(_col(api, "external_id"), _np(op["external_id"]), np.arange(op.num_rows, dtype=np.int64))
    hit = ext >= 0
    if hit.any():
        j, t = ext[hit], api_start[hit]
        inside = (op_start[j] - EXTERNAL_SLACK_NS <= t) & (t <= op_end[j] + EXTERNAL_SLACK_NS)
        inside &= _col(op, "pid")[j] == _col(api, "pid")[hit]
        hit[hit] = inside
    ext_op = np.where(hit, _gather(_np(op["id"]), ext), -1)
    g_api, g_op = _thread_groups(api, op)
    by_time = innermost_enclosing(g_op, op_start, op_end, g_api, api_start)
    by_time = _gather(_np(op["id"]), by_time)
    return _set(api, "op_id", _ids_to_arrow(np.where(ext_op >= 0, ext_op, by_time)))


def link_activity(act: pa.Table, api: pa.Table, op: pa.Table) -> pa.Table:
    """op_id of GPU work: through its launching API call, else its external id."""
    via_api = map_keys(_col(act, "correlation"), _col(api, "correlation"), _col(api, "op_id"))
    via_ext = map_keys(_col(act, "external_id"), _np(op["external_id"]), _np(op["id"]))
    return _set(act, "op_id", _ids_to_arrow(np.where(via_api >= 0, via_api, via_ext)))


def _is_library(files: pa.ChunkedArray) -> np.ndarray:
    """Whether each frame's file is torch's, pastaprof's or the interpreter's (a null file
    counts as ``<none>``).  Judged once per distinct file: the column is dictionary-encoded."""
    parts = []
    for chunk in files.chunks:
        if pa.types.is_dictionary(chunk.type) and len(chunk.dictionary):
            lib = _library_values(chunk.dictionary)[_np(chunk.indices, 0)]
            lib[chunk.indices.is_null().to_numpy(zero_copy_only=False)] = True  # a null file reads "<none>"
            parts.append(lib)
        else:
            parts.append(_library_values(chunk))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=bool)


def _library_values(files: pa.Array) -> np.ndarray:
    files = pc.fill_null(files.cast(pa.string()), "<none>")
    lib = np.zeros(len(files), dtype=bool)
    for p in LIBRARY_PREFIXES:
        lib |= pc.starts_with(files, p).to_numpy(zero_copy_only=False)
    for part in ("site-packages/torch/", "/pastaprof/"):
        lib |= pc.match_substring(files, part).to_numpy(zero_copy_only=False)
    return lib


def module_paths(frame: pa.Table, idx: np.ndarray) -> pa.Array:
    """Path from the root module ('A_0/B_0/C_1') of each module frame in ``idx``."""
    if len(idx) == 0:
        return pa.array([], pa.string())
    sub = frame.take(idx)
    (g,) = _thread_groups(sub)
    par, _ = parents(g, _np(sub["start_ns"]), _np(sub["end_ns"]))
    names = np.asarray(sub["function"].cast(pa.string()).to_pylist(), dtype=object)
    resolved = names.copy()
    anc = par.copy()
    pending = anc >= 0
    while pending.any():  # one pass per level of module nesting
        resolved[pending] = names[anc[pending]] + "/" + resolved[pending]
        anc = np.where(pending, par[np.clip(anc, 0, None)], -1)
        pending = anc >= 0
    return pa.array(resolved, pa.string())


def _take_or_null(values: pa.Array, hit: np.ndarray) -> pa.Array:
    return values.take(pa.array(hit, pa.int64(), mask=hit < 0))


def place_ops(op: pa.Table, frame: pa.Table) -> pa.Table:
    """Fill op.module, op.call_site and op.is_backward."""
    n = op.num_rows
    op_names = op["name"].cast(pa.string())
    is_eval = pc.fill_null(pc.starts_with(op_names, BACKWARD_PREFIX), False).to_numpy(zero_copy_only=False)
    ostart, oend = _np(op["start_ns"]), _np(op["end_ns"])
    module_hit = np.full(n, -1, dtype=np.int64)
    mod_paths = pa.array([], pa.string())
    call_site = pa.nulls(n, pa.string())
    if frame.num_rows and n:
        g_fr, g_op = _thread_groups(frame, op)
        fstart, fend = _np(frame["start_ns"]), _np(frame["end_ns"])
        is_mod = pc.fill_null(frame["is_module"], False).to_numpy(zero_copy_only=False)
        mod_idx = np.nonzero(is_mod)[0]
        mod_paths = module_paths(frame, mod_idx)
        module_hit = innermost_enclosing(g_fr[mod_idx], fstart[mod_idx], fend[mod_idx], g_op, ostart)
        usr_idx = np.nonzero(~is_mod & ~_is_library(frame["file"]))[0]
        hit = innermost_enclosing(g_fr[usr_idx], fstart[usr_idx], fend[usr_idx], g_op, ostart)
        call_site = _take_or_null(frame["name"].cast(pa.string()).combine_chunks(), _gather(usr_idx, hit))
    (g_op,) = _thread_groups(op)
    # Backward: the evaluate_function ops of autograd and everything inside them.
    ev_idx = np.nonzero(is_eval)[0]
    inside = innermost_enclosing(g_op[ev_idx], ostart[ev_idx], oend[ev_idx], g_op, ostart)
    is_bwd = is_eval | (inside >= 0)
    # They take the module of the forward op that has their evaluate op's sequence number.
    if len(ev_idx):
        seq = _np(op["sequence_id"])
        fwd_idx = np.nonzero(~is_bwd & (seq >= 0) & (module_hit >= 0))[0]
        ev_of = _gather(ev_idx, inside)
        ev_of[is_eval] = np.nonzero(is_eval)[0]
        need = np.nonzero(is_bwd & (ev_of >= 0))[0]
        src = map_keys(seq[ev_of[need]], seq[fwd_idx], fwd_idx)
        got = src >= 0
        module_hit[need[got]] = module_hit[src[got]]
    op = _set(op, "module", _take_or_null(mod_paths, module_hit))
    op = _set(op, "call_site", call_site)
    op = _set(op, "is_backward", pa.array(is_bwd, pa.bool_()))
    return op


def link_rank(tables: dict[str, pa.Table], first_id: int = 0) -> dict[str, pa.Table]:
    """Link one rank's tables (see module docstring); returns new tables.  Op ids start at
    ``first_id`` (every op_id and parent_id refers to them): a later capture file of a rank
    starts after the earlier files' ids (:class:`RankLinker`).

    Total over partial input: any subset of kinds, any of them empty, columns
    missing (they read as null).  Without ``op`` (an import of only some kinds)
    there is nothing to link; a kind it needs that is absent counts as empty and
    is not added to the result."""
    t = dict(tables)
    if "op" not in t:
        return t
    op = link_ops(conform("op", t["op"]), first_id)
    op = place_ops(op, conform("frame", t["frame"]) if "frame" in t else empty("frame"))
    api = link_api(t["api"] if "api" in t else empty("api"), op)
    for kind in ("kernel", "memcpy", "memset"):
        if kind in t:
            t[kind] = link_activity(t[kind], api, op)
    if "collective" in t:
        coll = t["collective"]  # its external id is the importer's, not in the schema
        t["collective"] = _set(coll, "op_id", _ids_to_arrow(
            map_keys(_col(coll, "external_id"), _np(op["external_id"]), _np(op["id"]))))
    t["op"] = op
    if "api" in t:
        t["api"] = api
    return t


class RankLinker:
    """Links the capture files of ranks as they come, one file at a time (an import yields a
    rank's files one after another; a profiler ``schedule`` writes one per cycle).  Each file is
    linked on its own -- an op's parent, a kernel's op are of its own file -- and numbered after
    the files of its rank linked before it, so that op ids (and the parent_id / op_id that refer
    to them) stay unique in the rank once its files are joined.  The one place import, analyze
    and load of a foreign trace number a rank's ops (live captures number theirs at the source, per process)."""

    def __init__(self) -> None:
        self._next: dict[int, int] = {}
        self._correlation_top: dict[int, int] = {}

    def __call__(self, rank: int, tables: dict[str, pa.Table]) -> dict[str, pa.Table]:
        first = self._next.get(rank, 0)
        out = link_rank(tables, first)
        if "op" in out:
            self._next[rank] = first + out["op"].num_rows
        return self._after_earlier_correlations(rank, out)

    def _after_earlier_correlations(self, rank: int, tables: dict[str, pa.Table]) -> dict[str, pa.Table]:
        """The file's correlation ids past those of its rank's earlier files where they meet
        (a process's second profiler session may number its launches from where the first
        began): tools join a kernel to its call on (rank, correlation).  The file's own links
        are made before, so they hold either way."""
        lo, hi = None, None
        for t in tables.values():
            if "correlation" in t.column_names and t.num_rows and t["correlation"].null_count < t.num_rows:
                c = _np(t["correlation"])
                c = c[c >= 0]
                if len(c):
                    lo = int(c.min()) if lo is None else min(lo, int(c.min()))
                    hi = int(c.max()) if hi is None else max(hi, int(c.max()))
        if lo is None:
            return tables
        top = self._correlation_top.get(rank)
        shift = top + 1 - lo if top is not None and lo <= top else 0
        self._correlation_top[rank] = hi + shift if top is None else max(top, hi + shift)
        return {k: shift_correlation(t, shift) for k, t in tables.items()} if shift else tables

    @staticmethod
    def process_shifts(ops: dict[int, list[pa.Table]]) -> dict[int, int]:
        """A live rank's processes, each with ids of its own numbering (one counter per process:
        a forked child goes on from the parent's count at the fork, as the parent does; a spawned
        child starts at 1 again): per pid, what to add to its op ids (:func:`shift_op_ids`) so
        that they follow those of the processes before it -- processes in the order of their
        first op (then pid), the first never shifted, nor one whose ids already start past the
        earlier ones'.  ``ops``: per pid, its op tables (``id``, ``start_ns``).  Pids without an
        op id are left out; a rank of one process gets ``{}``."""
        spans = {}
        for pid, tables in ops.items():
            ids = [_np(t["id"], 0)[~np.asarray(pc.is_null(t["id"]))] for t in tables
                   if "id" in t.column_names and t.num_rows]
            ids = np.concatenate(ids) if ids else np.zeros(0, np.int64)
            if not len(ids):
                continue
            starts = [pc.min(t["start_ns"]).as_py() for t in tables if "start_ns" in t.column_names and t.num_rows]
            spans[pid] = (min((s for s in starts if s is not None), default=None), int(ids.min()), int(ids.max()))
        return shifts_past(spans)


def shifts_past(spans: dict[int, tuple[int | None, int, int]]) -> dict[int, int]:
    """Per process (pid -> (first time or None, lowest id, highest id) of ids it numbered on its
    own: op ids, CUPTI correlation ids), what to add to its ids so that they follow those of the
    processes before it -- in the order of their first time (then pid), the first never shifted,
    nor one whose ids already start past the earlier ones'.  Fewer than two processes: ``{}``."""
    if len(spans) < 2:
        return {}
    order = sorted((first is None, first or 0, pid, lo, hi) for pid, (first, lo, hi) in spans.items())
    shifts: dict[int, int] = {}
    top = order[0][4]
    for _, _, pid, lo, hi in order[1:]:
        shift = max(0, top + 1 - lo)
        if shift:
            shifts[pid] = shift
        top = max(top, hi + shift)
    return shifts


#: Per kind, the columns that hold op ids (``op.external_id`` too where it equals the op's id,
#: as live captures store it; ``external``: a live capture's external-correlation records, whose
#: external id is the op's id).
OP_ID_COLUMNS = {"op": ("id", "parent_id"), "api": ("op_id",), "kernel": ("op_id",), "memcpy": ("op_id",),
                 "memset": ("op_id",), "collective": ("op_id",), "external": ("external_id",)}


def shift_correlation(t: pa.Table, shift: int) -> pa.Table:
    """``t`` (of one process) with ``shift`` added to its correlation ids (nulls stay null): CUPTI
    numbers each process's launches from 1, so two CUDA processes of one rank (a shell script's
    two programs, a launcher's children without RANK) would join each other's calls and kernels
    on (rank, correlation).  A shift of 0, a table without the column: ``t`` itself."""
    i = t.schema.get_field_index("correlation")
    if not shift or i < 0 or not t.num_rows:
        return t
    field = t.schema.field(i)
    return t.set_column(i, field, pc.add(t["correlation"].cast(pa.int64()), pa.scalar(int(shift), pa.int64()))
                        .cast(field.type))


def shift_op_ids(kind: str, t: pa.Table, shift: int) -> pa.Table:
    """``t`` (of one process) with ``shift`` added to every op id it holds (:data:`OP_ID_COLUMNS`;
    nulls stay null).  A shift of 0, a kind without op ids: ``t`` itself."""
    cols = OP_ID_COLUMNS.get(kind, ())
    if not shift or not t.num_rows or not any(c in t.column_names for c in cols):
        return t
    by = pa.scalar(int(shift), pa.int64())

    def put(t: pa.Table, name: str, values) -> pa.Table:  # the column's field (type, nullability) kept
        i = t.schema.get_field_index(name)
        field = t.schema.field(i)
        return t.set_column(i, field, values.cast(field.type))

    def col(name: str):
        return t[name].cast(pa.int64())

    if kind == "op" and "external_id" in t.column_names and "id" in t.column_names:
        same = pc.fill_null(pc.equal(col("external_id"), col("id")), False)
        t = put(t, "external_id", pc.if_else(same, pc.add(col("external_id"), by), col("external_id")))
    for c in cols:
        if c in t.column_names:
            t = put(t, c, pc.add(col(c), by))
    return t
