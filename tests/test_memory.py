"""The memory tool against real PyTorch-profiler traces, checked with numbers computed
independently from the raw JSON (gzip + json, a plain Python replay)."""

from __future__ import annotations

import functools
import gzip
import json
from itertools import accumulate
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import pastaprof
from pastaprof.tools.memory import Memory

DATA = Path(__file__).parent / "data"
TRACES = sorted(p.name for p in DATA.glob("*.json.gz"))
EXAMPLE = "example"
MiB = 1 << 20
DEVICE_TYPES = {0: "cpu", 1: "cuda"}


def _path(name: str) -> Path:
    return pastaprof.example_path() if name == EXAMPLE else DATA / name


@functools.cache
def report(name: str):
    (r,) = pastaprof.analyze(_path(name), tools=["memory"])
    return r


@functools.cache
def raw(name: str) -> dict:
    """Per (device_type, device): a replay of the raw [memory] events, done by hand."""
    path = _path(name)
    with gzip.open(path) if path.suffix == ".gz" else open(path) as f:
        doc = json.load(f)
    base = doc.get("baseTimeNanoseconds", 0)
    events = doc["traceEvents"]
    ops = [e for e in events if e.get("cat") == "cpu_op" and e.get("ph") == "X" and e.get("dur", 0) > 0]
    mem = sorted((e for e in events if e.get("name") == "[memory]"), key=lambda e: e["ts"])
    out = {}
    for key in sorted({(DEVICE_TYPES[e["args"]["Device Type"]], e["args"]["Device Id"]) for e in mem}):
        evs = [e for e in mem if (DEVICE_TYPES[e["args"]["Device Type"]], e["args"]["Device Id"]) == key]
        b = [e["args"]["Bytes"] for e in evs]
        ta = [e["args"]["Total Allocated"] for e in evs]
        cs = list(accumulate(b))
        peak = cs.index(max(cs))
        live: dict[int, int] = {}        # address -> index of its open alloc
        pairs, pre_frees = {}, []        # alloc index -> free index; (index, bytes) of pre-trace frees
        for i, e in enumerate(evs):
            a = e["args"]["Addr"]
            if b[i] > 0:
                live[a] = i
            elif a in live:
                pairs[live.pop(a)] = i
            else:
                pre_frees.append((i, -b[i]))
        allocs = [i for i in range(len(b)) if b[i] > 0]
        out[key] = {
            "allocs": len(allocs), "frees": sum(x < 0 for x in b),
            "offset": ta[0] - b[0], "max_total_allocated": max(ta), "max_cumsum": max(cs),
            "pretrace_freed_before_peak": sum(n for i, n in pre_frees if i <= peak),
            "live_at_peak": sum(b[i] for i in allocs if i <= peak and pairs.get(i, len(b)) > peak),
            "never_freed": sum(b[i] for i in live.values()),
            "never_freed_blocks": len(live),
            # allocation time (ns, as the importer computes it) -> its event
            "alloc_event": {round(evs[i]["ts"] * 1000) + base: evs[i] for i in allocs},
        }
    out["ops"] = ops
    return out


def _innermost(ops: list[dict], e: dict) -> str | None:
    """Name of the innermost cpu_op on the event's thread whose interval holds it."""
    t = round(e["ts"] * 1000)
    hits = [o for o in ops if o["pid"] == e["pid"] and o["tid"] == e["tid"]
            and round(o["ts"] * 1000) <= t < round(o["ts"] * 1000) + round(o["dur"] * 1000)]
    return max(hits, key=lambda o: (o["ts"], -o["dur"]))["name"] if hits else None


def _devices(x: dict) -> dict:
    return {k: v for k, v in x.items() if k != "ops"}


def _device_rows(r) -> dict:
    return {(d["device_type"], d["device"]): d for d in r.tables["devices"].to_pylist()}


ALL = TRACES + [EXAMPLE]


@pytest.mark.parametrize("name", ALL)
def test_replay_matches_allocator(name):
    rows, expected = _device_rows(report(name)), _devices(raw(name))
    assert set(rows) == set(expected)
    for key, x in expected.items():
        d = rows[key]
        # the replay, shifted by the allocator's level before the trace, reaches the allocator's own maximum
        assert x["max_cumsum"] + x["offset"] == x["max_total_allocated"], key
        assert d["peak_bytes"] == x["max_total_allocated"], key
        assert d["peak_replayed_bytes"] == x["max_cumsum"], key
        assert d["pretrace_offset_bytes"] == x["offset"], key
        assert d["replay_consistent"] and d["mismatched_events"] == 0, key
        assert (d["alloc_events"], d["free_events"]) == (x["allocs"], x["frees"]), key


