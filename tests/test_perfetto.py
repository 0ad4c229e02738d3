"""write_perfetto: the exported trace decodes with Perfetto's own protobuf classes
(the ``perfetto`` package, a test extra) into what the run holds, and, where a
trace_processor_shell binary can be had, loads in Perfetto's trace processor.

``decode`` replays the file as Perfetto reads it: one packet sequence, interned
names, slice begin/end stacks per track (an end closes the innermost open slice),
and flows resolved in timestamp order (ties in file order, as the trace
processor's sorter keeps them)."""

from __future__ import annotations

import gzip
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import pastaprof
from pastaprof.events.schema import GPU_ACTIVITY_KINDS, conform
from pastaprof.report import perfetto as pf
from pastaprof.report import perfetto_wire as pfw
from pastaprof.report import protowire
from pastaprof.report.perfetto import write_perfetto
from pastaprof.store.run import Run

pb = pytest.importorskip("perfetto.protos.perfetto.trace.perfetto_trace_pb2")
TE = pb.TrackEvent


@dataclass
class Slice:
    start: int
    end: int
    name: str
    depth: int
    track: int
    flows: list[int]
    terminating: list[int]


@dataclass
class Decoded:
    packets: int
    descriptors: dict[int, object]
    names: dict[int, str]
    slices: list[Slice]
    counters: dict[int, list[tuple[int, int]]]
    drawn_flows: list[tuple[int, int]] = field(default_factory=list)   # (flow id, track of its source)

    def track_named(self, name: str) -> int:
        (uuid,) = [u for u, d in self.descriptors.items() if d.name == name]
        return uuid

    def on(self, pred) -> list[Slice]:
        return [s for s in self.slices if pred(self.descriptors[s.track])]


def decode(path: Path) -> Decoded:
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    trace = pb.Trace.FromString(data)
    descriptors: dict[int, object] = {}
    names: dict[int, str] = {}
    stacks: dict[int, list[Slice]] = defaultdict(list)
    last_ts: dict[int, int] = {}
    slices: list[Slice] = []
    counters: dict[int, list[tuple[int, int]]] = defaultdict(list)
    events = []
    for i, pkt in enumerate(trace.packet):
        assert pkt.trusted_packet_sequence_id == pfw.SEQUENCE_ID
        cleared = bool(pkt.sequence_flags & pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED)
        assert cleared == (i == 0), f"packet {i}: flags {pkt.sequence_flags}"
        if pkt.HasField("interned_data"):
            assert i == 0 or pkt.sequence_flags & pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
            for en in pkt.interned_data.event_names:
                assert en.iid not in names
                names[en.iid] = en.name
        if pkt.HasField("track_descriptor"):
            d = pkt.track_descriptor
            assert d.uuid not in descriptors
            assert not d.HasField("parent_uuid") or d.parent_uuid in descriptors
            descriptors[d.uuid] = d
        if not pkt.HasField("track_event"):
            continue
        te = pkt.track_event
        uuid, ts = te.track_uuid, pkt.timestamp
        assert uuid in descriptors, "event before its track descriptor"
        assert ts >= last_ts.get(uuid, 0), "events of a track out of order"
        last_ts[uuid] = ts
        events.append((ts, len(events), pkt))
        if te.type == TE.TYPE_SLICE_BEGIN:
            assert pkt.sequence_flags & pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
            assert te.name_iid in names
            stacks[uuid].append(Slice(ts, -1, names[te.name_iid], len(stacks[uuid]), uuid,
                                      list(te.flow_ids), list(te.terminating_flow_ids)))
        elif te.type == TE.TYPE_SLICE_END:
            s = stacks[uuid].pop()
            assert ts >= s.start
            s.end = ts
            if stacks[uuid]:
                assert stacks[uuid][-1].start <= s.start
            slices.append(s)
        else:
            assert te.type == TE.TYPE_COUNTER and descriptors[uuid].HasField("counter")
            counters[uuid].append((ts, te.counter_value))
    assert not any(stacks.values()), "unterminated slices"
    out = Decoded(len(trace.packet), descriptors, names, slices, dict(counters))
    # Flows as the trace processor resolves them, after sorting by timestamp.
    active: dict[int, int] = {}
    for _, _, pkt in sorted(events, key=lambda e: e[:2]):
        te = pkt.track_event
        for fid in te.flow_ids:
            assert fid not in active, "a flow id reused"
            active[fid] = te.track_uuid
        for fid in te.terminating_flow_ids:
            assert fid in active, f"flow {fid} terminates before it begins"
            out.drawn_flows.append((fid, active.pop(fid)))
    assert not active, "flows that never terminate"
    return out


