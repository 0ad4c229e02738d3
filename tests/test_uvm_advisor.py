"""uvm_advisor on the unified-memory record stream CUPTI produces for a known program.

No GPU here: the records are built to CUPTI's documented semantics with the shape measured
on the H200 (capture.md section 4: a 64 MiB managed buffer written by the CPU, scaled by a
kernel -- 126 GPU-fault records of 1,044 fault groups and 64 MiB HtoD caused by coherence and
driver prefetch --, then read back by the CPU -- 192 CPU faults and 64 MiB DtoH).  The
advisor's attribution and plan are checked exactly against that known program.  The same
tool on records captured on the GPU is checked by scripts/gpu-check (issue C).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest
from conftest import assert_finding_contract

from pastaprof.events.schema import conform
from pastaprof.tools.base import RunInfo
from pastaprof.tools.uvm_advisor import UvmAdvisor, plan_of

MiB = 1 << 20
BASE = 0x7F00_0000_0000
OTHER = BASE + 256 * MiB


def _table(kind: str, **cols) -> pa.Table:
    n = len(next(iter(cols.values())))
    cols.setdefault("rank", np.zeros(n, np.int32))
    cols.setdefault("end_ns", cols["start_ns"])
    return conform(kind, pa.table(cols))


def _program():
    """The known program: ranges init (CPU writes), compute (kernel 'scale'), readback."""
    t = {}
    t["range"] = _table("range", start_ns=[1_000, 10_000, 40_000], end_ns=[9_000, 35_000, 60_000],
                        name=["init", "compute", "readback"], domain=["user"] * 3)
    t["op"] = _table("op", start_ns=[100, 200, 11_000], end_ns=[150, 250, 12_000], tid=[1, 1, 1],
                     id=[1, 2, 3], name=["cudaMallocManaged", "cudaMallocManaged", "aten::mul_"],
                     call_site=["app.py(10): <module>", "app.py(11): <module>", "app.py(20): <module>"],
                     depth=[0, 0, 0])
    t["alloc"] = _table("alloc", start_ns=[120, 220], address=pa.array([BASE, OTHER], pa.uint64()),
                        bytes=[64 * MiB, 1 * MiB], memory_kind=["managed", "managed"], device=[0, 0], tid=[1, 1])
    t["kernel"] = _table("kernel", start_ns=[13_000], end_ns=[33_000], name=["scale"], device=[0], op_id=[3],
                         correlation=[7])
    # uvm records
    rows = []
    for i in range(192):   # CPU first write: faults (count 1), access write
        rows.append(("cpu_page_fault", 2_000 + i, 2_000 + i, BASE + i * 4096 * 85, None, 1, "write", -1, -1))
    counts = np.full(126, 1044 // 126)
    counts[: 1044 - counts.sum()] += 1
    for i, c in enumerate(counts):  # GPU faults during 'scale', reads
        rows.append(("gpu_page_fault", 14_000 + i * 10, 14_000 + i * 10, BASE + i * 2 * MiB % (64 * MiB), None, int(c),
                     "read", -1, 0))
    chunk = 64 * MiB // 64
    for i in range(64):    # HtoD of the 64 MiB: coherence (48) and driver prefetch (16), 100 ns each
        cause = "coherence" if i < 48 else "prefetch"
        rows.append(("htod", 15_000 + i * 100, 15_100 + i * 100, BASE + i * chunk, chunk, None, cause, -1, 0))
    for i in range(192):   # CPU read-back faults
        rows.append(("cpu_page_fault", 41_000 + i, 41_000 + i, BASE + i * 4096 * 85, None, 1, "read", -1, -1))
    for i in range(32):    # DtoH brought back by them, 200 ns each
        rows.append(("dtoh", 42_000 + i * 200, 42_200 + i * 200, BASE + i * 2 * MiB, 2 * MiB, None, "coherence", 0, -1))
    rows.append(("gpu_page_fault", 50_000, 50_000, 0x1000, None, 3, "read", -1, 0))  # outside any allocation
    k, s, e, a, b, c, cause, src, dst = zip(*rows)
    t["uvm"] = _table("uvm", uvm_kind=list(k), start_ns=list(s), end_ns=list(e), address=pa.array(a, pa.uint64()),
                      bytes=pa.array(b, pa.int64()), count=pa.array(c, pa.int64()), cause=list(cause),
                      src_device=list(src), dst_device=list(dst), device=[0] * len(k))
    return t


def _report(tables):
    tool = UvmAdvisor()
    tool.begin(RunInfo({"ranks": [0]}))
    for kind, t in tables.items():
        for batch in t.to_batches():
            tool.on_batch(kind, batch)
    return tool.report()


def test_attribution_and_plan_of_a_known_program():
    rep = _report(_program())
    s = rep.summary
    assert s["records"] == 192 + 126 + 64 + 192 + 32 + 1
    assert s["unattributed"] == 1                       # the fault at 0x1000 is in no allocation
    assert s["gpu_faults"] == 1044 + 3 and s["cpu_faults"] == 384
    assert s["htod_bytes"] == 64 * MiB and s["dtoh_bytes"] == 64 * MiB
    allocs = rep.tables["allocations"].to_pylist()
    assert [a["name"] for a in allocs] == ["app.py(10): <module>#0 (67108864 B)", "app.py(11): <module>#0 (1048576 B)"]
    by = {(r["alloc_id"], r["point"]): r for r in rep.tables["by_allocation_and_point"].to_pylist()}
    gpu = by[(0, "range:compute")]
    assert gpu["gpu_faults"] == 1044 and gpu["htod_coherence_bytes"] == 48 * chunk_bytes()
    assert gpu["gpu_fault_migration_ns"] == 64 * 100   # coherence + driver prefetch migrations
    back = by[(0, "range:readback")]
    assert back["cpu_faults"] == 192 and back["dtoh_coherence_bytes"] == 64 * MiB
    assert by[(0, "range:init")]["cpu_faults"] == 192
    assert not any(k[0] == 1 for k in by)               # the 1 MiB buffer never faulted
    plan = plan_of(rep)
    acts = [(a["action"], a.get("to"), a.get("before"), a.get("advice")) for a in plan["actions"]]
    # first touch by the CPU needs nothing; the kernel's faults -> prefetch to the GPU before
    # 'compute' (and ReadMostly: read by the GPU, read back by the CPU); read-back -> prefetch to CPU
    assert acts == [("prefetch", "device:0", "range:compute", None),
                    ("advise", None, None, ["SetReadMostly"]),
                    ("prefetch", "cpu", "range:readback", None)]
    first = plan["actions"][0]
    assert first["allocation"] == "app.py(10): <module>#0 (67108864 B)" and first["estimated_saving_ns"] == 6400
    assert first["evidence"]["gpu_faults"] == 1044
    assert plan["actions"][2]["estimated_saving_ns"] == 32 * 200
    # one finding per planned prefetch, with its saving as the time at stake, and the unattributed note
    assert sorted(f.impact_ns for f in rep.findings) == [0, 32 * 200, 6400]
    for f in rep.findings:
        assert_finding_contract(f)


def chunk_bytes() -> int:
    return 64 * MiB // 64


def test_eviction_means_oversubscribed_and_thrashing_means_advise():
    t = _program()
    u = t["uvm"].to_pylist()
    for r in u:
        if r["uvm_kind"] == "htod" and r["cause"] == "prefetch":
            r["cause"] = "eviction"
    u.append({**u[-2], "uvm_kind": "thrashing", "bytes": 2 * MiB, "count": None, "cause": None,
              "start_ns": 44_000, "end_ns": 44_000})
    t["uvm"] = pa.Table.from_pylist(u, schema=t["uvm"].schema)
    acts = [(a["action"], a.get("before", a.get("point"))) for a in plan_of(_report(t))["actions"]]
    assert acts[0] == ("oversubscribed", "range:compute")
    assert ("advise", "range:readback") in acts
    for f in _report(t).findings:
        assert_finding_contract(f)


def test_uvm_records_without_any_allocation_are_all_unattributed():
    t = _program()
    del t["alloc"]
    rep = _report(t)
    n = t["uvm"].num_rows
    assert rep.summary["records"] == n and rep.summary["unattributed"] == n
    assert rep.summary["allocations"] == 0 and rep.summary["actions"] == 0
    assert rep.summary["htod_bytes"] == 64 * MiB and rep.summary["dtoh_bytes"] == 32 * 2 * MiB


def test_no_uvm_records_is_an_empty_plan():
    t = _program()
    t["uvm"] = t["uvm"].slice(0, 0)
    rep = _report(t)
    assert rep.summary["records"] == 0 and rep.summary["actions"] == 0


def test_cli_writes_the_plan_and_refuses_it_without_the_tool(tmp_path):
    """`pastaprof analyze -t uvm_advisor --uvm-plan` on a run without UVM records writes an
    empty plan; asking for a plan without the tool is one line and exit code 2."""
    import json
    import subprocess
    import sys

    plan = tmp_path / "plan.json"
    cmd = [sys.executable, "-m", "pastaprof.cli", "analyze", "--example", "-q"]
    r = subprocess.run(cmd + ["-t", "uvm_advisor", "--uvm-plan", str(plan)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(plan.read_text()) == {"schema": "pastaprof-uvm-plan/1", "actions": []}
    r = subprocess.run(cmd + ["-t", "kernels", "--uvm-plan", str(tmp_path / "p2.json")], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "uvm_advisor" in r.stderr
    assert not (tmp_path / "p2.json").exists()
    for extra, needle in ((["-t", "kernels", "--access-run", str(tmp_path)], "uvm_advisor"),
                          (["-t", "uvm_advisor", "--access-run", str(tmp_path / "nope")], "not a pastaprof run")):
        r = subprocess.run(cmd + extra, capture_output=True, text=True)
        assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and needle in r.stderr, r.stderr


PLAN = {"schema": "pastaprof-uvm-plan/1", "actions": [
    {"action": "prefetch", "to": "device:0", "before": "range:gpu_scale", "site": "app.py(5): <module>",
     "ordinal": 0, "allocation": "app.py(5): <module>#0 (4096 B)", "estimated_saving_ns": 6400},
    {"action": "advise", "advice": ["SetReadMostly"], "location": "device:0", "site": "app.py(5): <module>",
     "ordinal": 0},
    {"action": "prefetch", "to": "cpu", "before": "range:never", "site": "app.py(9): <module>", "ordinal": 1},
]}


def test_plan_applies_at_its_points_and_names_what_did_not_fit():
    """Dry run of the applier (no CUDA here): the advice when the allocation is made, the
    prefetch when its range begins, and the plan's entries this run did not meet."""
    import pastaprof

    applier = pastaprof.apply_uvm_plan(PLAN, dry_run=True)
    try:
        with pastaprof.range("gpu_scale"):       # before the allocation: nothing to prefetch yet
            pass
        applier.allocated(0x7F00_0000_0000, 4096, "app.py(5): <module>")   # what the cupy hook reports
        with pastaprof.range("gpu_scale"):
            pass
        assert applier.calls == [("advise:SetReadMostly", 0x7F00_0000_0000, 4096, "device:0"),
                                 ("prefetch", 0x7F00_0000_0000, 4096, "device:0")]
        assert applier.errors == ["range:gpu_scale: allocation app.py(5): <module>#0 not made (yet)"]
        assert applier.mismatches() == ["range:never never entered", "allocation app.py(9): <module>#1 never made"]
        alloc = applier.drain()["alloc"].to_pylist()
        assert [(r["name"], r["bytes"], r["memory_kind"]) for r in alloc] == [("app.py(5): <module>", 4096, "managed")]
    finally:
        from pastaprof import live

        live._range_listeners.clear()