@pytest.mark.parametrize("name", ALL)
def test_counts_match_raw_memory_events(name):
    s, expected = report(name).summary, _devices(raw(name))
    assert s["alloc_events"] == sum(x["allocs"] for x in expected.values())
    assert s["free_events"] == sum(x["frees"] for x in expected.values())
    assert s["devices"] == len(expected)


@pytest.mark.parametrize("name", ALL)
def test_live_at_peak(name):
    r = report(name)
    rows, expected = _device_rows(r), _devices(raw(name))
    by_site = r.tables["live_at_peak_by_site"].to_pylist()
    for key, x in expected.items():
        d = rows[key]
        # blocks allocated in the trace and live at the peak == peak - pre-trace offset (+ pre-trace
        # blocks already freed by then, none in these traces)
        assert x["pretrace_freed_before_peak"] == 0
        assert d["live_at_peak_bytes"] == d["peak_bytes"] - d["pretrace_offset_bytes"] == x["live_at_peak"], key
        assert d["live_at_peak_bytes"] + d["pretrace_at_peak_bytes"] == d["peak_bytes"]
        site_sum = sum(g["bytes"] for g in by_site if (g["device_type"], g["device"]) == key and not g["pretrace"])
        assert site_sum == d["live_at_peak_bytes"], key
        assert sum(g["blocks"] for g in by_site if (g["device_type"], g["device"]) == key
                   and not g["pretrace"]) == d["live_at_peak_blocks"]
    # the largest live blocks: sorted, alive at the peak, named by the innermost op around their allocation
    live = r.tables["live_at_peak"].to_pylist()
    assert live
    for key in expected:
        mine = [b for b in live if (b["device_type"], b["device"]) == key]
        assert [b["bytes"] for b in mine] == sorted((b["bytes"] for b in mine), reverse=True)
        peak_ns = rows[key]["peak_ns"]
        for b in mine:
            assert b["alloc_ns"] <= peak_ns and (b["free_ns"] is None or b["free_ns"] > peak_ns)
            assert b["op_name"] == _innermost(raw(name)["ops"], expected[key]["alloc_event"][b["alloc_ns"]]), (key, b)


@pytest.mark.parametrize("name", ALL)
def test_never_freed_matches_raw_pairing(name):
    r = report(name)
    rows, expected = _device_rows(r), _devices(raw(name))
    never = r.tables["never_freed"].to_pylist()
    for key, x in expected.items():
        assert rows[key]["never_freed_bytes"] == x["never_freed"], key
        assert rows[key]["never_freed_blocks"] == x["never_freed_blocks"], key
        assert sum(g["bytes"] for g in never if (g["device_type"], g["device"]) == key) == x["never_freed"]
    assert r.summary["never_freed_bytes"] == sum(x["never_freed"] for x in expected.values())
    has_finding = any("still live at its end" in f.title for f in r.findings)
    assert has_finding == (r.summary["never_freed_bytes"] > 0)


@pytest.mark.parametrize("name", ALL)
def test_footprint_curve_keeps_the_peak(name):
    r = report(name)
    fp = r.tables["footprint"].to_pylist()
    for key, d in _device_rows(r).items():
        pts = [p for p in fp if (p["device_type"], p["device"]) == key]
        assert 0 < len(pts) <= 500
        assert max(p["allocated_bytes"] for p in pts) == d["peak_bytes"]
        assert all(p["allocated_bytes"] == p["total_allocated"] for p in pts)
        assert all(p["allocated_bytes"] - p["replayed_bytes"] == d["pretrace_offset_bytes"] for p in pts)
        assert [p["time_ns"] for p in pts] == sorted(p["time_ns"] for p in pts)
        assert pts[-1]["allocated_bytes"] == d["end_bytes"]


def test_example_is_downsampled():
    fp = report(EXAMPLE).tables["footprint"]
    gpu = [p for p in fp.to_pylist() if p["device_type"] == "cuda"]
    assert raw(EXAMPLE)[("cuda", 0)]["allocs"] > 1000 and len(gpu) <= 500


