"""The CPU processor path of instruction-level analysis (issue D) on request streams whose
counts are known analytically: the warp-level requests a sanitizer patch records for a
vector add, a copy and a strided read (32 lanes per warp, 4-byte floats)."""

from __future__ import annotations

import numpy as np
import pyarrow.compute as pc
import pytest
from conftest import assert_finding_contract
from hypothesis import given, settings
from hypothesis import strategies as st

from pastaprof.processor.access import READ, WRITE, Objects, Requests, reduce_requests

A, B, C = 0x7F00_0000_0000, 0x7F00_1000_0000, 0x7F00_2000_0000


def _warp_requests(launch: int, pc: int, flags: int, base: int, n: int, stride_elems: int = 1, size: int = 4):
    """Requests of n threads, thread i touching base + i*stride*size, 32 threads per warp."""
    warps = (n + 31) // 32
    tid = np.arange(warps * 32).reshape(warps, 32)
    addr = (base + tid * stride_elems * size).astype(np.uint64)
    active = np.array([(1 << min(32, n - 32 * w)) - 1 if n - 32 * w < 32 else 0xFFFFFFFF for w in range(warps)],
                      np.uint32)
    return Requests(np.full(warps, launch), np.full(warps, pc, np.uint64), np.full(warps, flags),
                    np.full(warps, size), active, addr)


def _cat(*rs: Requests) -> Requests:
    return Requests(*(np.concatenate([getattr(r, f) for r in rs]) for f in
                      ("launch", "pc", "flags", "size", "active", "addresses")))