def _is_thread(d) -> bool:
    return d.HasField("thread")


def _is_stream(d) -> bool:
    return d.name.startswith("Stream ")


def _run(**kinds: dict) -> Run:
    tables = {kind: conform(kind, pa.table(cols)) for kind, cols in kinds.items()}
    ranks = sorted({r for t in tables.values() for r in t["rank"].to_pylist()}) or [0]
    return Run({"ranks": ranks}, tables=tables)


def _i32(values) -> pa.Array:
    return pa.array(values, pa.int32())


# --- the example trace ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def example(tmp_path_factory):
    run = pastaprof.load(pastaprof.example_path())
    for kind in ("op", "tensor", *GPU_ACTIVITY_KINDS):
        run.table(kind)                       # import outside the timed export
    path = tmp_path_factory.mktemp("perfetto") / "example.pftrace"
    t0 = time.perf_counter()
    counts = write_perfetto(run, path)
    seconds = time.perf_counter() - t0
    print(f"\nexample export: {seconds:.3f} s, {path.stat().st_size} bytes, {counts}")
    return run, path, counts


def _expected(run: Run) -> dict:
    gpu = run.sql(" union all ".join(f"select op_id from {k}" for k in GPU_ACTIVITY_KINDS)).fetchall()
    return {
        "gpu": sum(run.table(k).num_rows for k in GPU_ACTIVITY_KINDS),
        "ops": run.table("op").num_rows,
        "linked": sum(1 for (op_id,) in gpu if op_id is not None),
        "peak": run.sql("select max(total_allocated) from tensor where device = 0").fetchall()[0][0],
    }


def test_example_decodes_to_the_run(example):
    run, path, counts = example
    exp = _expected(run)
    assert exp["gpu"] > 3000 and exp["ops"] > 20000 and exp["linked"] > 3000
    dec = decode(path)

    gpu = dec.on(_is_stream)
    assert len(gpu) == exp["gpu"] == counts["gpu_slices"]
    want = Counter(run.sql(" union all ".join(f"select name from {k}" for k in GPU_ACTIVITY_KINDS)).fetchall())
    assert Counter((s.name,) for s in gpu) == want
    assert all(dec.descriptors[dec.descriptors[s.track].parent_uuid].name.startswith("GPU 0") for s in gpu)

    ops = dec.on(_is_thread)
    assert len(ops) == exp["ops"] == counts["ops"]
    assert counts["clamped"] == 0
    assert Counter((s.start, s.end, s.name) for s in ops) == Counter(
        run.sql("select start_ns, end_ns, name from op").fetchall())
    per_thread = Counter((dec.descriptors[s.track].thread.pid, dec.descriptors[s.track].thread.tid) for s in ops)
    assert per_thread == dict(((p, t), n) for p, t, n in run.sql("select pid, tid, count(*) from op group by all").fetchall())
    for s in ops:                                  # thread tracks sit under their process track
        assert dec.descriptors[dec.descriptors[s.track].parent_uuid].process.pid == dec.descriptors[s.track].thread.pid

    # every linked activity has a flow, from the op it names
    assert len(dec.drawn_flows) == exp["linked"] == counts["flows"]
    assert counts["flows_skipped"] == 0
    op_start = {fid: s.start for s in ops for fid in s.flows}
    op_of = dict(((start, name), op_id) for start, name, op_id in run.sql(
        " union all ".join(f"select start_ns, name, op_id from {k}" for k in GPU_ACTIVITY_KINDS)).fetchall())
    id_start = dict(run.sql("select id, start_ns from op").fetchall())
    for s in gpu:
        (fid,) = s.terminating
        assert op_start[fid] == id_start[op_of[(s.start, s.name)]]

    # memory counter
    mem = dec.counters[dec.track_named("GPU 0 memory allocated")]
    assert max(v for _, v in mem) == exp["peak"] == counts["memory_peaks"]["rank 0 GPU 0"]
    assert len(mem) == run.sql("select count(*) from tensor where device = 0").fetchall()[0][0]
    assert sum(len(v) for v in dec.counters.values()) == run.table("tensor").num_rows == counts["counter_events"]

    assert dec.packets == counts["packets"]
    assert path.stat().st_size == counts["bytes"]
    assert len(dec.names) == counts["interned_names"] < 1000      # names are interned, not repeated