def test_planted_leak():
    r = report("leak_5steps.pt.trace.json.gz")
    x = raw("leak_5steps.pt.trace.json.gz")[("cuda", 0)]
    assert x["never_freed"] == 5 * 4 * MiB and x["never_freed_blocks"] == 5
    assert r.summary["never_freed_bytes"] == 5 * 4 * MiB
    (never,) = r.tables["never_freed"].to_pylist()
    assert (never["device_type"], never["op_name"], never["call_site"]) == ("cuda", "aten::mul", "record.py(51): <module>")
    assert (never["bytes"], never["blocks"]) == (20 * MiB, 5)
    leaks = [f for f in r.findings if "grows" in f.title]
    assert len(leaks) == 1
    (leak,) = leaks
    assert leak.severity == "warning" and "4.0 MiB per step" in leak.title
    assert leak.evidence["growth_bytes_per_step"] == 4 * MiB
    assert leak.evidence["steps"] == 5 and leak.evidence["total_growth_bytes"] == 20 * MiB
    assert leak.location == "aten::mul @ record.py(51): <module>"
    assert r.summary["leak_bytes_per_step"] == 4 * MiB and r.summary["steps"] == 5
    (surv,) = r.tables["step_survivors"].to_pylist()
    assert (surv["op_name"], surv["bytes"], surv["blocks"], surv["steps"]) == ("aten::mul", 20 * MiB, 5, 5)
    gpu_steps = [s for s in r.tables["steps"].to_pylist() if s["device_type"] == "cuda"]
    assert [s["growth_bytes"] for s in gpu_steps] == [4 * MiB] * 5
    assert [s["survivor_bytes"] for s in gpu_steps] == [4 * MiB] * 5
    # the host side of the same loop allocates and frees an 8-byte scalar: no growth there
    cpu_steps = [s for s in r.tables["steps"].to_pylist() if s["device_type"] == "cpu"]
    assert [s["growth_bytes"] for s in cpu_steps] == [0] * 5


@pytest.mark.parametrize("name", [n for n in ALL if not n.startswith("leak")])
def test_no_false_leak(name):
    r = report(name)
    assert not [f for f in r.findings if "grows" in f.title]
    assert r.summary["leak_bytes_per_step"] == 0


def test_step_sources():
    mlp = report("mlp_train_3steps.pt.trace.json.gz").tables["steps"].to_pylist()
    assert {s["source"] for s in mlp} == {"step ranges"}
    assert [s["step"] for s in mlp if s["device_type"] == "cuda"] == ["step0", "step1", "step2"]
    gpt2 = report("gpt2_small2l_train_3steps.pt.trace.json.gz").tables["steps"].to_pylist()
    assert {s["source"] for s in gpt2} == {"optimizer steps"} and len([s for s in gpt2 if s["device_type"] == "cuda"]) == 3
    (mlp_never,) = report("mlp_train_3steps.pt.trace.json.gz").tables["never_freed"].to_pylist()
    assert (mlp_never["bytes"], mlp_never["op_name"]) == (512, "aten::nll_loss_forward")


def test_loaded_run_gives_same_summary():
    name = "two_streams_copies.pt.trace.json.gz"
    (r,) = pastaprof.analyze(pastaprof.load(DATA / name), tools=["memory"])
    assert r.summary == report(name).summary


# ---- synthetic traces for cases the recorded ones lack


def _mem(ts, nbytes, addr, total, dev=0, dtype=1):
    return {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": ts,
            "args": {"Total Reserved": 1 << 30, "Total Allocated": total, "Bytes": nbytes, "Device Id": dev,
                     "Device Type": dtype, "Addr": addr}}


def _x(name, ts, dur, cat="cpu_op"):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": {}}


def _write(tmp_path, events) -> Path:
    p = tmp_path / "synthetic.pt.trace.json"
    p.write_text(json.dumps({"traceEvents": events}))
    return p


def test_pretrace_frees_and_address_reuse(tmp_path):
    # The allocator holds 1200 B before the trace: 600 B at 0x10 and 400 B at 0x20 are freed in
    # it, 200 B never are.  0x100 is allocated, freed and allocated again.
    events = [_mem(10, 100, 0x100, 1300), _mem(20, -600, 0x10, 700), _mem(30, 800, 0x200, 1500),
              _mem(40, -100, 0x100, 1400), _x("aten::add", 44, 16), _x("aten::empty", 45, 10),
              _mem(50, 250, 0x100, 1650), _mem(60, -800, 0x200, 850), _mem(70, -400, 0x20, 450)]
    (r,) = pastaprof.analyze(_write(tmp_path, events), tools=["memory"])
    (d,) = r.tables["devices"].to_pylist()
    assert (d["alloc_events"], d["free_events"]) == (3, 4)
    assert (d["pretrace_offset_bytes"], d["peak_bytes"], d["peak_replayed_bytes"]) == (1200, 1650, 450)
    assert d["peak_ns"] == 50_000
    # live at the peak: 800 + 250 allocated in the trace = replayed peak + the 600 pre-trace bytes freed before it
    assert d["live_at_peak_bytes"] == 1050 == d["peak_replayed_bytes"] + 600
    assert d["pretrace_at_peak_bytes"] == 600  # 400 B freed later + 200 B never
    assert (d["pretrace_freed_bytes"], d["pretrace_unfreed_bytes"]) == (1000, 200)
    assert (d["never_freed_blocks"], d["never_freed_bytes"], d["end_bytes"]) == (1, 250, 450)
    live = r.tables["live_at_peak"].to_pylist()
    assert [(b["bytes"], b["pretrace"], b["op_name"]) for b in live] == [
        (800, False, None), (400, True, None), (250, False, "aten::empty")]
    (never,) = r.tables["never_freed"].to_pylist()
    assert (never["bytes"], never["blocks"], never["op_name"]) == (250, 1, "aten::empty")