def test_vector_add_counts_exactly():
    n = 1_000_000 + 17                                   # a partial last warp
    req = _cat(_warp_requests(1, 0x10, READ, A, n), _warp_requests(1, 0x20, READ, B, n),
               _warp_requests(1, 0x30, WRITE, C, n))
    objs = Objects(np.array([1, 1, 1]), np.array([A, B, C], np.uint64), np.array([4 * n] * 3))
    out = reduce_requests(req, objs, page_bytes=1 << 16)
    s = out["access_summary"].sort_by("object_address").to_pylist()
    assert [(x["reads"], x["writes"]) for x in s] == [(n, 0), (n, 0), (0, n)]   # 2N reads + N writes
    assert [x["bytes_read"] + x["bytes_written"] for x in s] == [4 * n] * 3
    warps = (n + 31) // 32
    assert [x["sectors"] for x in s] == [4 * (warps - 1) + 3] * 3           # 4 sectors per full warp; 17 floats = 3
    assert all(sum(x["page_counts"]) == n for x in s)
    assert all(len(x["page_counts"]) == -(-4 * n // (1 << 16)) for x in s)
    pcs = {x["pc"]: x for x in out["access_pc"].to_pylist()}
    assert {p: pcs[p]["requests"] for p in pcs} == {0x10: warps, 0x20: warps, 0x30: warps}
    assert pcs[0x30]["writes"] == n and pcs[0x10]["reads"] == n


@pytest.mark.parametrize("stride", [1, 2, 4, 8, 16, 33])
def test_strided_reads_have_known_sectors_per_request(stride):
    n = 32 * 100
    req = _warp_requests(7, 0x40, READ, A, n, stride_elems=stride)
    objs = Objects(np.array([7]), np.array([A], np.uint64), np.array([4 * n * stride]))
    out = reduce_requests(req, objs)
    pcrow = out["access_pc"].to_pylist()[0]
    per_request = min(32, 4 * stride)                     # 32 lanes x 4*stride bytes apart, 32-byte sectors
    assert pcrow["sectors"] == 100 * per_request and pcrow["requests"] == 100 and pcrow["lanes"] == n


def test_copy_kernel_and_unattributed_accesses_are_never_credited_to_a_neighbour():
    n = 64 * 32
    gap = A + 4 * n + 4096                                # between A's end and B: a hole
    req = _cat(_warp_requests(3, 0x50, READ, A, n), _warp_requests(3, 0x60, WRITE, B, n),
               _warp_requests(3, 0x70, READ, gap, 32))
    objs = Objects(np.array([3, 3]), np.array([A, B], np.uint64), np.array([4 * n, 4 * n]))
    s = reduce_requests(req, objs)["access_summary"]
    nul = s.filter(pc.is_null(s["object_address"])).to_pylist()
    assert len(nul) == 1 and nul[0]["reads"] == 32        # the 32 lanes in the hole
    a = s.filter(pc.equal(s["object_address"], A)).to_pylist()[0]
    assert a["reads"] == n and a["writes"] == 0


def test_a_launch_with_no_known_objects_counts_its_accesses_unattributed():
    """No allocation seen at all (a kernel on memory allocated before capture): one row with no
    object, every lane counted (was an IndexError gathering from the empty object table)."""
    r = _warp_requests(1, 0x10, READ, A, 100)  # 4 warps, 100 lanes
    t = reduce_requests(r, Objects(np.array([], np.int64), np.array([], np.uint64), np.array([], np.int64)))
    s = t["access_summary"]
    assert s.num_rows == 1 and s["object_address"].null_count == 1
    assert s["reads"][0].as_py() == 100 and s["bytes_read"][0].as_py() == 400 and s["writes"][0].as_py() == 0
    assert s["sectors"][0].as_py() == 13  # 3 warps of 128 B (4 sectors each) and one of 16 B
    assert t["access_pc"]["lanes"][0].as_py() == 100


def test_objects_differ_per_launch():
    """An address belongs to the object live at *its* launch (allocations are reused)."""
    req = _cat(_warp_requests(1, 0x10, READ, A, 32), _warp_requests(2, 0x10, READ, A, 32))
    objs = Objects(np.array([1, 2]), np.array([A, A - 64], np.uint64), np.array([128, 64]))
    s = reduce_requests(req, objs)["access_summary"].to_pylist()
    got = {(x["correlation"], x["object_address"]): x["reads"] for x in s}
    assert got == {(1, A): 32, (2, None): 32}             # launch 2's object ends before A


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2000), st.integers(1, 2 ** 32 - 1)), min_size=1, max_size=60))
def test_matches_a_per_lane_reference(rows):
    """Random requests and objects: the vectorized reduction equals a plain per-lane loop."""
    rng = np.random.default_rng(len(rows))
    launch = np.array([r[0] for r in rows])
    base_off = np.array([r[1] for r in rows])
    active = np.array([r[2] for r in rows], np.uint32)
    addrs = (A + (base_off[:, None] * 8 + rng.integers(0, 4096, (len(rows), 32)))).astype(np.uint64)
    flags = rng.choice([READ, WRITE], len(rows))
    req = Requests(launch, np.arange(len(rows), dtype=np.uint64) % 5, flags, np.full(len(rows), 4), active, addrs)
    obase = np.array([A, A + 5000, A + 9000, A + 2000], np.uint64)
    objs = Objects(np.array([0, 0, 1, 2]), obase, np.array([4000, 3000, 8000, 100]))
    out = reduce_requests(req, objs)["access_summary"].to_pylist()
    ref: dict = {}
    for i in range(len(rows)):
        for lane in range(32):
            if not (int(active[i]) >> lane) & 1:
                continue
            a = int(addrs[i, lane])
            hit = None
            for lv, b, nb in zip(objs.launch, obase, objs.nbytes):
                if lv == launch[i] and int(b) <= a < int(b) + int(nb):
                    hit = int(b)
            k = (int(launch[i]), hit)
            r, w = ref.get(k, (0, 0))
            ref[k] = (r + (flags[i] == READ), w + (flags[i] == WRITE))
    assert {(x["correlation"], x["object_address"]): (x["reads"], x["writes"]) for x in out} == ref


def _tools_on(out):
    from pastaprof.tools.base import RunInfo
    from pastaprof.tools.coalescing import Coalescing
    from pastaprof.tools.hotness import Hotness
    from pastaprof.tools.working_set import WorkingSet

    reports = {}
    for tool in (WorkingSet(), Hotness(), Coalescing()):
        tool.begin(RunInfo({"ranks": [0]}))
        for kind in tool.consumes:
            for b in (out[kind].to_batches() if kind in out else []):
                tool.on_batch(kind, b)
        reports[tool.name] = tool.report()
    return reports


