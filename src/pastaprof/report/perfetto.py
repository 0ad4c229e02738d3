"""Export a Run as a Perfetto trace: a protobuf ``Trace`` of ``TracePacket`` s (TrackEvent).

``write_perfetto(run, path)`` writes (``path`` ending in ``.gz``: gzip-compressed,
which Perfetto reads as well):

* a process track per host process (rank, pid) with one thread track per
  (rank, pid, tid), carrying the ops (kind ``op``) as nested slices;
* a parent track per GPU (rank, device) with one track per stream, carrying the
  kernels, memcpys and memsets as slices named after the activity;
* a flow from each op to every GPU activity whose ``op_id`` names it (same rank);
* a "probes" track per (rank, pid, tid) under its process, carrying the calls of
  eBPF-probed functions (kind ``probe``, docs/probes.md) as slices named after the probe;
* a counter track per (rank, device) of the allocated bytes from ``tensor``
  events (``total_allocated``, or the running sum of ``bytes`` where it is null);
  device -1 is the host allocator ("CPU memory allocated").

Wire format.  All events travel on one trusted packet sequence: the first packet
clears the incremental state and carries the interned event names
(``InternedData.event_names``); every slice-begin packet refers to its name by
``name_iid`` and sets ``SEQ_NEEDS_INCREMENTAL_STATE``.  Slices are
``TYPE_SLICE_BEGIN`` / ``TYPE_SLICE_END`` pairs with absolute ``start_ns`` /
``end_ns`` timestamps (the default trace clock); flows use ``flow_ids`` on the
op's begin and ``terminating_flow_ids`` on the activity's begin, one flow id per
activity.  The field numbers are those of Perfetto's protos; the subset used is
written out in ``perfetto_trace_subset.proto`` beside this file.

Nesting.  Perfetto needs the slices of one track to be laminar (a slice that
starts inside another ends inside it).  ``nesting.Nested`` sorts each track's
intervals (ops by start, longest first, then recorded depth and id), clamps a
child that outlives the slice enclosing it (counted as ``clamped``) and derives
the begin/end sequence, ties at one timestamp ordered as Perfetto must see them.
Ops are written before GPU work so that a flow never ends before it begins.

Speed.  Packets are encoded in bulk with NumPy (``protowire``), with no Python
object per event: each field of a chunk of events is a padded (events x bytes)
matrix with a validity mask, and one boolean gather yields the framed packets.
This module only lays out the Perfetto messages (``_track_event_packets``) and
sizes the chunks.  Events are written rank by rank and chunk by chunk, to a
temp file renamed into place at the end (``store.outputs``: a pipe or device is written into).

Modules.  ``protowire`` is the generic wire-format encoder (nothing Perfetto
in it), ``nesting`` the laminar begin/end ordering of intervals; this module
holds what is Perfetto's: field numbers, tracks, interned names, slices,
flows, counters and ``write_perfetto``.
"""

from __future__ import annotations

import gzip
from contextlib import nullcontext
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pastaprof.events.schema import GPU_ACTIVITY_KINDS
from pastaprof.report.nesting import Nested
from pastaprof.report.protowire import (
    assemble,
    fbytes,
    fint,
    fstr,
    lfield,
    p_const,
    p_field,
    p_fixed64s,
    p_lens,
    p_varint,
    rowcat,
    tag,
    vfield,
)
from pastaprof.store.outputs import open_output