@pytest.mark.parametrize("plan, needle", [
    ("{not json", "invalid JSON"),
    ('{"schema": "other", "actions": []}', "not a UVM plan"),
    (json.dumps({**PLAN, "actions": [{**PLAN["actions"][0], "before": "op:aten::mul_@app.py(7)"}]}),
     "only range:NAME points"),
    (json.dumps({**PLAN, "actions": [{**PLAN["actions"][1], "advice": ["SetFast"]}]}), "unknown advice"),
])
def test_a_plan_that_cannot_fit_is_refused_before_the_program_starts(tmp_path, plan, needle):
    p = tmp_path / "plan.json"
    p.write_text(plan)
    marker = tmp_path / "started"
    app = tmp_path / "app.py"
    app.write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    r = subprocess.run([sys.executable, "-m", "pastaprof.cli", "run", "-o", str(tmp_path / "run"),
                        "--apply-uvm-plan", str(p), "--", sys.executable, str(app)], capture_output=True, text=True)
    assert r.returncode == 2 and needle in r.stderr and r.stderr.strip().count("\n") == 0
    assert not marker.exists() and not (tmp_path / "run").exists()


def test_run_with_a_plan_names_the_mismatch_at_exit(tmp_path):
    """On this machine no managed allocation can be made: the run goes on, and its status
    names the plan entries that did not fit."""
    p = tmp_path / "plan.json"
    p.write_text(json.dumps(PLAN))
    app = tmp_path / "app.py"
    app.write_text("import pastaprof\nwith pastaprof.range('gpu_scale'):\n    print('ok')\n")
    env = dict(os.environ, PASTAPROF_UVM_PLAN_DRY_RUN="1")
    r = subprocess.run([sys.executable, "-m", "pastaprof.cli", "run", "-o", str(tmp_path / "run"),
                        "--apply-uvm-plan", str(p), "--", sys.executable, str(app)], capture_output=True, text=True,
                       env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "ok\n"
    m = json.loads((tmp_path / "run" / "run.json").read_text())
    status = " ".join(m["status"].values())
    assert "range:never never entered" in status and "allocation app.py(5): <module>#0 never made" in status
    assert m["processes"][0]["uvm_plan"]["dry_run"] is True


def test_allocation_without_a_device_takes_its_migrations_gpu_and_frees_end_lifetimes():
    """The registry's rows (CuPy / cuda-bindings hooks) carry no device: the plan must
    still name a real GPU (the HtoD destination), never device:-1; a free ends a lifetime."""
    t = _program()
    t["alloc"] = t["alloc"].set_column(t["alloc"].schema.get_field_index("device"), "device",
                                       pa.nulls(2, pa.int32()))
    t["uvm"] = t["uvm"].set_column(t["uvm"].schema.get_field_index("dst_device"), "dst_device",
                                   pa.array(np.where(pc_eq(t["uvm"], "htod"), 3, -1), pa.int32()))
    t["free"] = _table("free", start_ns=[300], address=pa.array([OTHER], pa.uint64()), bytes=[1 * MiB])
    rep = _report(t)
    allocs = rep.tables["allocations"].to_pylist()
    assert [a["device"] for a in allocs] == [3, 0]        # 0: no migration to tell, the default GPU
    assert allocs[1]["free_ns"] == 300 and allocs[0]["free_ns"] > 60_000
    assert [a.get("to") for a in plan_of(rep)["actions"] if a["action"] == "prefetch"] == ["device:3", "cpu"]


def pc_eq(t: pa.Table, kind: str) -> np.ndarray:
    return np.asarray(t["uvm_kind"].to_pylist()) == kind


def test_no_read_mostly_when_the_cpu_rewrites_what_the_gpu_read():
    """The H200 run of examples/uvm/cupy_managed.py: the CPU writes the buffer every
    iteration after the GPU read it; SetReadMostly there made the loop 11x slower."""
    t = _program()
    rows = t["uvm"].to_pylist()
    later = [dict(r, start_ns=36_000 + i, end_ns=36_000 + i, cause="write")
             for i, r in enumerate(r for r in rows if r["uvm_kind"] == "cpu_page_fault" and r["cause"] == "read")]
    t["uvm"] = pa.concat_tables([t["uvm"], pa.Table.from_pylist(later, schema=t["uvm"].schema)])
    acts = [a["action"] for a in plan_of(_report(t))["actions"]]
    assert "advise" not in acts and acts.count("prefetch") == 2


def test_track_managed_names_allocations_the_capture_cannot_see(tmp_path):
    """A PyTorch pluggable allocator's cudaMallocManaged is invisible to the CuPy / cuda-bindings
    hooks: pastaprof.track_managed names such an allocation by its call site, so the advisor's
    plan can refer to it.  Without --uvm (or a plan) it does nothing."""
    import subprocess
    import sys

    import pastaprof

    app = tmp_path / "prog.py"
    app.write_text("import pastaprof\n"
                   "for i in range(2):\n"
                   "    pastaprof.track_managed((1 << 40) + i * (1 << 20), 1 << 20)\n"
                   "pastaprof.track_managed(1 << 41, 4096)\n")
    for flags, expect in ((["--uvm"], 3), ([], 0)):
        out = tmp_path / f"run{len(flags)}"
        r = subprocess.run([sys.executable, "-m", "pastaprof.cli", "run", "-o", str(out), *flags, "--",
                            sys.executable, str(app)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        rows = pastaprof.load(out).table("alloc").to_pylist()
        assert len(rows) == expect
        if expect:
            site3, site4 = f"{app}(3): <module>", f"{app}(4): <module>"
            assert [(r["name"], r["bytes"], r["memory_kind"]) for r in rows] == \
                [(site3, 1 << 20, "managed"), (site3, 1 << 20, "managed"), (site4, 4096, "managed")]
            rep = _report({"alloc": pastaprof.load(out).table("alloc")})
            assert [a["name"] for a in rep.tables["allocations"].to_pylist()] == \
                [f"{site3}#0 (1048576 B)", f"{site3}#1 (1048576 B)", f"{site4}#0 (4096 B)"]


def _access_run(path, sectors_per_launch: int, launches: int = 5):
    """An access run (pastaprof run -t working_set) of the same program: the same call sites
    make the same allocations, at other addresses, and the kernel touches the 64 MiB
    buffer ``sectors_per_launch`` 32-byte sectors per launch."""
    from pastaprof.store.writer import RunWriter

    prog = _program()
    there = BASE + (1 << 40)
    with RunWriter(path) as w:
        w.write("op", 0, prog["op"])
        w.write("alloc", 0, _table("alloc", start_ns=[120, 220], address=pa.array([there, there + 256 * MiB], pa.uint64()),
                                   bytes=[64 * MiB, 1 * MiB], memory_kind=["managed", "managed"], device=[0, 0],
                                   tid=[1, 1]))
        n = launches
        w.write("access_summary", 0, _table("access_summary", start_ns=list(range(13_000, 13_000 + n)),
                                            correlation=list(range(1, n + 1)), name=["scale"] * n,
                                            object_address=pa.array([there] * n, pa.uint64()),
                                            object_bytes=[64 * MiB] * n, sectors=[sectors_per_launch] * n,
                                            reads=[sectors_per_launch] * n))
        w.commit({"ranks": [0], "source": "test"})
    return path


def _report_with(tables, access_run):
    tool = UvmAdvisor(access_run=str(access_run))
    tool.begin(RunInfo({"ranks": [0]}))
    for kind, t in tables.items():
        for batch in t.to_batches():
            tool.on_batch(kind, batch)
    return tool.report()


def test_an_access_run_that_shows_sparse_gpu_touches_pins_the_allocation_on_the_cpu(tmp_path):
    """Pin or migrate: the known program migrates 64 MiB each way (128 MiB); the access run
    says the kernel touches 16,384 sectors (512 KiB) per launch, 2.5 MiB over 5 launches,
    far under a quarter of that: pin on the CPU, map to the GPU, and no prefetch for it."""
    rep = _report_with(_program(), _access_run(tmp_path / "acc", sectors_per_launch=16_384))
    plan = plan_of(rep)
    mine = [a for a in plan["actions"] if a["allocation"].startswith("app.py(10)")]
    assert [(a["action"], a.get("advice"), a.get("location"), a.get("accessed_by")) for a in mine] == \
        [("advise", ["SetPreferredLocation", "SetAccessedBy"], "cpu", "device:0")]
    ev = mine[0]["evidence"]
    assert ev == {"bytes_migrated": 128 * MiB, "gpu_sector_bytes": 5 * 16_384 * 32, "launches": 5}
    assert mine[0]["estimated_saving_ns"] == 64 * 100 + 32 * 200  # every fault-driven migration of it
    pin = [f for f in rep.findings if "pin on the CPU" in f.title]
    assert [f.impact_ns for f in pin] == [64 * 100 + 32 * 200]
    for f in rep.findings:
        assert_finding_contract(f)


def test_an_access_run_that_shows_dense_gpu_touches_keeps_the_prefetches(tmp_path):
    """The same program with a kernel that reads every sector of the buffer each launch
    (2 MiB sectors x 32 B = 64 MiB, 320 MiB over 5 launches > 128 MiB / 4): migrate."""
    rep = _report_with(_program(), _access_run(tmp_path / "acc", sectors_per_launch=2 * MiB))
    acts = [(a["action"], a.get("to"), a.get("before")) for a in plan_of(rep)["actions"]]
    assert acts[0] == ("prefetch", "device:0", "range:compute") and ("prefetch", "cpu", "range:readback") in acts


def test_first_touch_on_the_gpu_and_faults_outside_ranges_are_not_planned():
    """GPU faults that moved no data populated fresh pages (nothing to prefetch); faults
    outside every range have no point a plan could name: a finding says to add a range."""
    t = _program()
    u = [r for r in t["uvm"].to_pylist() if r["uvm_kind"] != "htod"]  # the kernel's faults moved nothing
    u += [{**u[0], "uvm_kind": "gpu_page_fault", "start_ns": 70_000, "end_ns": 70_000, "count": 4, "cause": "read",
           "dst_device": 0, "src_device": -1},
          {**u[0], "uvm_kind": "htod", "start_ns": 70_010, "end_ns": 70_110, "bytes": 2 * MiB, "count": None,
           "cause": "coherence", "dst_device": 0, "src_device": -1}]
    t["uvm"] = pa.Table.from_pylist(u, schema=t["uvm"].schema)
    t["kernel"] = _table("kernel", start_ns=[13_000, 69_000], end_ns=[33_000, 71_000], name=["scale", "late"],
                         device=[0, 0], op_id=[3, None], correlation=[7, 8])
    rep = plan_of(rep_ := _report(t))
    assert [(a["action"], a.get("to"), a.get("before")) for a in rep["actions"]] == [("prefetch", "cpu", "range:readback")]
    assert any("outside every range" in f.title for f in rep_.findings)


def test_an_access_run_without_instruction_level_data_changes_nothing(tmp_path):
    """An access run that recorded no accesses (e.g. the sanitizer was unavailable) gives
    the same plan as no access run: nothing is pinned on a guess."""
    from pastaprof.store.writer import RunWriter

    empty = tmp_path / "acc"
    with RunWriter(empty) as w:
        w.write("op", 0, _program()["op"])
        w.commit({"ranks": [0], "source": "test"})
    assert plan_of(_report_with(_program(), empty)) == plan_of(_report(_program()))