def _profiler_step_trace(leak_bytes: int, free_it: bool = False):
    events, total, t0 = [], 10 * MiB, 1000
    for i in range(4):
        s = t0 + 100 * i
        events.append(_x(f"ProfilerStep#{i + 7}", s, 90, cat="user_annotation"))
        events.append(_x("aten::empty", s + 10, 10))
        events.append(_mem(s + 12, 2 * MiB, 0x9000, total := total + 2 * MiB))
        events.append(_x("aten::mul", s + 30, 10))
        events.append(_mem(s + 32, leak_bytes, 0x1000 + i * 0x10_0000, total := total + leak_bytes))
        events.append(_mem(s + 50, -2 * MiB, 0x9000, total := total - 2 * MiB))
        if free_it:
            events.append(_mem(s + 60, -leak_bytes, 0x1000 + i * 0x10_0000, total := total - leak_bytes))
    return events


def test_profiler_step_leak(tmp_path):
    path = _write(tmp_path, _profiler_step_trace(MiB))
    (r,) = pastaprof.analyze(path, tools=["memory"])
    steps = r.tables["steps"].to_pylist()
    assert [s["step"] for s in steps] == [f"ProfilerStep#{i}" for i in range(7, 11)]
    assert {s["source"] for s in steps} == {"ProfilerStep"}
    assert [s["growth_bytes"] for s in steps] == [MiB] * 4
    assert [s["peak_bytes"] - s["allocated_at_start"] for s in steps] == [3 * MiB] * 4
    (leak,) = [f for f in r.findings if "grows" in f.title]
    assert leak.evidence["growth_bytes_per_step"] == MiB and leak.location == "aten::mul"
    # below the threshold: measured, not reported
    (quiet,) = pastaprof.analyze(path, tools=[Memory(leak_min_bytes=2 * MiB)])
    assert not [f for f in quiet.findings if "grows" in f.title]
    # no growth, no finding
    (flat,) = pastaprof.analyze(_write(tmp_path, _profiler_step_trace(MiB, free_it=True)), tools=["memory"])
    assert [s["growth_bytes"] for s in flat.tables["steps"].to_pylist()] == [0] * 4
    assert not [f for f in flat.findings if "grows" in f.title] and flat.summary["never_freed_bytes"] == 0


def test_no_memory_events(tmp_path):
    (r,) = pastaprof.analyze(_write(tmp_path, [_x("aten::mm", 1, 5)]), tools=["memory"])
    assert r.summary["alloc_events"] == 0 and r.summary["devices"] == 0 and not r.findings


CATEGORY_APP = '''
import sys, torch
from torch.profiler import profile, ProfilerActivity, record_function
torch.manual_seed(0)
x = torch.randn(64, 256)
with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for i in range(3):
        with record_function(f"step{i}"):
            loss = model(x).sum()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
prof.export_chrome_trace(sys.argv[1])
'''


def test_categories_of_a_real_training_trace(tmp_path):
    """A real PyTorch (CPU) training loop recorded by torch.profiler: the memory tool's
    inferred categories equal what the model and optimizer are known to hold."""
    pytest.importorskip("torch")
    import subprocess
    import sys

    app = tmp_path / "rec.py"
    app.write_text(CATEGORY_APP)
    trace = tmp_path / "t.json"
    subprocess.run([sys.executable, str(app), str(trace)], check=True, capture_output=True)
    rep = pastaprof.analyze(pastaprof.load(trace), ["memory"])[0]
    params = 2 * (256 * 256 + 256) * 4            # two Linear layers, float32
    lt = rep.details["lifetimes"]
    by_cat = {r["category"]: (r["bytes_sum"], r["bytes_count"])
              for r in lt.group_by("category").aggregate([("bytes", "sum"), ("bytes", "count")]).to_pylist()}
    assert by_cat["parameters"] == (params, 4)      # made in the trace before step0, live to the end
    assert by_cat["optimizer_state"] == (params, 4)  # SGD momentum buffers, made in the first opt.step
    assert by_cat["gradients"] == (3 * params, 12)  # made in backward, freed by zero_grad after opt.step
    assert by_cat["activations"] == (3 * 64 * 256 * 4, 3)  # ReLU output saved for backward, each step
    peak = rep.summary["peak_by_category"]
    assert sum(peak.values()) == rep.summary["peak_bytes"]
    assert peak["parameters"] == peak["optimizer_state"] == peak["gradients"] == params
    grads = lt.filter(pc.equal(lt["category"], "gradients")).to_pylist()
    assert all(g["op_name"] and g["free_ns"] > g["alloc_ns"] for g in grads)