def _trace_processor_binary() -> str | None:
    """A trace_processor_shell: $PERFETTO_TRACE_PROCESSOR, one on PATH, or the perfetto
    package's pinned prebuilt (cached, or downloaded when its host can be reached)."""
    found = os.environ.get("PERFETTO_TRACE_PROCESSOR") or shutil.which("trace_processor_shell") \
        or shutil.which("trace_processor")
    if found:
        return found
    code = ("from perfetto.prebuilts.manifests.trace_processor_shell import TRACE_PROCESSOR_SHELL_MANIFEST as m\n"
            "from perfetto.prebuilts.perfetto_prebuilts import get_perfetto_prebuilt\n"
            "print(get_perfetto_prebuilt(m, soft_fail=True) or '')")
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired:
        return None
    lines = out.stdout.strip().splitlines()
    return lines[-1] if out.returncode == 0 and lines and os.path.isfile(lines[-1]) else None


def test_example_loads_in_trace_processor(example):
    run, path, counts = example
    tp_mod = pytest.importorskip("perfetto.trace_processor")
    binary = _trace_processor_binary()
    if binary is None:
        pytest.skip("no trace_processor_shell (set PERFETTO_TRACE_PROCESSOR, or let the perfetto package download it)")
    exp = _expected(run)
    tp = tp_mod.TraceProcessor(trace=str(path), config=tp_mod.TraceProcessorConfig(bin_path=binary))
    try:
        def one(sql: str):
            return next(iter(tp.query(sql))).v

        errors = [(r.name, r.idx, r.value) for r in tp.query(
            "select name, idx, value from stats where severity in ('error', 'data_loss') and value > 0")]
        assert errors == []
        assert one("select count(*) as v from slice join track on slice.track_id = track.id "
                   "where track.name like 'Stream %'") == exp["gpu"]
        assert one("select count(*) as v from slice join thread_track on slice.track_id = thread_track.id") == exp["ops"]
        assert one("select count(*) as v from flow") == exp["linked"]
        assert one("select max(value) as v from counter join counter_track on counter.track_id = counter_track.id "
                   "where counter_track.name = 'GPU 0 memory allocated'") == exp["peak"]
    finally:
        tp.close()


# --- nesting, flows, counters on synthetic runs ---------------------------------------------

def test_overlapping_slices_are_clamped_to_nest(tmp_path):
    #        A [0,100]  B [10,150] outlives A -> [10,100]; D [10,50] inside B; E [50,60] after D;
    #        F, G zero-length at 60; C [120,130] top level; H = I [200,300], I recorded deeper.
    ops = {"A": (0, 100, 0), "B": (10, 150, 1), "D": (10, 50, 2), "E": (50, 60, 2), "F": (60, 60, 3),
           "G": (60, 60, 3), "C": (120, 130, 0), "H": (200, 300, 0), "I": (200, 300, 1)}
    names = list(ops)
    run = _run(
        op={"start_ns": [ops[n][0] for n in names], "end_ns": [ops[n][1] for n in names],
            "rank": _i32([0] * len(names)), "pid": [1] * len(names), "tid": [1] * len(names),
            "id": list(range(len(names))), "depth": _i32([ops[n][2] for n in names]), "name": names},
        kernel={"start_ns": [0, 40, 90], "end_ns": [50, 80, 95], "rank": _i32([0] * 3), "device": _i32([0] * 3),
                "stream": [7, 7, 7], "name": ["k1", "k2", "k3"]},
    )
    counts = write_perfetto(run, tmp_path / "t.pftrace")
    dec = decode(tmp_path / "t.pftrace")
    got = {s.name: (s.start, s.end, s.depth) for s in dec.slices}
    assert got == {"A": (0, 100, 0), "B": (10, 100, 1), "D": (10, 50, 2), "E": (50, 60, 2), "F": (60, 60, 2),
                   "G": (60, 60, 2), "C": (120, 130, 0), "H": (200, 300, 0), "I": (200, 300, 1),
                   "k1": (0, 50, 0), "k2": (40, 50, 1), "k3": (90, 95, 0)}
    assert counts["clamped"] == 2 and counts["ops"] == 9 and counts["gpu_slices"] == 3