# --- Perfetto field numbers (see perfetto_trace_subset.proto) -------------------------------
TRACE_PACKET = 1                     # Trace.packet
PKT_TIMESTAMP = 8                    # TracePacket.timestamp (uint64)
PKT_SEQUENCE_ID = 10                 # TracePacket.trusted_packet_sequence_id (uint32)
PKT_TRACK_EVENT = 11                 # TracePacket.track_event
PKT_INTERNED_DATA = 12               # TracePacket.interned_data
PKT_SEQUENCE_FLAGS = 13              # TracePacket.sequence_flags (uint32)
PKT_TRACK_DESCRIPTOR = 60            # TracePacket.track_descriptor
TE_TYPE = 9                          # TrackEvent.type
TE_NAME_IID = 10                     # TrackEvent.name_iid
TE_TRACK_UUID = 11                   # TrackEvent.track_uuid
TE_COUNTER_VALUE = 30                # TrackEvent.counter_value (int64)
TE_FLOW_IDS = 47                     # TrackEvent.flow_ids (repeated fixed64)
TE_TERMINATING_FLOW_IDS = 48         # TrackEvent.terminating_flow_ids (repeated fixed64)
ID_EVENT_NAMES = 2                   # InternedData.event_names
EN_IID = 1                           # EventName.iid
EN_NAME = 2                          # EventName.name
TD_UUID = 1                          # TrackDescriptor.uuid
TD_NAME = 2                          # TrackDescriptor.name
TD_PROCESS = 3                       # TrackDescriptor.process
TD_THREAD = 4                        # TrackDescriptor.thread
TD_PARENT_UUID = 5                   # TrackDescriptor.parent_uuid
TD_COUNTER = 8                       # TrackDescriptor.counter
TD_CHILD_ORDERING = 11               # TrackDescriptor.child_ordering
TD_SIBLING_ORDER_RANK = 12           # TrackDescriptor.sibling_order_rank
PD_PID = 1                           # ProcessDescriptor.pid
PD_PROCESS_NAME = 6                  # ProcessDescriptor.process_name
THD_PID = 1                          # ThreadDescriptor.pid
THD_TID = 2                          # ThreadDescriptor.tid
THD_THREAD_NAME = 5                  # ThreadDescriptor.thread_name
CD_UNIT = 3                          # CounterDescriptor.unit

TYPE_SLICE_BEGIN, TYPE_SLICE_END, TYPE_COUNTER = 1, 2, 4
SEQ_INCREMENTAL_STATE_CLEARED, SEQ_NEEDS_INCREMENTAL_STATE = 1, 2
UNIT_SIZE_BYTES = 3
CHILD_ORDERING_EXPLICIT = 3

#: trusted_packet_sequence_id of every packet pastaprof writes.
SEQUENCE_ID = 1
UNNAMED = "(unnamed)"

_CHUNK = 1 << 19                     # events encoded per NumPy batch
_CHUNK_BYTES = 1 << 26               # ... or fewer, to keep a batch's padded matrices about this size
_INTERNED_PACKET_BYTES = 1 << 20     # split the interned names into packets of about this size
_PID_STRIDE = 1 << 22                # offset that disambiguates a pid seen on two ranks (Linux pid_max)
_INT32_MAX = (1 << 31) - 1


# --- packets --------------------------------------------------------------------------------

def _packet(body: bytes) -> bytes:
    """A TracePacket framed as one ``Trace.packet`` entry."""
    return fbytes(TRACE_PACKET, fint(PKT_SEQUENCE_ID, SEQUENCE_ID) + body)