def test_peak_by_category_accounts_for_the_whole_peak():
    """GPT-2 example (H200): every byte at the peak has a category; what the allocator held
    from before the trace (weights, grads, Adam state of a model built earlier) is before_trace."""
    rep = pastaprof.analyze(pastaprof.load(pastaprof.example_path()), ["memory"])[0]
    cats = rep.summary["peak_by_category"]
    assert sum(cats.values()) == rep.summary["peak_bytes"] == 7_717_583_360
    dev = next(d for d in rep.tables["devices"].to_pylist() if d["device_type"] == "cuda")
    assert cats["before_trace"] == dev["pretrace_at_peak_bytes"] > 0
    assert max(cats, key=cats.get) == "activations"


# ---- use-based patterns (DrGPUM): a real CPU workload with planted patterns

PLANTED_APP = '''
import sys, time, torch
import pastaprof
from torch.profiler import profile, ProfilerActivity
MiB = 1 << 20
def floats(nbytes):
    return nbytes // 4
torch.manual_seed(0)
keep = []
with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
    for i in range(4):
        with pastaprof.range(f"step{i}"):
            a = torch.randn(floats(4 * MiB))
            b = a * 2
            s = b.sum()
            del a, b
            keep.append(torch.ones(floats(2 * MiB)) + i)  # PLANT leak
    unused = torch.empty(floats(3 * MiB))  # PLANT unused
    early = torch.empty(floats(4 * MiB))  # PLANT early
    time.sleep(0.3)
    big = torch.randn(floats(16 * MiB))  # PEAK: early and unused are idle under it
    big.sum()
    del big
    time.sleep(0.3)
    early.fill_(1.0)  # FIRST USE early
    early.sum()  # LAST USE early
    del early, unused
    late = torch.rand(floats(6 * MiB))  # PLANT late
    late.sum()  # LAST USE late
    time.sleep(0.6)
    del late
    n3 = torch.empty(floats(3 * MiB))  # NORMAL 3
    n3.zero_()  # USE n3
    del n3
    n4 = torch.empty(floats(4 * MiB))  # NORMAL 4
    n4.fill_(2.0)
    n4.sum()
    del n4
    n6 = torch.rand(floats(6 * MiB))  # NORMAL 6
    n6.sum()
    del n6
prof.export_chrome_trace(sys.argv[1])
print("ok")
'''


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """PLANTED_APP run under ``pastaprof run`` with the Python op mode (PASTAPROF_NATIVE=0: ops
    with their input data pointers) and torch.profiler(profile_memory=True) inside it (the CPU
    allocator's block events); the memory tool gets both, as recorded."""
    pytest.importorskip("torch")
    import os
    import subprocess
    import sys

    from pastaprof.store.run import Run

    d = tmp_path_factory.mktemp("planted")
    app = d / "planted.py"
    app.write_text(PLANTED_APP)
    env = dict(os.environ, PASTAPROF_NATIVE="0", PASTAPROF_FLUSH_MS="200")
    r = subprocess.run([sys.executable, "-m", "pastaprof.cli", "run", "-o", str(d / "run"), "-t", "ops", "--",
                        sys.executable, str(app), str(d / "t.json")], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "ok\n"
    ops_run, prof = pastaprof.load(d / "run"), pastaprof.load(d / "t.json")
    assert ops_run.manifest["processes"][0]["handlers"]["torch"]["mechanism"] == "python"
    run = Run(ops_run.manifest, tables={"op": ops_run.table("op"), "range": ops_run.table("range"),
                                        "tensor": prof.table("tensor")})
    doc = json.loads((d / "t.json").read_text())
    base = doc.get("baseTimeNanoseconds", 0)
    mem = [(round(e["ts"] * 1000) + base, e["args"]["Addr"], e["args"]["Bytes"], e["args"]["Total Allocated"])
           for e in doc["traceEvents"] if e.get("name") == "[memory]"]
    lines = {}  # marker comment -> its line number in the app
    for i, text in enumerate(PLANTED_APP.splitlines(), 1):
        if "# " in text:
            lines[text.partition("# ")[2]] = i
    return {"app": app, "run": run, "mem": sorted(mem), "line": lines, "ops": ops_run.table("op").to_pylist()}


def _site(p, marker: str) -> str:
    return f"{p['app']}({p['line'][marker]}): <module>"


def _op(p, name: str, marker: str) -> dict:
    (o,) = [o for o in p["ops"] if o["name"] == name and o["call_site"] == _site(p, marker)]
    return o


def _block(p, alloc_op: dict, nbytes: int) -> tuple[int, int | None]:
    """From the profiler's raw events: (alloc ns, free ns or None) of the block of ``nbytes``
    allocated inside ``alloc_op``."""
    (a,) = [m for m in p["mem"] if m[2] == nbytes and alloc_op["start_ns"] <= m[0] <= alloc_op["end_ns"]]
    frees = [m[0] for m in p["mem"] if m[1] == a[1] and m[2] == -nbytes and m[0] >= a[0]]
    return a[0], min(frees, default=None)


PATTERN_TITLES = ("never used", "before first use", "after last use")


def test_planted_patterns_found_exactly(planted):
    p = planted
    # the planted gaps are >= 0.3 s; the default threshold (5% of this ~1.5 s run, >= 10 ms) is also
    # crossed by a stall of the loaded test machine between a temporary's last use and its free
    (rep,) = pastaprof.analyze(p["run"], [Memory(idle_min_ns=250_000_000)])
    assert rep.summary["use_data"] == "ops"
    rows = rep.tables["memory_patterns"].to_pylist()
    got = {(r["pattern"], r["op"], r["site"], r["blocks"], r["bytes"], r["peak_bytes_saved"]) for r in rows}
    assert got == {
        ("unused", "aten.empty.memory_format", _site(p, "PLANT unused"), 1, 3 * MiB, 3 * MiB),
        ("early_allocation", "aten.empty.memory_format", _site(p, "PLANT early"), 1, 4 * MiB, 4 * MiB),
        ("late_deallocation", "aten.rand.default", _site(p, "PLANT late"), 1, 6 * MiB, 0),
    }
    assert len(rows) == 3
    assert rep.summary["pattern_bytes"] == {"unused": 3 * MiB, "early_allocation": 4 * MiB,
                                            "late_deallocation": 6 * MiB}
    # idle times, from the profiler's raw alloc/free events and the recorded ops
    by = {r["pattern"]: r for r in rows}
    e_alloc, e_free = _block(p, _op(p, "aten.empty.memory_format", "PLANT early"), 4 * MiB)
    first = _op(p, "aten.fill_.Scalar", "FIRST USE early")["start_ns"]
    assert by["early_allocation"]["idle_ns"] == first - e_alloc >= 600_000_000  # two 0.3 s sleeps
    u_alloc, u_free = _block(p, _op(p, "aten.empty.memory_format", "PLANT unused"), 3 * MiB)
    assert by["unused"]["idle_ns"] == u_free - u_alloc >= 600_000_000
    l_alloc, l_free = _block(p, _op(p, "aten.rand.default", "PLANT late"), 6 * MiB)
    last = _op(p, "aten.sum.default", "LAST USE late")["start_ns"]
    assert by["late_deallocation"]["idle_ns"] == l_free - last >= 600_000_000
    # the peak (the allocator's own maximum) falls while `big` is live: early and unused idle under it
    (d,) = rep.tables["devices"].to_pylist()
    assert d["peak_bytes"] == max(m[3] for m in p["mem"])
    b_alloc, b_free = _block(p, _op(p, "aten.randn.default", "PEAK: early and unused are idle under it"), 16 * MiB)
    assert b_alloc <= d["peak_ns"] < b_free and e_alloc < d["peak_ns"] < first
    # one finding per planted site, naming it; nothing else about patterns
    found = {f.evidence["pattern"]: f for f in rep.findings if f.evidence.get("pattern")}
    assert set(found) == {"unused", "early_allocation", "late_deallocation"}
    assert found["early_allocation"].location == f"aten.empty.memory_format @ {_site(p, 'PLANT early')}"
    assert found["unused"].evidence["bytes"] == 3 * MiB and "never used" in found["unused"].title
    assert found["late_deallocation"].location == f"aten.rand.default @ {_site(p, 'PLANT late')}"
    # the leak is still found, at its site, and is no use pattern
    (leak,) = [f for f in rep.findings if "grows" in f.title]
    assert leak.evidence["growth_bytes_per_step"] == 2 * MiB and leak.evidence["steps"] == 4
    assert leak.location == f"aten.add.Tensor @ {_site(p, 'PLANT leak')}"


def test_planted_block_uses(planted):
    """Per block: first and last use and the number of uses, against the recorded ops."""
    p = planted
    (rep,) = pastaprof.analyze(p["run"], ["memory"])
    lt = {(b["call_site"], b["bytes"]): b for b in rep.details["lifetimes"].to_pylist() if b["bytes"] >= MiB
          and b["call_site"] != _site(p, "PLANT leak")}
    early = lt[_site(p, "PLANT early"), 4 * MiB]
    assert (early["uses"], early["first_use_ns"], early["last_use_ns"]) == (
        2, _op(p, "aten.fill_.Scalar", "FIRST USE early")["start_ns"], _op(p, "aten.sum.default", "LAST USE early")["start_ns"])
    unused = lt[_site(p, "PLANT unused"), 3 * MiB]
    assert (unused["uses"], unused["first_use_ns"], unused["last_use_ns"]) == (0, None, None)
    late = lt[_site(p, "PLANT late"), 6 * MiB]   # made by rand (a use: it wrote it), read by sum
    assert (late["uses"], late["first_use_ns"], late["last_use_ns"]) == (
        2, late["alloc_ns"], _op(p, "aten.sum.default", "LAST USE late")["start_ns"])
    n3 = lt[_site(p, "NORMAL 3"), 3 * MiB]       # factory, then zero_: one use, right away
    assert (n3["uses"], n3["first_use_ns"]) == (1, _op(p, "aten.zero_.default", "USE n3")["start_ns"])
    assert all(b["use_data_complete"] for b in rep.details["lifetimes"].to_pylist() if b["op_name"])
    leak = [b for b in rep.details["lifetimes"].to_pylist() if b["call_site"] == _site(p, "PLANT leak")
            and b["bytes"] == 2 * MiB]
    made = [b for b in leak if b["op_name"] == "aten.add.Tensor"]   # kept, never freed, never read again
    assert len(made) == 4 and all(b["free_ns"] is None and b["uses"] == 1 for b in made)
    temps = [b for b in leak if b["op_name"] == "aten.ones.default"]  # the same size, read at once and freed
    assert len(temps) == 4 and all(b["uses"] == 2 and b["free_ns"] is not None for b in temps)


def test_planted_thresholds_are_applied(planted):
    p = planted
    (big,) = pastaprof.analyze(p["run"], [Memory(pattern_min_bytes=8 * MiB)])
    assert big.summary["use_data"] == "ops" and big.tables["memory_patterns"].num_rows == 0
    (slow,) = pastaprof.analyze(p["run"], [Memory(idle_min_ns=2_000_000_000)])  # idle must exceed 2 s
    assert [r["pattern"] for r in slow.tables["memory_patterns"].to_pylist()] == ["unused"]


def test_no_use_data_no_patterns(planted):
    """Ops without input pointers (an import, an older run): said once, no pattern guessed."""
    from pastaprof.store.run import Run

    run = planted["run"]
    ops = run.table("op").drop_columns(["input_ptrs"])
    (rep,) = pastaprof.analyze(Run(run.manifest, tables={"op": ops, "range": run.table("range"),
                                                         "tensor": run.table("tensor")}), ["memory"])
    assert rep.summary["use_data"] == "none" and "pattern_bytes" not in rep.summary
    assert rep.tables["memory_patterns"].num_rows == 0
    assert not [f for f in rep.findings if f.evidence.get("pattern") or any(t in f.title for t in PATTERN_TITLES)]
    assert rep.details["lifetimes"]["uses"].null_count == rep.details["lifetimes"].num_rows
    assert [f for f in rep.findings if "grows" in f.title]  # the leak does not need uses
    # dropped ops: an absence of uses proves nothing either
    manifest = json.loads(json.dumps(run.manifest))
    manifest["processes"][0]["handlers"]["torch"]["dropped"] = 7
    (drop,) = pastaprof.analyze(Run(manifest, tables={k: run.table(k) for k in ("op", "range", "tensor")}), ["memory"])
    assert drop.summary["use_data"] == "none" and "dropped" in drop.summary["use_data_note"]
    assert drop.tables["memory_patterns"].num_rows == 0


def test_recorded_traces_have_no_use_data():
    for name in ALL:
        r = report(name)
        assert r.summary["use_data"] == "none" and r.tables["memory_patterns"].num_rows == 0


def _kernel_use_run(extra_launch: bool = False):
    """cuda:0 blocks used only by instrumented kernel launches (access_summary rows joined to
    their kernels by correlation), times in ms from 1 s."""
    from pastaprof.events.schema import conform
    from pastaprof.store.run import Run

    ms, t0, base = 1_000_000, 1_000_000_000, 0x7F00_0000_0000
    a, b, c, d = base, base + 4 * MiB, base + 16 * MiB, base + 32 * MiB
    blocks = [  # address, bytes, alloc ms, free ms
        (a, 2 * MiB, 0, 900), (b, 4 * MiB, 5, 800), (c, 2 * MiB, 20, 950), (d, 2 * MiB, 0, 40), (d, 2 * MiB, 300, 330)]
    evs = sorted([(t0 + al * ms, addr, n) for addr, n, al, _ in blocks] + [(t0 + fr * ms, addr, -n) for addr, n, _, fr in blocks])
    total = list(accumulate(e[2] for e in evs))
    tensor = conform("tensor", pa.table({
        "start_ns": [e[0] for e in evs], "end_ns": [e[0] for e in evs], "rank": pa.array([0] * len(evs), pa.int32()),
        "device": pa.array([0] * len(evs), pa.int32()), "pid": [1] * len(evs), "tid": [1] * len(evs),
        "address": pa.array([e[1] for e in evs], pa.uint64()), "bytes": [e[2] for e in evs],
        "total_allocated": total, "total_reserved": [64 * MiB] * len(evs), "device_type": ["cuda"] * len(evs)}))
    launches = [  # correlation, start ms, object address, object bytes (None: accesses outside every object)
        (1, 10, a, 2 * MiB), (1, 10, None, None), (2, 890, a, 2 * MiB), (3, 600, c + MiB, 4096), (4, 20, d, 2 * MiB),
        (5, 310, d, 2 * MiB)]
    kern = sorted({(k, t) for k, t, _, _ in launches} | ({(6, 700)} if extra_launch else set()))
    kernel = conform("kernel", pa.table({
        "start_ns": [t0 + t * ms for _, t in kern], "end_ns": [t0 + t * ms + 1000 for _, t in kern],
        "rank": pa.array([0] * len(kern), pa.int32()), "device": pa.array([0] * len(kern), pa.int32()),
        "pid": [1] * len(kern), "correlation": [k for k, _ in kern], "name": ["k"] * len(kern)}))
    acc = conform("access_summary", pa.table({
        "start_ns": [0] * len(launches), "end_ns": [0] * len(launches), "rank": pa.array([0] * len(launches), pa.int32()),
        "correlation": [x[0] for x in launches], "object_address": pa.array([x[2] for x in launches], pa.uint64()),
        "object_bytes": pa.array([x[3] for x in launches], pa.int64()), "reads": [1] * len(launches)}))
    return Run({"ranks": [0]}, tables={"tensor": tensor, "kernel": kernel, "access_summary": acc}), (b, c)


def test_kernel_access_uses():
    run, (b, c) = _kernel_use_run()
    (rep,) = pastaprof.analyze(run, ["memory"])
    assert rep.summary["use_data"] == "kernels"
    lt = {(x["address"], x["alloc_ns"]): x for x in rep.details["lifetimes"].to_pylist()}
    ms, t0 = 1_000_000, 1_000_000_000
    uses = sorted((x["address"] - 0x7F00_0000_0000, (x["alloc_ns"] - t0) // ms, x["uses"],
                   None if x["first_use_ns"] is None else (x["first_use_ns"] - t0) // ms,
                   None if x["last_use_ns"] is None else (x["last_use_ns"] - t0) // ms) for x in lt.values())
    # the block at d is used by launch 4 in its first life and launch 5 in its second; c through a view inside it
    assert uses == [(0, 0, 2, 10, 890), (4 * MiB, 5, 0, None, None), (16 * MiB, 20, 1, 600, 600),
                    (32 * MiB, 0, 1, 20, 20), (32 * MiB, 300, 1, 310, 310)]
    (d,) = rep.tables["devices"].to_pylist()
    assert (d["peak_bytes"], d["peak_ns"]) == (10 * MiB, t0 + 20 * ms)   # a, b, c and d's first life
    rows = {(r["pattern"], r["bytes"], r["idle_ns"], r["peak_bytes_saved"]) for r in rep.tables["memory_patterns"].to_pylist()}
    # idle threshold: 5% of the 950 ms span = 47.5 ms
    assert rows == {("unused", 4 * MiB, 795 * ms, 4 * MiB), ("early_allocation", 2 * MiB, 580 * ms, 2 * MiB),
                    ("late_deallocation", 2 * MiB, 350 * ms, 0)}
    # one launch without access rows: the kernel data is partial, so no pattern
    (part,) = pastaprof.analyze(_kernel_use_run(extra_launch=True)[0], ["memory"])
    assert part.summary["use_data"] == "none" and "access_summary" in part.summary["use_data_note"]
    assert part.tables["memory_patterns"].num_rows == 0


def test_device_labels_name_host_memory_plainly():
    from pastaprof.tools._memory_patterns import device_label

    assert device_label("cpu", -1) == "cpu" and device_label("cuda", 3) == "cuda:3"
    assert device_label("cuda", None) == "cuda:None"