def _clamped_reference(start, end, tid):
    """Per thread, sorted by (start, longest first, row), each end clamped to the end of
    the interval enclosing it: name -> (start, end, depth, tid); and the clamp count."""
    want, clamped = {}, 0
    for t in np.unique(tid):
        rows = sorted(np.flatnonzero(tid == t), key=lambda i: (start[i], -end[i], i))
        stack: list[int] = []
        for i in rows:
            while stack and stack[-1] <= start[i]:
                stack.pop()
            e = int(end[i])
            if stack and e > stack[-1]:
                e, clamped = stack[-1], clamped + 1
            want[f"op{i}"] = (int(start[i]), e, len(stack), int(t))
            stack.append(e)
    return want, clamped


@pytest.mark.parametrize("seed, scale", [(0, 1), (1, 1), (2, 2**52)])
def test_random_intervals_nest_like_a_stack(tmp_path, seed, scale):
    # scale 2**52: a time span too wide for the packed sort key, so the plain lexsort runs
    rng = np.random.default_rng(seed)
    n = 4000
    start = rng.integers(0, 300, n) * scale          # a small range: many ties and zero-length slices
    end = start + rng.integers(0, 40, n) * (rng.random(n) < 0.9) * scale
    tid = rng.integers(0, 3, n)
    # thread 3: intervals that already nest (thread 0's, clamped), so no clamping there
    nested, _ = _clamped_reference(start, end, tid)
    rows0 = np.flatnonzero(tid == 0)
    start = np.concatenate([start, start[rows0]])
    end = np.concatenate([end, [nested[f"op{i}"][1] for i in rows0]]).astype(np.int64)
    tid = np.concatenate([tid, np.full(len(rows0), 3)])
    m = len(start)
    run = _run(op={"start_ns": start, "end_ns": end, "rank": _i32(np.zeros(m)), "pid": np.full(m, 5), "tid": tid,
                   "id": np.arange(m), "depth": _i32(np.zeros(m)), "name": [f"op{i}" for i in range(m)]})
    counts = write_perfetto(run, tmp_path / "r.pftrace")
    dec = decode(tmp_path / "r.pftrace")
    want, clamped = _clamped_reference(start, end, tid)
    got = {s.name: (s.start, s.end, s.depth, dec.descriptors[s.track].thread.tid) for s in dec.slices}
    assert got == want
    assert counts["clamped"] == clamped > 0
    assert _clamped_reference(start[tid == 3], end[tid == 3], tid[tid == 3])[1] == 0


