"""Memory snapshots (torch.cuda.memory._dump_snapshot pickles): read without running code,
mapped to allocator events, explained by the memory tool.  Numbers are checked against an
independent replay of the same pickle (loaded here with a restricted unpickler of the test's
own).  The fixtures are schema-built (tests/data/snapshots/make_snapshots.py says why)."""

from __future__ import annotations

import io
import os
import pickle
import random
import subprocess
import sys
from pathlib import Path

import pytest

from pastaprof import api
from pastaprof.errors import InputError, PastaprofError
from pastaprof.importers.memory_snapshot import MemorySnapshotImporter, safe_load, snapshot_tables
from pastaprof.importers.registry import importer_for
from pastaprof.processor.link import link_rank

DATA = Path(__file__).parent / "data" / "snapshots"


class _Plain(pickle.Unpickler):
    def find_class(self, module, name):
        raise AssertionError("a fixture must hold plain data only")


def _load(name: str) -> dict:
    return _Plain(io.BytesIO((DATA / name).read_bytes())).load()


def _replay(snap: dict) -> dict:
    """Peak of allocated bytes (alloc +, free_requested -: torch's allocated_bytes), with the level before the trace
    from the blocks still active at the dump; the blocks live at the first peak."""
    trace = snap["device_traces"][0]
    end = sum(b["size"] for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated")
    deltas = [(e["size"] if e["action"] == "alloc" else -e["size"], e) for e in trace
              if e["action"] in ("alloc", "free_requested")]
    level = offset = end - sum(d for d, _ in deltas)
    peak, live, at_peak = level, {}, {}
    for d, e in deltas:
        level += d
        if d > 0:
            live[e["addr"]] = e["size"]
        else:
            live.pop(e["addr"], None)
        if level > peak:
            peak, at_peak = level, dict(live)
    return {"peak": peak, "offset": offset, "end": end, "live_at_peak": at_peak}


def _memory(path: Path):
    (rep,) = api.analyze(path, tools=["memory"])
    return rep


@pytest.mark.parametrize("name", ["train_step.pickle", "leak.pickle", "oom.pickle", "leak_protocol5.pickle"])
def test_peak_and_live_blocks_match_an_independent_replay(name):
    want = _replay(_load(name))
    rep = _memory(DATA / name)
    dev = rep.tables["devices"].to_pylist()[0]
    assert dev["peak_bytes"] == want["peak"]
    assert dev["pretrace_offset_bytes"] == want["offset"]
    assert dev["end_bytes"] == want["end"]
    assert dev["replay_consistent"] and dev["mismatched_events"] == 0
    assert dev["live_at_peak_blocks"] == len(want["live_at_peak"])
    assert dev["live_at_peak_bytes"] == sum(want["live_at_peak"].values())


def test_train_step_steps_come_from_the_record_function_annotations():
    rep = _memory(DATA / "train_step.pickle")
    steps = rep.tables["steps"].to_pylist()
    assert [s["step"] for s in steps] == ["train_step_0", "train_step_1", "train_step_2"] or len(steps) == 3
    snap = _load("train_step.pickle")
    assert rep.summary["alloc_events"] == sum(e["action"] == "alloc" for e in snap["device_traces"][0])
    assert rep.summary["free_events"] == sum(e["action"] == "free_requested" for e in snap["device_traces"][0])


def test_leak_site_grows_by_what_it_keeps_per_step():
    snap = _load("leak.pickle")
    kept = [e for e in snap["device_traces"][0] if e["action"] == "alloc" and e["frames"][0]["name"] == "leaky_cache_append"]
    freed = {e["addr"] for e in snap["device_traces"][0] if e["action"] == "free_requested"}
    assert kept and not any(e["addr"] in freed for e in kept)
    rep = _memory(DATA / "leak.pickle")
    assert rep.summary["leak_bytes_per_step"] == kept[0]["size"] == 2 << 20
    leak = [f for f in rep.findings if "grows" in f.title]
    assert leak and "leaky_cache_append" in leak[0].location
    never = rep.tables["never_freed"].to_pylist()
    top = max(never, key=lambda r: r["bytes"])
    assert "leaky_cache_append" in top["op_name"] and top["bytes"] == sum(e["size"] for e in kept)
    assert "record_snapshots.py(92): leaky_cache_append" in top["call_site"]


def test_ring_buffer_start_is_before_the_trace():
    """The leak fixture keeps only its last entries: what was allocated before is the offset."""
    want = _replay(_load("leak.pickle"))
    assert want["offset"] > 0
    rep = _memory(DATA / "leak.pickle")
    assert rep.summary["pretrace_offset_bytes"] == want["offset"]


def test_oom_is_a_range_a_note_and_the_state_at_it():
    snap = _load("oom.pickle")
    (o,) = [e for e in snap["device_traces"][0] if e["action"] == "oom"]
    tables, meta = snapshot_tables(snap, DATA / "oom.pickle")
    assert meta["ooms"] == [{"device": 0, "time_ns": meta["ooms"][0]["time_ns"], "requested_bytes": o["size"],
                             "device_free_bytes": o["device_free"]}]
    assert any("out of memory on cuda:0: asked for 256.0 MiB" in n for n in meta["notes"])
    rng = tables["range"].to_pylist()
    assert [r["domain"] for r in rng] == ["oom"] and "256.0 MiB" in rng[0]["name"]
    rep = _memory(DATA / "oom.pickle")
    held = sum(e["size"] for e in snap["device_traces"][0] if e["action"] == "alloc")
    assert rep.summary["peak_bytes"] == held == rep.summary["max_reserved_bytes"] == 2 << 30
    (f,) = [f for f in rep.findings if f.title.startswith("OOM:")]
    assert f.severity == "critical" and f.evidence["allocated_bytes"] == held
    assert f.evidence["blocks"] == sum(e["action"] == "alloc" for e in snap["device_traces"][0])
    assert "grow_until_oom" in f.location


def test_every_alloc_has_its_call_site_and_stack():
    snap = _load("train_step.pickle")
    tables, _ = snapshot_tables(snap, DATA / "train_step.pickle")
    linked = link_rank(tables)
    with_stack = [e for e in snap["device_traces"][0] if e["action"] in ("alloc", "free_requested", "oom")]
    assert linked["op"].num_rows == len(with_stack)
    assert linked["frame"].num_rows == sum(len(e["frames"]) for e in with_stack)
    sites = linked["op"]["call_site"].to_pylist()
    assert all(s and s.startswith("/root/work/scripts/record_snapshots.py(") for s in sites)


def test_info_names_the_format(tmp_path):
    out = tmp_path / "run"
    api.import_trace(DATA / "leak_protocol5.pickle", out)
    r = subprocess.run([sys.executable, "-m", "pastaprof.cli", "info", str(out)], capture_output=True, text=True)
    assert r.returncode == 0 and "format=memory_snapshot" in r.stdout


def test_every_default_tool_runs_on_a_snapshot():
    reports = api.analyze(DATA / "train_step.pickle")
    assert {r.tool for r in reports} >= {"steps", "kernels", "ops", "timeline", "cuda_api", "copies", "memory"}


# ---------------------------------------------------------------- hostile pickles
class _Boom:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _cli(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pastaprof.cli", "analyze", str(path)], capture_output=True, text=True)


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_a_pickle_that_would_run_code_is_refused_and_never_run(tmp_path, protocol):
    marker = tmp_path / "ran"
    evil = {"segments": [], "device_traces": [[{"action": "alloc", "addr": 1, "size": 1}]], "x": _Boom(str(marker))}
    p = tmp_path / "snap.pickle"
    p.write_bytes(pickle.dumps(evil, protocol=protocol))
    with pytest.raises(InputError, match="posix.system|os.system|nt.system"):
        safe_load(p)
    r = _cli(p)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith("pastaprof: error:")
    assert "Traceback" not in r.stderr and not marker.exists()


def test_a_snapshot_of_a_class_instance_is_refused(tmp_path):
    p = tmp_path / "s.pickle"
    p.write_bytes(pickle.dumps({"segments": [], "device_traces": [], "t": io.BytesIO(b"x")}, protocol=4))
    with pytest.raises(InputError, match="nothing in it was loaded"):
        safe_load(p)


def test_the_importer_claims_snapshots_only():
    imp = MemorySnapshotImporter()
    assert imp.sniff(DATA / "oom.pickle").score == 100
    assert imp.sniff(Path(__file__)) is None
    assert importer_for(DATA / "leak.pickle")[0].name == "memory_snapshot"


def _mutations(rng: random.Random, base: bytes, snap: dict) -> bytes:
    k = rng.randrange(8)
    if k == 0:
        return base[: rng.randrange(2, len(base))]                      # truncated
    if k == 1:
        b = bytearray(base)
        for _ in range(rng.randrange(1, 6)):
            b[rng.randrange(2, len(b))] = rng.randrange(256)             # flipped bytes
        return bytes(b)
    s = pickle.loads(pickle.dumps(snap))
    trace = s["device_traces"][0]
    e = rng.choice(trace)
    junk = rng.choice([None, "x" * 5, -1, 2 ** 80, -(2 ** 70), 1.5e300, [], {}, "\x1b[31m\x00evil", True])
    if k == 2:
        e[rng.choice(["size", "addr", "time_us", "action", "frames", "device_free"])] = junk
    elif k == 3:
        s[rng.choice(["segments", "device_traces", "external_annotations"])] = junk
    elif k == 4:
        trace.append(junk)
    elif k == 5:
        e["frames"] = [{"filename": junk, "line": junk, "name": junk}] * rng.randrange(1, 200)
    elif k == 6:
        s = rng.choice([[], 7, "segments", {"nothing": 1}, {"segments": {}}])
    else:
        s["segments"].append({"device": junk, "total_size": junk, "blocks": [junk, {"size": junk, "state": junk}]})
    return pickle.dumps(s, protocol=rng.choice([2, 3, 4, 5]))


def test_fuzz_fixed_seed_one_line_or_events():
    rng = random.Random(20261201)
    names = ["train_step.pickle", "leak.pickle", "oom.pickle"]
    bases = {n: ((DATA / n).read_bytes(), _load(n)) for n in names}
    ok = refused = 0
    for i in range(300):
        base, snap = bases[names[i % 3]]
        data = _mutations(rng, base, snap)
        p = Path(f"/tmp/pastaprof_fuzz_snapshot_{os.getpid()}.pickle")
        p.write_bytes(data)
        try:
            tables, _meta = snapshot_tables(safe_load(p), p)
            link_rank(tables)
            ok += 1
        except PastaprofError as e:
            assert "\n" not in str(e), (i, str(e))
            refused += 1
        finally:
            p.unlink()
    assert ok + refused == 300 and ok > 50 and refused > 50


RECORDED = DATA / "recorded"  # scripts/record_snapshots.py OUT, copied here once a GPU records them


def _recorded():
    import json

    info = RECORDED / "record_info.json"
    if not info.exists():
        return []
    return [s for s in json.loads(info.read_text())["scenarios"].values() if "file" in s]


@pytest.mark.skipif(not _recorded(), reason="no real snapshots recorded yet (scripts/record_snapshots.py)")
@pytest.mark.parametrize("scenario", _recorded(), ids=lambda s: s["file"])
def test_recorded_snapshots_match_the_allocators_own_numbers(scenario):
    """Real snapshots: the peak is torch.cuda.max_memory_allocated() of the recording, the
    level at the end memory_allocated() (history started on an empty cache, below max_entries)."""
    rep = _memory(RECORDED / scenario["file"])
    assert rep.summary["peak_bytes"] == scenario["max_memory_allocated"]
    dev = rep.tables["devices"].to_pylist()[0]
    assert dev["end_bytes"] == scenario["memory_allocated"]
    if scenario.get("oom_request_bytes"):
        oom = next(f for f in rep.findings if f.title.startswith("OOM:"))
        assert f"asked for {scenario['oom_request_bytes'] / 2**20:.1f} MiB" in oom.title
        # what held the memory: the chunks the program kept, at the function that kept them
        assert oom.evidence["blocks"] == scenario["chunks_held"]
        assert oom.evidence["allocated_bytes"] == scenario["chunks_held"] * scenario["oom_request_bytes"]
        assert "grow_until_oom" in oom.location
    if scenario.get("leaked_bytes"):
        grows = next(f for f in rep.findings if "grows" in f.title)
        top = grows.evidence["sites"][0]  # the planted leak: one 2 MiB tensor kept per step
        assert top["bytes"] == scenario["leaked_bytes"] and top["blocks"] == scenario["leaked_tensors"]
        assert top["call_site"].endswith("leaky_cache_append")
        assert grows.evidence["growth_bytes_per_step"] == scenario["leaked_bytes"] // scenario["leaked_tensors"]


@pytest.mark.parametrize(("size", "divisions", "block"), [
    (4, {}, 512), (512, {}, 512), (513, {}, 1024), (2 << 20, {}, 2 << 20), ((1 << 20) + 1, {}, (1 << 20) + 512),
    # PYTORCH_CUDA_ALLOC_CONF=roundup_power2_divisions:4 -> 1.25, 1.5, 1.75, 2 MiB steps above 1 MiB
    ((1 << 20) + 1, {"1": 4}, (1 << 20) + (1 << 18)), (3 << 19, {"1": 4}, 3 << 19), ((5 << 20) + 7, {"4": 2}, 6 << 20),
])
def test_block_size_is_the_caching_allocators_rounding(size, divisions, block):
    """The real leak snapshot held two live 4-byte tensors at its peak: 1,016 bytes the trace's
    requested sizes miss and max_memory_allocated() counts (c10 CUDACachingAllocator round_size)."""
    from pastaprof.importers.memory_snapshot import _roundup_divisions, block_size

    assert block_size(size, _roundup_divisions({"allocator_settings": {"roundup_power2_divisions": divisions}})) == block
