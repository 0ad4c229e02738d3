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
``perfetto_wire`` lays out the Perfetto messages (``track_event_packets``) and
sizes the chunks.  Events are written rank by rank and chunk by chunk, to a
temp file renamed into place at the end (``store.outputs``: a pipe or device is written into).

Modules.  ``protowire`` is the generic wire-format encoder (nothing Perfetto
in it), ``nesting`` the laminar begin/end ordering of intervals,
``perfetto_wire`` Perfetto's field numbers, TrackEvent packets and interned
names, ``perfetto_tracks`` the track descriptors; this module holds the slices,
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
from pastaprof.report.perfetto_tracks import Tracks
from pastaprof.report.perfetto_wire import (
    TYPE_COUNTER,
    TYPE_SLICE_BEGIN,
    TYPE_SLICE_END,
    Names,
    as_int64,
    chunks,
    track_event_packets,
)
from pastaprof.store.outputs import open_output


def _of_rank(t: pa.Table, rank: int, single: bool) -> pa.Table:
    return t if single else t.filter(pc.equal(t["rank"], pa.scalar(rank, pa.int32())))


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
    names = Names([ops["name"], gpu["name"], probe["name"]])
    tracks = Tracks(ops, gpu, tensor, not single, devices, probe)
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


def _write_rank(f: BinaryIO, rank: int, ops: pa.Table, gpu: pa.Table, names: Names, tracks: Tracks,
                next_flow: int, counts: dict[str, Any]) -> int:
    # ops, nested per thread
    pid, tid = as_int64(ops["pid"]), as_int64(ops["tid"])
    nest = Nested([pid, tid], as_int64(ops["start_ns"], 0), as_int64(ops["end_ns"], 0), [as_int64(ops["depth"], 0), as_int64(ops["id"])])
    op_uuid = _lookup(tracks.thread, [pid, tid], nest.group_rows, rank)[nest.group]
    op_iid = names.iids(ops["name"])[nest.order]

    # flows: activity -> position of its op; valid when the op begins no later than the activity
    n_gpu = gpu.num_rows
    g_start = as_int64(gpu["start_ns"], 0)
    op_id = as_int64(gpu["op_id"])
    ids = as_int64(ops["id"])
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
    for a, b in chunks(ev_flows):
        pos, end = nest.ev_pos[a:b], nest.ev_end[a:b]
        f.write(track_event_packets(
            np.where(end, nest.end[pos], nest.start[pos]), np.where(end, TYPE_SLICE_END, TYPE_SLICE_BEGIN),
            op_uuid[pos], name_iid=op_iid[pos], begin=~end, flows=(ev_flows[a:b], flow_first[pos])))
    counts["ops"] += ops.num_rows
    counts["clamped"] += nest.clamped
    counts["packets"] += len(nest.ev_pos)
    del nest, op_uuid, op_iid, flow_cnt, flow_first, ev_flows

    # GPU activities, per stream
    device, stream = as_int64(gpu["device"]), as_int64(gpu["stream"])
    gnest = Nested([device, stream], g_start, as_int64(gpu["end_ns"], 0), [np.arange(n_gpu)])
    g_uuid = _lookup(tracks.stream, [device, stream], gnest.group_rows, rank)[gnest.group]
    g_iid = names.iids(gpu["name"])[gnest.order]
    g_fid = fid[gnest.order]
    for a, b in chunks(np.zeros(len(gnest.ev_pos), np.int64)):
        pos, end = gnest.ev_pos[a:b], gnest.ev_end[a:b]
        f.write(track_event_packets(
            np.where(end, gnest.end[pos], gnest.start[pos]), np.where(end, TYPE_SLICE_END, TYPE_SLICE_BEGIN),
            g_uuid[pos], name_iid=g_iid[pos], begin=~end,
            terminating=((~end & (g_fid[pos] > 0)).astype(np.int64), g_fid[pos])))
    counts["gpu_slices"] += n_gpu
    counts["clamped"] += gnest.clamped
    counts["packets"] += len(gnest.ev_pos)
    return next_flow + len(act)


def _write_memory(f: BinaryIO, rank: int, tensor: pa.Table, tracks: Tracks, counts: dict[str, Any]) -> None:
    n = tensor.num_rows
    if n == 0:
        return
    device = as_int64(tensor["device"])
    start = as_int64(tensor["start_ns"], 0)
    order = np.lexsort((start, device))
    device, start = device[order], start[order]
    has = pc.is_valid(tensor["total_allocated"]).to_numpy(zero_copy_only=False)[order]
    total = as_int64(tensor["total_allocated"], 0)[order]
    cs = np.cumsum(as_int64(tensor["bytes"], 0)[order])
    change = np.ones(n, bool)
    change[1:] = device[1:] != device[:-1]
    first = np.maximum.accumulate(np.where(change, np.arange(n), 0))     # first row of the group
    last = np.maximum.accumulate(np.where(has, np.arange(n), -1))        # last row with a total
    before = np.where(first > 0, cs[first - 1], 0)                        # bytes summed before the group
    known = last >= first
    lastc = np.maximum(last, 0)
    value = np.where(known, total[lastc] + cs - cs[lastc], cs - before)
    uuid = _lookup(tracks.memory, [device], np.flatnonzero(change), rank)[np.cumsum(change) - 1]
    for a, b in chunks(np.zeros(n, np.int64)):
        f.write(track_event_packets(start[a:b], np.full(b - a, TYPE_COUNTER), uuid[a:b], counter=value[a:b]))
    for d, i, j in zip(device[change].tolist(), np.flatnonzero(change).tolist(),
                       [*np.flatnonzero(change)[1:].tolist(), n], strict=True):
        counts["memory_peaks"][f"rank {rank} " + (f"GPU {d}" if d >= 0 else "CPU")] = int(value[i:j].max())
    counts["counter_events"] += n
    counts["packets"] += n


def _write_probes(f: BinaryIO, rank: int, probe: pa.Table, names: Names, tracks: Tracks,
                  counts: dict[str, Any]) -> None:
    """Probed calls as slices of their thread's "probes" track (nested calls of different
    probes nest; USDT firings are slices of no length)."""
    if probe.num_rows == 0:
        return
    pid, tid = as_int64(probe["pid"]), as_int64(probe["tid"])
    nest = Nested([pid, tid], as_int64(probe["start_ns"], 0), as_int64(probe["end_ns"], 0), [np.arange(probe.num_rows)])
    uuid = _lookup(tracks.probes, [pid, tid], nest.group_rows, rank)[nest.group]
    iid = names.iids(probe["name"])[nest.order]
    for a, b in chunks(np.zeros(len(nest.ev_pos), np.int64)):
        pos, end = nest.ev_pos[a:b], nest.ev_end[a:b]
        f.write(track_event_packets(np.where(end, nest.end[pos], nest.start[pos]),
                                     np.where(end, TYPE_SLICE_END, TYPE_SLICE_BEGIN), uuid[pos], name_iid=iid[pos],
                                     begin=~end))
    counts["probes"] += probe.num_rows
    counts["clamped"] += nest.clamped
    counts["packets"] += len(nest.ev_pos)