def _track_event_packets(ts: np.ndarray, etype: np.ndarray, uuid: np.ndarray, *,
                         name_iid: np.ndarray | None = None, begin: np.ndarray | None = None,
                         counter: np.ndarray | None = None,
                         flows: tuple[np.ndarray, np.ndarray] | None = None,
                         terminating: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """Framed TracePackets, one per row.  ``begin``: the rows that carry ``name_iid``
    (and so need the interned state); ``flows`` / ``terminating``: (counts, first id)."""
    n = len(ts)
    te = p_field(TE_TYPE, etype) + p_field(TE_TRACK_UUID, uuid)
    if name_iid is not None:
        te += p_field(TE_NAME_IID, name_iid, begin)
    if counter is not None:
        te += p_field(TE_COUNTER_VALUE, counter)
    if flows is not None:
        te += p_fixed64s(TE_FLOW_IDS, *flows)
    if terminating is not None:
        te += p_fixed64s(TE_TERMINATING_FLOW_IDS, *terminating)
    pkt = [*p_field(PKT_TIMESTAMP, ts), p_const(fint(PKT_SEQUENCE_ID, SEQUENCE_ID), n)]
    if begin is not None:
        pkt.append(p_const(fint(PKT_SEQUENCE_FLAGS, SEQ_NEEDS_INCREMENTAL_STATE), n, begin))
    pkt += [p_const(tag(PKT_TRACK_EVENT, 2), n), p_varint(p_lens(te)), *te]
    return assemble([p_const(tag(TRACE_PACKET, 2), n), p_varint(p_lens(pkt)), *pkt])


def _chunks(counts: np.ndarray):
    """Event ranges [a, b) to encode at once: _CHUNK events, fewer around events with
    many flows (``counts``), so that the padded layout stays near _CHUNK_BYTES."""
    n, a = len(counts), 0
    while a < n:
        b = min(a + _CHUNK, n)
        while True:
            m = int(counts[a:b].max())
            size = _CHUNK_BYTES // (80 + 20 * m)
            if b - a <= max(size, 1):
                break
            b = a + max(size, 1)
        yield a, b
        a = b


# --- interned names -------------------------------------------------------------------------

class _Names:
    """The event names of the exported kinds, interned 1..n."""

    def __init__(self, columns: list[pa.ChunkedArray]) -> None:
        used: list[pa.Array] = []
        self.has_null = False
        for col in columns:
            for chunk in col.chunks:
                if len(chunk) == 0:
                    continue
                idx = _np(chunk.indices)
                self.has_null |= bool((idx < 0).any())
                keep = np.bincount(idx[idx >= 0], minlength=len(chunk.dictionary)) > 0
                values = chunk.dictionary.cast(pa.string()).filter(pa.array(keep))
                self.has_null |= values.null_count > 0
                used.append(values.drop_null())
        table = pc.unique(pa.concat_arrays(used)) if used else pa.array([], pa.string())
        if self.has_null and pc.index(table, UNNAMED).as_py() < 0:
            table = pa.concat_arrays([table, pa.array([UNNAMED])])
        self.table: pa.Array = table
        self.unnamed = (pc.index(table, UNNAMED).as_py() + 1) if self.has_null else 0

    def __len__(self) -> int:
        return len(self.table)

    def iids(self, col: pa.ChunkedArray) -> np.ndarray:
        """The iid of each value of a dictionary-encoded name column."""
        if col.num_chunks == 0:
            return np.zeros(0, np.int64)
        col = col.unify_dictionaries() if col.num_chunks > 1 else col
        pos = _np(pc.index_in(col.chunk(0).dictionary.cast(pa.string()), value_set=self.table))
        m = np.where(pos >= 0, pos + 1, self.unnamed)
        idx = _np(pa.chunked_array([c.indices for c in col.chunks], col.type.index_type))
        return np.where(idx >= 0, m[np.maximum(idx, 0)] if len(m) else 0, self.unnamed)

    def packets(self) -> list[bytes]:
        """InternedData packets; the first one (always written) clears the incremental state."""
        n = len(self.table)
        if n == 0:
            return [_packet(fint(PKT_SEQUENCE_FLAGS, SEQ_INCREMENTAL_STATE_CLEARED))]
        arr = self.table.cast(pa.large_string())
        offsets = np.frombuffer(arr.buffers()[1], np.int64)[arr.offset:arr.offset + n + 1]
        text = (np.frombuffer(arr.buffers()[2], np.uint8)[offsets[0]:offsets[-1]], np.diff(offsets))
        names = rowcat([vfield(EN_IID, np.arange(1, n + 1)), *lfield(EN_NAME, text)], n)
        entries, lens = rowcat(lfield(ID_EVENT_NAMES, names), n)
        ends = np.cumsum(lens)
        out: list[bytes] = []
        first = start = 0
        while first < n:
            stop = max(int(np.searchsorted(ends, start + _INTERNED_PACKET_BYTES, "right")), first + 1)
            end = int(ends[stop - 1])
            flags = SEQ_NEEDS_INCREMENTAL_STATE if out else SEQ_INCREMENTAL_STATE_CLEARED
            out.append(_packet(fint(PKT_SEQUENCE_FLAGS, flags)
                               + fbytes(PKT_INTERNED_DATA, entries[start:end].tobytes())))
            first, start = stop, end
        return out


# --- helpers --------------------------------------------------------------------------------

def _np(col: pa.ChunkedArray | pa.Array, fill: int = -1) -> np.ndarray:
    return np.asarray(pc.fill_null(col, fill).to_numpy(zero_copy_only=False), dtype=np.int64)


def _of_rank(t: pa.Table, rank: int, single: bool) -> pa.Table:
    return t if single else t.filter(pc.equal(t["rank"], pa.scalar(rank, pa.int32())))


def _distinct(t: pa.Table, cols: list[str]) -> list[tuple[int, ...]]:
    if t.num_rows == 0:
        return []
    d = pa.table({c: pc.fill_null(t[c], -1) for c in cols}).group_by(cols).aggregate([])
    return sorted(zip(*(d[c].to_pylist() for c in cols), strict=True))


class _Tracks:
    """Track uuids and the TrackDescriptor packets of the run."""

    def __init__(self, ops: pa.Table, gpu: pa.Table, tensor: pa.Table, multi: bool, devices: dict[int, str],
                 probe: pa.Table | None = None) -> None:
        self.packets: list[bytes] = []
        self._next = 0
        self.multi = multi
        self.devices = devices
        self.process: dict[tuple[int, int], int] = {}
        self.thread: dict[tuple[int, int, int], int] = {}
        self.gpu: dict[tuple[int, int], int] = {}
        self.stream: dict[tuple[int, int, int], int] = {}
        self.memory: dict[tuple[int, int], int] = {}
        self.probes: dict[tuple[int, int, int], int] = {}
        self.counts = {"thread_tracks": 0, "gpu_tracks": 0, "counter_tracks": 0}
        self._offsets: dict[tuple[int, int], int] = {}
        self._taken: set[int] = set()
        for rank, pid, tid in _distinct(ops, ["rank", "pid", "tid"]):
            self._ensure_process(rank, pid)
            self.thread[(rank, pid, tid)] = self._thread(rank, pid, tid, self._offsets[(rank, pid)])
        for rank, pid, tid in _distinct(probe, ["rank", "pid", "tid"]) if probe is not None else ():
            self._ensure_process(rank, pid)
            self.counts["thread_tracks"] += 1
            self.probes[(rank, pid, tid)] = self._emit(self._uuid(), fint(TD_PARENT_UUID, self.process[(rank, pid)])
                                                       + fstr(TD_NAME, f"probes tid {tid}"))
        for rank, device, stream in _distinct(gpu, ["rank", "device", "stream"]):
            self.stream[(rank, device, stream)] = self._stream(rank, device, stream)
        for rank, device in _distinct(tensor, ["rank", "device"]):
            self.memory[(rank, device)] = self._memory(rank, device)

    def _ensure_process(self, rank: int, pid: int) -> None:
        if (rank, pid) not in self.process:
            offset = 0
            while pid >= 0 and pid + offset in self._taken:
                offset += _PID_STRIDE
            self._taken.add(pid + offset)
            self._offsets[(rank, pid)] = offset
            self.process[(rank, pid)] = self._process(rank, pid, offset)

    def _uuid(self) -> int:
        self._next += 1
        return self._next

    def _emit(self, uuid: int, body: bytes) -> int:
        self.packets.append(_packet(fbytes(PKT_TRACK_DESCRIPTOR, fint(TD_UUID, uuid) + body)))
        return uuid

    def _rank(self, rank: int) -> str:
        return f"rank {rank} " if self.multi else ""

    def _process(self, rank: int, pid: int, offset: int) -> int:
        uuid = self._uuid()
        if 0 <= pid + offset <= _INT32_MAX:
            name = f"rank {rank}" + (f" (pid {pid})" if offset else "")
            return self._emit(uuid, fbytes(TD_PROCESS, fint(PD_PID, pid + offset) + fstr(PD_PROCESS_NAME, name)))
        return self._emit(uuid, fstr(TD_NAME, f"rank {rank} pid {pid}"))

    def _thread(self, rank: int, pid: int, tid: int, offset: int) -> int:
        uuid = self._uuid()
        self.counts["thread_tracks"] += 1
        parent = fint(TD_PARENT_UUID, self.process[(rank, pid)])
        if 0 <= pid + offset <= _INT32_MAX and 0 <= tid + offset <= _INT32_MAX:
            thread = fint(THD_PID, pid + offset) + fint(THD_TID, tid + offset)
            if offset:
                thread += fstr(THD_THREAD_NAME, f"tid {tid}")
            return self._emit(uuid, parent + fbytes(TD_THREAD, thread))
        return self._emit(uuid, parent + fstr(TD_NAME, f"thread {tid}" if tid >= 0 else "ops"))

    def _gpu(self, rank: int, device: int) -> int:
        if (rank, device) not in self.gpu:
            name = f"{self._rank(rank)}GPU {device}"
            if not self.multi and device in self.devices:
                name += f" ({self.devices[device]})"
            body = fstr(TD_NAME, name) + fint(TD_CHILD_ORDERING, CHILD_ORDERING_EXPLICIT)
            self.gpu[(rank, device)] = self._emit(self._uuid(), body)
        return self.gpu[(rank, device)]

    def _stream(self, rank: int, device: int, stream: int) -> int:
        parent = self._gpu(rank, device)
        self.counts["gpu_tracks"] += 1
        body = (fint(TD_PARENT_UUID, parent) + fstr(TD_NAME, f"Stream {stream}")
                + fint(TD_SIBLING_ORDER_RANK, max(min(stream, _INT32_MAX), -_INT32_MAX)))
        return self._emit(self._uuid(), body)

    def _memory(self, rank: int, device: int) -> int:
        self.counts["counter_tracks"] += 1
        if device >= 0:
            parent = fint(TD_PARENT_UUID, self._gpu(rank, device)) + fint(TD_SIBLING_ORDER_RANK, -_INT32_MAX)
            name = f"{self._rank(rank)}GPU {device} memory allocated"
        else:
            procs = [uuid for (r, _), uuid in self.process.items() if r == rank]
            parent = fint(TD_PARENT_UUID, procs[0]) if len(procs) == 1 else b""
            name = f"{self._rank(rank)}CPU memory allocated"
        body = parent + fstr(TD_NAME, name) + fbytes(TD_COUNTER, fint(CD_UNIT, UNIT_SIZE_BYTES))
        return self._emit(self._uuid(), body)


def _gpu_table(run: Any) -> tuple[pa.Table, list[int]]:
    cols = ["start_ns", "end_ns", "rank", "device", "stream", "op_id", "name"]
    tables, sizes = [], []
    for kind in GPU_ACTIVITY_KINDS:
        tables.append(run.table(kind).select(cols))
        sizes.append(tables[-1].num_rows)
    return pa.concat_tables(tables), sizes


def _lookup(table: dict, keys: list[np.ndarray], rows: np.ndarray, rank: int) -> np.ndarray:
    return np.array([table[(rank, *(int(k[r]) for k in keys))] for r in rows.tolist()], np.int64)


# --- the export -----------------------------------------------------------------------------

def write_perfetto(run: Any, path: str | Path) -> dict[str, Any]:
    """Write ``run`` as a Perfetto trace at ``path`` (gzip-compressed when it ends in
    ``.gz``).  Returns what was written: slices per kind, flows, counter events,
    tracks, interned names, packets, file bytes, and ``clamped`` (slices shortened
    to nest inside their parent) and ``flows_skipped`` (activities whose op is
    missing or starts after the activity, which Perfetto could not draw)."""
    path = Path(path)
    ops = run.table("op").select(["start_ns", "end_ns", "rank", "pid", "tid", "id", "depth", "name"])
    gpu, sizes = _gpu_table(run)
    tensor = run.table("tensor").select(["start_ns", "rank", "device", "bytes", "total_allocated"])
    probe = run.table("probe").select(["start_ns", "end_ns", "rank", "pid", "tid", "name"])
    ranks = sorted(set().union(*(pc.unique(t["rank"]).to_pylist() for t in (ops, gpu, tensor, probe))))
    single = len(ranks) <= 1
    devices: dict[int, str] = {}
    for d in run.manifest.get("devices") or []:
        if isinstance(d, dict) and isinstance(d.get("id"), int) and d.get("name"):
            devices[d["id"]] = str(d["name"])
    names = _Names([ops["name"], gpu["name"], probe["name"]])
    tracks = _Tracks(ops, gpu, tensor, not single, devices, probe)
    counts: dict[str, Any] = {
        "ops": 0, **dict(zip(("kernels", "memcpys", "memsets"), sizes, strict=True)), "gpu_slices": 0, "probes": 0,
        "flows": 0, "flows_skipped": 0, "clamped": 0, "counter_events": 0, "memory_peaks": {},
        "tracks": len(tracks.packets), **tracks.counts, "interned_names": len(names), "packets": 0, "bytes": 0,
    }
    header = names.packets() + tracks.packets
    counts["packets"] += len(header)

    with open_output(path) as raw:
        sized = _Counted(raw)
        with gzip.GzipFile(fileobj=sized, mode="wb", filename="") if path.suffix == ".gz" else nullcontext(sized) as f:
            f.write(b"".join(header))
            next_flow = 1
            for rank in ranks:
                next_flow = _write_rank(f, rank, _of_rank(ops, rank, single), _of_rank(gpu, rank, single),
                                        names, tracks, next_flow, counts)
                _write_memory(f, rank, _of_rank(tensor, rank, single), tracks, counts)
                _write_probes(f, rank, _of_rank(probe, rank, single), names, tracks, counts)
    counts["bytes"] = sized.bytes
    return counts


class _Counted:
    """A file that counts the bytes written (the output may be a pipe: no size to stat)."""

    def __init__(self, f: Any) -> None:
        self._f = f
        self.bytes = 0

    def write(self, data: bytes) -> int:
        self._f.write(data)
        self.bytes += len(data)
        return len(data)

    def flush(self) -> None:
        self._f.flush()


def _write_rank(f: BinaryIO, rank: int, ops: pa.Table, gpu: pa.Table, names: _Names, tracks: _Tracks,
                next_flow: int, counts: dict[str, Any]) -> int:
    # ops, nested per thread
    pid, tid = _np(ops["pid"]), _np(ops["tid"])
    nest = Nested([pid, tid], _np(ops["start_ns"], 0), _np(ops["end_ns"], 0), [_np(ops["depth"], 0), _np(ops["id"])])
    op_uuid = _lookup(tracks.thread, [pid, tid], nest.group_rows, rank)[nest.group]
    op_iid = names.iids(ops["name"])[nest.order]

    # flows: activity -> position of its op; valid when the op begins no later than the activity
    n_gpu = gpu.num_rows
    g_start = _np(gpu["start_ns"], 0)
    op_id = _np(gpu["op_id"])
    ids = _np(ops["id"])
    linked = np.zeros(n_gpu, bool)
    op_pos = np.zeros(n_gpu, np.int64)
    if len(ids) and n_gpu:
        by_id = np.argsort(ids, kind="stable")
        row = by_id[np.minimum(np.searchsorted(ids[by_id], op_id), len(ids) - 1)]
        op_pos = nest.positions()[row]
        linked = (op_id >= 0) & (ids[row] == op_id) & (g_start >= nest.start[op_pos])
    counts["flows_skipped"] += int((op_id >= 0).sum() - linked.sum())
    act = np.flatnonzero(linked)
    act = act[np.argsort(op_pos[act], kind="stable")]
    fid = np.zeros(n_gpu, np.int64)
    fid[act] = next_flow + np.arange(len(act))
    flow_cnt = np.bincount(op_pos[act], minlength=ops.num_rows)
    flow_first = next_flow + np.cumsum(flow_cnt) - flow_cnt
    counts["flows"] += len(act)

    ev_flows = np.where(nest.ev_end, 0, flow_cnt[nest.ev_pos])
    for a, b in _chunks(ev_flows):
        pos, end = nest.ev_pos[a:b], nest.ev_end[a:b]
        f.write(_track_event_packets(
            np.where(end, nest.end[pos], nest.start[pos]), np.where(end, TYPE_SLICE_END, TYPE_SLICE_BEGIN),
            op_uuid[pos], name_iid=op_iid[pos], begin=~end, flows=(ev_flows[a:b], flow_first[pos])))
    counts["ops"] += ops.num_rows
    counts["clamped"] += nest.clamped
    counts["packets"] += len(nest.ev_pos)
    del nest, op_uuid, op_iid, flow_cnt, flow_first, ev_flows

    # GPU activities, per stream
    device, stream = _np(gpu["device"]), _np(gpu["stream"])
    gnest = Nested([device, stream], g_start, _np(gpu["end_ns"], 0), [np.arange(n_gpu)])
    g_uuid = _lookup(tracks.stream, [device, stream], gnest.group_rows, rank)[gnest.group]
    g_iid = names.iids(gpu["name"])[gnest.order]
    g_fid = fid[gnest.order]
    for a, b in _chunks(np.zeros(len(gnest.ev_pos), np.int64)):
        pos, end = gnest.ev_pos[a:b], gnest.ev_end[a:b]
        f.write(_track_event_packets(
            np.where(end, gnest.end[pos], gnest.start[pos]), np.where(end, TYPE_SLICE_END, TYPE_SLICE_BEGIN),
            g_uuid[pos], name_iid=g_iid[pos], begin=~end,
            terminating=((~end & (g_fid[pos] > 0)).astype(np.int64), g_fid[pos])))
    counts["gpu_slices"] += n_gpu
    counts["clamped"] += gnest.clamped
    counts["packets"] += len(gnest.ev_pos)
    return next_flow + len(act)


def _write_memory(f: BinaryIO, rank: int, tensor: pa.Table, tracks: _Tracks, counts: dict[str, Any]) -> None:
    n = tensor.num_rows
    if n == 0:
        return
    device = _np(tensor["device"])
    start = _np(tensor["start_ns"], 0)
    order = np.lexsort((start, device))
    device, start = device[order], start[order]
    has = pc.is_valid(tensor["total_allocated"]).to_numpy(zero_copy_only=False)[order]
    total = _np(tensor["total_allocated"], 0)[order]
    cs = np.cumsum(_np(tensor["bytes"], 0)[order])
    change = np.ones(n, bool)
    change[1:] = device[1:] != device[:-1]
    first = np.maximum.accumulate(np.where(change, np.arange(n), 0))     # first row of the group
    last = np.maximum.accumulate(np.where(has, np.arange(n), -1))        # last row with a total
    before = np.where(first > 0, cs[first - 1], 0)                        # bytes summed before the group
    known = last >= first
    lastc = np.maximum(last, 0)
    value = np.where(known, total[lastc] + cs - cs[lastc], cs - before)
    uuid = _lookup(tracks.memory, [device], np.flatnonzero(change), rank)[np.cumsum(change) - 1]
    for a, b in _chunks(np.zeros(n, np.int64)):
        f.write(_track_event_packets(start[a:b], np.full(b - a, TYPE_COUNTER), uuid[a:b], counter=value[a:b]))
    for d, i, j in zip(device[change].tolist(), np.flatnonzero(change).tolist(),
                       [*np.flatnonzero(change)[1:].tolist(), n], strict=True):
        counts["memory_peaks"][f"rank {rank} " + (f"GPU {d}" if d >= 0 else "CPU")] = int(value[i:j].max())
    counts["counter_events"] += n
    counts["packets"] += n


def _write_probes(f: BinaryIO, rank: int, probe: pa.Table, names: _Names, tracks: _Tracks,
                  counts: dict[str, Any]) -> None:
    """Probed calls as slices of their thread's "probes" track (nested calls of different
    probes nest; USDT firings are slices of no length)."""
    if probe.num_rows == 0:
        return
    pid, tid = _np(probe["pid"]), _np(probe["tid"])
    nest = Nested([pid, tid], _np(probe["start_ns"], 0), _np(probe["end_ns"], 0), [np.arange(probe.num_rows)])
    uuid = _lookup(tracks.probes, [pid, tid], nest.group_rows, rank)[nest.group]
    iid = names.iids(probe["name"])[nest.order]
    for a, b in _chunks(np.zeros(len(nest.ev_pos), np.int64)):
        pos, end = nest.ev_pos[a:b], nest.ev_end[a:b]
        f.write(_track_event_packets(np.where(end, nest.end[pos], nest.start[pos]),
                                     np.where(end, TYPE_SLICE_END, TYPE_SLICE_BEGIN), uuid[pos], name_iid=iid[pos],
                                     begin=~end))
    counts["probes"] += probe.num_rows
    counts["clamped"] += nest.clamped
    counts["packets"] += len(nest.ev_pos)
