"""The Perfetto wire layer of the export: field numbers, TrackEvent packets and interned names.

``write_perfetto`` (report/perfetto.py) hands this module columns; it lays them out as
Perfetto messages with ``protowire``'s bulk NumPy encoders (no Python object per event)
and sizes the chunks so that a batch's padded matrices stay bounded.  The field numbers
are those of Perfetto's protos; the subset used is written out in
``perfetto_trace_subset.proto`` beside this file.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pastaprof.report.protowire import (
    assemble,
    fbytes,
    fint,
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


# --- packets --------------------------------------------------------------------------------

def packet(body: bytes) -> bytes:
    """A TracePacket framed as one ``Trace.packet`` entry."""
    return fbytes(TRACE_PACKET, fint(PKT_SEQUENCE_ID, SEQUENCE_ID) + body)


def track_event_packets(ts: np.ndarray, etype: np.ndarray, uuid: np.ndarray, *,
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


def chunks(counts: np.ndarray):
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

class Names:
    """The event names of the exported kinds, interned 1..n."""

    def __init__(self, columns: list[pa.ChunkedArray]) -> None:
        used: list[pa.Array] = []
        self.has_null = False
        for col in columns:
            for chunk in col.chunks:
                if len(chunk) == 0:
                    continue
                idx = as_int64(chunk.indices)
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
        pos = as_int64(pc.index_in(col.chunk(0).dictionary.cast(pa.string()), value_set=self.table))
        m = np.where(pos >= 0, pos + 1, self.unnamed)
        idx = as_int64(pa.chunked_array([c.indices for c in col.chunks], col.type.index_type))
        return np.where(idx >= 0, m[np.maximum(idx, 0)] if len(m) else 0, self.unnamed)

    def packets(self) -> list[bytes]:
        """InternedData packets; the first one (always written) clears the incremental state."""
        n = len(self.table)
        if n == 0:
            return [packet(fint(PKT_SEQUENCE_FLAGS, SEQ_INCREMENTAL_STATE_CLEARED))]
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
            out.append(packet(fint(PKT_SEQUENCE_FLAGS, flags)
                               + fbytes(PKT_INTERNED_DATA, entries[start:end].tobytes())))
            first, start = stop, end
        return out


def as_int64(col: pa.ChunkedArray | pa.Array, fill: int = -1) -> np.ndarray:
    """An integer column as int64 NumPy values, nulls as ``fill``."""
    return np.asarray(pc.fill_null(col, fill).to_numpy(zero_copy_only=False), dtype=np.int64)

