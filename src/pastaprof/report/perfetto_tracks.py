"""The tracks of a Perfetto export: one uuid and TrackDescriptor packet per process, thread,
GPU, stream, probes thread and memory counter, made before any event is written so that
every event packet can name its track by uuid.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from pastaprof.report.perfetto_wire import (
    CD_UNIT,
    CHILD_ORDERING_EXPLICIT,
    PD_PID,
    PD_PROCESS_NAME,
    PKT_TRACK_DESCRIPTOR,
    TD_CHILD_ORDERING,
    TD_COUNTER,
    TD_NAME,
    TD_PARENT_UUID,
    TD_PROCESS,
    TD_SIBLING_ORDER_RANK,
    TD_THREAD,
    TD_UUID,
    THD_PID,
    THD_THREAD_NAME,
    THD_TID,
    UNIT_SIZE_BYTES,
    packet,
)
from pastaprof.report.protowire import fbytes, fint, fstr

_PID_STRIDE = 1 << 22                # offset that disambiguates a pid seen on two ranks (Linux pid_max)
_INT32_MAX = (1 << 31) - 1


def distinct(t: pa.Table, cols: list[str]) -> list[tuple[int, ...]]:
    """The sorted distinct value tuples of ``cols`` (nulls as -1)."""
    if t.num_rows == 0:
        return []
    d = pa.table({c: pc.fill_null(t[c], -1) for c in cols}).group_by(cols, use_threads=False).aggregate([])
    return sorted(zip(*(d[c].to_pylist() for c in cols), strict=True))



class Tracks:
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
        for rank, pid, tid in distinct(ops, ["rank", "pid", "tid"]):
            self._ensure_process(rank, pid)
            self.thread[(rank, pid, tid)] = self._thread(rank, pid, tid, self._offsets[(rank, pid)])
        for rank, pid, tid in distinct(probe, ["rank", "pid", "tid"]) if probe is not None else ():
            self._ensure_process(rank, pid)
            self.counts["thread_tracks"] += 1
            self.probes[(rank, pid, tid)] = self._emit(self._uuid(), fint(TD_PARENT_UUID, self.process[(rank, pid)])
                                                       + fstr(TD_NAME, f"probes tid {tid}"))
        for rank, device, stream in distinct(gpu, ["rank", "device", "stream"]):
            self.stream[(rank, device, stream)] = self._stream(rank, device, stream)
        for rank, device in distinct(tensor, ["rank", "device"]):
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
        self.packets.append(packet(fbytes(PKT_TRACK_DESCRIPTOR, fint(TD_UUID, uuid) + body)))
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