def test_flows_link_each_activity_to_its_op(tmp_path):
    run = _run(
        op={"start_ns": [0, 100, 200], "end_ns": [50, 150, 250], "rank": _i32([0] * 3), "pid": [1] * 3,
            "tid": [1] * 3, "id": [10, 11, 12], "name": ["launch3", "late", "none"]},
        kernel={"start_ns": [60, 70, 80, 90, 300, 310], "end_ns": [65, 75, 85, 95, 305, 315],
                "rank": _i32([0] * 6), "device": _i32([0] * 6), "stream": [7] * 6,
                "op_id": [10, 10, 11, 99, None, 12], "name": ["a", "b", "early", "orphan", "unlinked", "c"]},
        memcpy={"start_ns": [20], "end_ns": [30], "rank": _i32([0]), "device": _i32([0]), "stream": [8],
                "op_id": [10], "name": ["copy"]},
        memset={"start_ns": [400], "end_ns": [410], "rank": _i32([0]), "device": _i32([0]), "stream": [7],
                "op_id": [12], "name": ["set"]},
    )
    counts = write_perfetto(run, tmp_path / "f.pftrace")
    dec = decode(tmp_path / "f.pftrace")
    by_fid = {fid: s.name for s in dec.slices for fid in s.flows}
    links = sorted((by_fid[fid], s.name) for s in dec.slices for fid in s.terminating)
    # "early" starts before its op, "orphan" names no op: Perfetto could not draw them
    assert links == [("launch3", "a"), ("launch3", "b"), ("launch3", "copy"), ("none", "c"), ("none", "set")]
    assert len(dec.drawn_flows) == counts["flows"] == 5 and counts["flows_skipped"] == 2
    assert (counts["kernels"], counts["memcpys"], counts["memsets"]) == (6, 1, 1)
    streams = {dec.descriptors[s.track].name for s in dec.slices if s.name in ("copy", "set")}
    assert streams == {"Stream 8", "Stream 7"}


def test_small_batches_write_the_same_bytes(tmp_path, monkeypatch):
    # one op launches 300 kernels; tiny batches (and a tiny byte budget around that op) change nothing
    n_ops, n_k = 200, 600
    rng = np.random.default_rng(3)
    op_id = np.where(np.arange(n_k) < 300, 0, rng.integers(1, n_ops, n_k))
    run = _run(
        op={"start_ns": np.arange(n_ops) * 10, "end_ns": np.arange(n_ops) * 10 + 5 + (np.arange(n_ops) == 0) * 50,
            "rank": _i32(np.zeros(n_ops)), "pid": np.ones(n_ops, np.int64), "tid": np.ones(n_ops, np.int64),
            "id": np.arange(n_ops), "name": [f"op{i % 7}" for i in range(n_ops)]},
        kernel={"start_ns": 5000 + np.arange(n_k) * 3, "end_ns": 5000 + np.arange(n_k) * 3 + 2,
                "rank": _i32(np.zeros(n_k)), "device": _i32(np.zeros(n_k)), "stream": np.full(n_k, 7),
                "op_id": op_id, "name": [f"k{i % 5}" for i in range(n_k)]},
        tensor={"start_ns": np.arange(50), "end_ns": np.arange(50), "rank": _i32(np.zeros(50)),
                "device": _i32(np.zeros(50)), "bytes": np.full(50, 8)},
    )
    big = write_perfetto(run, tmp_path / "big.pftrace")
    monkeypatch.setattr(pfw, "_CHUNK", 7)
    monkeypatch.setattr(pfw, "_CHUNK_BYTES", 4000)
    small = write_perfetto(run, tmp_path / "small.pftrace")
    assert small == big and big["flows"] == n_k
    assert (tmp_path / "small.pftrace").read_bytes() == (tmp_path / "big.pftrace").read_bytes()
    dec = decode(tmp_path / "small.pftrace")
    assert max(len(s.flows) for s in dec.slices) == 300 and len(dec.drawn_flows) == n_k


def test_memory_counter_falls_back_to_running_bytes(tmp_path):
    run = _run(tensor={
        "start_ns": [1, 2, 3, 4, 5, 6, 7], "end_ns": [1, 2, 3, 4, 5, 6, 7], "rank": _i32([0] * 7),
        "device": _i32([0, 0, 0, 0, 1, 1, None]), "bytes": [10, 20, 5, -30, 7, 3, 64],
        "total_allocated": pa.array([None, None, 100, None, None, None, None], pa.int64())})
    counts = write_perfetto(run, tmp_path / "m.pftrace")
    dec = decode(tmp_path / "m.pftrace")
    assert dec.counters[dec.track_named("GPU 0 memory allocated")] == [(1, 10), (2, 30), (3, 100), (4, 70)]
    assert dec.counters[dec.track_named("GPU 1 memory allocated")] == [(5, 7), (6, 10)]
    assert dec.counters[dec.track_named("CPU memory allocated")] == [(7, 64)]
    assert counts["memory_peaks"] == {"rank 0 GPU 0": 100, "rank 0 GPU 1": 10, "rank 0 CPU": 64}