def test_tools_on_a_vector_add_and_a_strided_kernel():
    n = 32 * 1024
    big = 1 << 30                                            # a 1 GiB object live but untouched
    D = 0x7F10_0000_0000
    req = _cat(_warp_requests(1, 0x10, READ, A, n), _warp_requests(1, 0x20, READ, B, n),
               _warp_requests(1, 0x30, WRITE, C, n), _warp_requests(2, 0x40, READ, A, n // 8, stride_elems=8))
    objs = Objects(np.array([1, 1, 1, 1, 2]), np.array([A, B, C, D, A], np.uint64),
                   np.array([4 * n, 4 * n, 4 * n, big, 4 * n]))
    out = reduce_requests(req, objs, page_bytes=4096, names={1: "vector_add", 2: "strided"})
    r = _tools_on(out)
    ws = {x["launch"]: x for x in r["working_set"].tables["launches"].to_pylist()}
    assert ws[1]["accesses"] == 3 * n and ws[1]["objects"] == 3
    assert ws[1]["working_set_bytes"] == 3 * 4 * n and ws[1]["touched_bytes"] == 3 * 4 * n
    assert ws[1]["footprint_bytes"] == 3 * 4 * n + big
    assert any("vector_add: touches" in f.title for f in r["working_set"].findings)
    assert ws[2]["touched_bytes"] == 4 * n                   # stride 8 floats still touches every page of A
    hot = r["hotness"].tables["objects"].to_pylist()
    assert hot[0]["object_address"] == A and hot[0]["launches"] == 2 and hot[0]["accesses"] == n + n // 8
    pcs = {x["pc"]: x for x in r["coalescing"].tables["pcs"].to_pylist()}
    assert pcs[0x10]["sectors_per_request"] == 4 and pcs[0x10]["ideal_sectors_per_request"] == 4
    assert pcs[0x40]["sectors_per_request"] == 32           # each lane 32 B apart: one sector per lane
    msgs = [f.title for f in r["coalescing"].findings]
    assert len(msgs) == 1 and msgs[0].startswith("strided pc 0x40: 32.0 sectors per request (ideal 4)")
    # 32 sectors where 4 would do, per request of the strided read: the bytes a coalesced read saves
    (co,) = r["coalescing"].findings
    assert co.impact_bytes == 32 * (32 - 4) * (n // 8 // 32)
    (low,) = [f for f in r["working_set"].findings if "touches" in f.title]
    assert low.impact_bytes == big  # live at its launch, never touched
    for f in [f for rep in r.values() for f in rep.findings]:
        assert_finding_contract(f)


def test_heatmap_of_one_cta():
    """CTA 1 of launch 9: 4 warps read 128 contiguous floats of A (every word of 16 sectors,
    once), then all 4 warps read float 0 of each 32-byte sector of B (1 word of 8 used)."""
    from pastaprof.processor.access import heatmap
    from pastaprof.tools.base import RunInfo
    from pastaprof.tools.heatmap import Heatmap

    parts = []
    for w in range(4):
        r = _warp_requests(9, 0x10, READ, A + w * 128, 32)
        r.cta, r.warp = np.array([1]), np.array([w])
        parts.append(r)
        s = _warp_requests(9, 0x20, READ, B, 32, stride_elems=8)   # lane i -> B + 32 i: word 0 of sector i
        s.cta, s.warp = np.array([1]), np.array([w])
        parts.append(s)
    other = _warp_requests(9, 0x10, READ, A, 32)                    # another CTA: not in this heatmap
    other.cta, other.warp = np.array([2]), np.array([0])
    parts.append(other)
    req = _cat(*parts)
    req.cta = np.concatenate([p.cta for p in parts])
    req.warp = np.concatenate([p.warp for p in parts])
    h = heatmap(req, Objects(np.array([9, 9]), np.array([A, B], np.uint64), np.array([4096, 4096])), launch=9, cta=1)
    rows = {r["sector_address"]: r for r in h.to_pylist()}
    a_sec = [rows[A + 32 * i] for i in range(16)]
    assert all(r["accesses"] == 8 and r["warps"] == 1 and r["word_counts"] == [1] * 8 for r in a_sec)
    b_sec = [rows[B + 32 * i] for i in range(32)]
    assert all(r["accesses"] == 4 and r["warps"] == 4 and r["word_counts"] == [4, 0, 0, 0, 0, 0, 0, 0] for r in b_sec)
    assert len(rows) == 16 + 32
    tool = Heatmap()
    tool.begin(RunInfo({"ranks": [0]}))
    for b in h.to_batches():
        tool.on_batch("access_heatmap", b)
    rep = tool.report()
    util = {o["object_address"]: o["word_utilization"] for o in rep.tables["objects"].to_pylist()}
    assert util == {A: 1.0, B: 1 / 8}
    assert len(rep.findings) == 1 and "12% of the words" in rep.findings[0].title
    assert rep.findings[0].impact_bytes == 32 * 32 * 7 // 8  # B's 32 sectors, 7 of 8 words unused
    assert_finding_contract(rep.findings[0])


def test_default_tools_do_not_start_the_sanitizer_and_access_tools_do():
    """The sanitizer excludes CUPTI (driver 580: one subscriber), so it must start only for
    tools that need instruction-level accesses -- not for the memory tool, which merely
    reads them when another tool had them captured."""
    from pastaprof.live.session import _consumed_kinds
    from pastaprof.tools.memory import Memory

    default = _consumed_kinds([Memory()], ("kernels", "ops", "timeline", "memory"))
    assert not any(k.startswith("access_") for k in default) and "uvm" not in default
    for tool in ("working_set", "hotness", "coalescing"):
        assert any(k.startswith("access_") for k in _consumed_kinds([], (tool,))), tool
    assert "uvm" in _consumed_kinds([], ("uvm_advisor",))


def test_working_set_reports_what_the_patches_could_not_see():
    """Numbers of the H200 run (bench/access_gpu.py): a cuBLAS bf16 GEMM issues warpgroup MMAs
    whose operands arrive by TMA, so it has almost no lane accesses; the tool must say it is
    uncovered rather than report a tiny working set as complete."""
    import pyarrow as pa

    from pastaprof.events.schema import conform

    n = 32 * 1024
    req = _cat(_warp_requests(1, 0x10, READ, A, n), _warp_requests(1, 0x30, WRITE, C, n))
    out = reduce_requests(req, Objects(np.array([1, 1]), np.array([A, C], np.uint64), np.array([4 * n, 4 * n])),
                          names={1: "vector_add"})
    out["access_launch"] = conform("access_launch", pa.table({
        "start_ns": [1, 2], "end_ns": [1, 2], "rank": pa.array([0, 0], pa.int32()), "correlation": [1, 3],
        "name": ["vector_add", "gemm"], "lanes": [2 * n, 18240], "uncovered_wgmma": [0, 6291456],
        "uncovered_bulk_copies": [0, 0], "unattributed_lanes": [0, 0], "shared_lanes": [0, 0],
        "local_lanes": [0, 0], "async_copy_lanes": [0, 0], "pc_dropped": [0, 0], "page_dropped": [0, 0],
        "raw_requests": [0, 0], "raw_stored": [0, 0]}))
    ws = _tools_on(out)["working_set"]
    cov = {r["kernel"]: r for r in ws.tables["coverage"].to_pylist()}
    assert cov["gemm"]["uncovered_wgmma"] == 6291456 and cov["vector_add"]["uncovered_wgmma"] == 0
    assert cov["vector_add"]["global_lanes"] == 2 * n
    warn = [f for f in ws.findings if "uncovered" in f.title]
    assert len(warn) == 1 and warn[0].title.startswith("gemm: 6291456 warpgroup MMAs") and warn[0].severity == "warning"
    assert ws.summary["uncovered_kernels"] == 1
    for f in ws.findings:
        assert_finding_contract(f)