def test_ranks_sharing_a_pid_get_separate_processes(tmp_path):
    def rank(r: int) -> dict[str, pa.Table]:           # one table chunk per rank, each with its own dictionary
        return {"op": conform("op", pa.table({"start_ns": [0], "end_ns": [10], "rank": _i32([r]), "pid": [100],
                                              "tid": [100], "id": [0], "name": [f"op{r}"]})),
                "kernel": conform("kernel", pa.table({"start_ns": [5 + r], "end_ns": [8 + r], "rank": _i32([r]),
                                                      "device": _i32([0]), "stream": [7], "op_id": [0],
                                                      "name": [f"k{r}"]}))}
    parts = [rank(0), rank(1)]
    run = Run({"ranks": [0, 1]}, tables={k: pa.concat_tables([p[k] for p in parts]) for k in ("op", "kernel")})
    assert run.table("op")["name"].num_chunks == 2
    write_perfetto(run, tmp_path / "p.pftrace")
    dec = decode(tmp_path / "p.pftrace")
    procs = {d.process.process_name: d.process.pid for d in dec.descriptors.values() if d.HasField("process")}
    assert procs["rank 0"] == 100 and procs["rank 1 (pid 100)"] != 100
    assert {d.name for d in dec.descriptors.values() if d.name.endswith("GPU 0")} == {"rank 0 GPU 0", "rank 1 GPU 0"}
    by_fid = {fid: s.name for s in dec.slices for fid in s.flows}
    assert sorted((by_fid[fid], s.name) for s in dec.slices for fid in s.terminating) == [("op0", "k0"), ("op1", "k1")]


def test_run_directory_exports_like_the_loaded_trace(example, tmp_path):
    run, _, counts = example
    stored = pastaprof.load(pastaprof.import_trace(pastaprof.example_path(), tmp_path / "run"))
    again = write_perfetto(stored, tmp_path / "stored.pftrace")
    assert {k: v for k, v in again.items() if k != "bytes"} == {k: v for k, v in counts.items() if k != "bytes"}
    dec = decode(tmp_path / "stored.pftrace")
    assert len(dec.on(_is_thread)) == counts["ops"] and len(dec.drawn_flows) == counts["flows"]


def test_empty_run_and_gzip(tmp_path):
    counts = write_perfetto(Run({"ranks": [0]}), tmp_path / "e.pftrace")
    dec = decode(tmp_path / "e.pftrace")
    assert dec.packets == counts["packets"] == 1 and counts["ops"] == counts["gpu_slices"] == 0
    run = _run(op={"start_ns": [0], "end_ns": [1], "rank": _i32([0]), "pid": [1], "tid": [2], "id": [0],
                   "name": [None]})
    counts = write_perfetto(run, tmp_path / "g.pftrace.gz")
    assert (tmp_path / "g.pftrace.gz").read_bytes()[:2] == b"\x1f\x8b"
    dec = decode(tmp_path / "g.pftrace.gz")
    assert [s.name for s in dec.slices] == [pfw.UNNAMED] and counts["ops"] == 1


# --- the encoder against Perfetto's descriptors and protobuf's own encoding -----------------

def test_varints_match_protobuf():
    values = [0, 1, 127, 128, 300, 2**31 - 1, 2**35 + 5, 2**63 - 1, -1, -300, -(2**63)]
    flat, lens = protowire.varint(np.array(values, np.int64))
    offsets = np.concatenate([[0], np.cumsum(lens)])
    for i, v in enumerate(values):
        want = TE(counter_value=v).SerializeToString()[2:]       # minus the 2-byte tag of field 30
        assert flat[offsets[i]:offsets[i + 1]].tobytes() == want


def test_field_numbers_match_perfetto():
    proto = (Path(pf.__file__).parent / "perfetto_trace_subset.proto").read_text()
    scalar = {3: "int64", 4: "uint64", 5: "int32", 6: "fixed64", 9: "string", 13: "uint32"}
    checked = 0
    for msg, body in re.findall(r"^message (\w+) \{(.*?)^\}", proto, re.M | re.S):
        desc = getattr(pb, msg).DESCRIPTOR
        for label, type_, name, number in re.findall(r"(optional|repeated) ([\w.]+) (\w+) = (\d+);", body):
            f = desc.fields_by_name[name]
            assert f.number == int(number) and f.is_repeated == (label == "repeated"), f"{msg}.{name}"
            typed = f.message_type or f.enum_type
            assert (typed.name if typed else scalar[f.type]) == type_, f"{msg}.{name}"
            checked += 1
        for enum, values in re.findall(r"enum (\w+) \{(.*?)\}", body, re.S):
            for name, number in re.findall(r"(\w+) = (\d+);", values):
                assert desc.enum_types_by_name[enum].values_by_name[name].number == int(number), f"{enum}.{name}"
                checked += 1
    assert checked >= 30
    fields = {
        "TRACE_PACKET": ("Trace", "packet"), "PKT_TIMESTAMP": ("TracePacket", "timestamp"),
        "PKT_SEQUENCE_ID": ("TracePacket", "trusted_packet_sequence_id"),
        "PKT_TRACK_EVENT": ("TracePacket", "track_event"), "PKT_INTERNED_DATA": ("TracePacket", "interned_data"),
        "PKT_SEQUENCE_FLAGS": ("TracePacket", "sequence_flags"),
        "PKT_TRACK_DESCRIPTOR": ("TracePacket", "track_descriptor"), "TE_TYPE": ("TrackEvent", "type"),
        "TE_NAME_IID": ("TrackEvent", "name_iid"), "TE_TRACK_UUID": ("TrackEvent", "track_uuid"),
        "TE_COUNTER_VALUE": ("TrackEvent", "counter_value"), "TE_FLOW_IDS": ("TrackEvent", "flow_ids"),
        "TE_TERMINATING_FLOW_IDS": ("TrackEvent", "terminating_flow_ids"),
        "ID_EVENT_NAMES": ("InternedData", "event_names"), "EN_IID": ("EventName", "iid"),
        "EN_NAME": ("EventName", "name"), "TD_UUID": ("TrackDescriptor", "uuid"),
        "TD_NAME": ("TrackDescriptor", "name"), "TD_PROCESS": ("TrackDescriptor", "process"),
        "TD_THREAD": ("TrackDescriptor", "thread"), "TD_PARENT_UUID": ("TrackDescriptor", "parent_uuid"),
        "TD_COUNTER": ("TrackDescriptor", "counter"), "TD_CHILD_ORDERING": ("TrackDescriptor", "child_ordering"),
        "TD_SIBLING_ORDER_RANK": ("TrackDescriptor", "sibling_order_rank"),
        "PD_PID": ("ProcessDescriptor", "pid"), "PD_PROCESS_NAME": ("ProcessDescriptor", "process_name"),
        "THD_PID": ("ThreadDescriptor", "pid"), "THD_TID": ("ThreadDescriptor", "tid"),
        "THD_THREAD_NAME": ("ThreadDescriptor", "thread_name"), "CD_UNIT": ("CounterDescriptor", "unit"),
    }
    for const, (msg, name) in fields.items():
        assert getattr(pfw, const) == getattr(pb, msg).DESCRIPTOR.fields_by_name[name].number, const
    assert (pfw.TYPE_SLICE_BEGIN, pfw.TYPE_SLICE_END, pfw.TYPE_COUNTER) == (
        TE.TYPE_SLICE_BEGIN, TE.TYPE_SLICE_END, TE.TYPE_COUNTER)
    assert pfw.UNIT_SIZE_BYTES == pb.CounterDescriptor.UNIT_SIZE_BYTES
    assert pfw.CHILD_ORDERING_EXPLICIT == pb.TrackDescriptor.EXPLICIT
