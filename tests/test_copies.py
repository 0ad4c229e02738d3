"""The copies tool on real traces, checked against independent tallies of the trace JSON
(orjson + plain Python), plus one built run for what no recorded trace has (blocking
cudaMemcpy, unnamed live copies, no pinned copy to compare with)."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pytest
from conftest import interval_ns as ival
from conftest import raw_events as load

import pastaprof
from pastaprof.events.schema import conform
from pastaprof.tools.copies import PAGEABLE_MIN_BYTES, REFERENCE_PINNED_GBPS, Copies

DATA = Path(__file__).parent / "data"
TWO = DATA / "two_streams_copies.pt.trace.json.gz"
NAME_RE = re.compile(r"^Memcpy (\w+) \((\w+) -> (\w+)\)$")


def report(path: Path):
    (rep,) = pastaprof.analyze(path, tools=["copies"])
    return rep


def copies_of(ev: list[dict]) -> list[dict]:
    out = []
    for e in ev:
        if e.get("cat") != "gpu_memcpy":
            continue
        direction, src, dst = NAME_RE.match(e["name"]).groups()
        host = dst if direction == "DtoH" else src if direction == "HtoD" else "Device"
        s, t = ival(e)
        out.append({"direction": direction, "memory": host.lower(), "bytes": e["args"]["bytes"], "start": s, "end": t,
                    "stream": e["args"]["stream"], "device": e["args"]["device"]})
    return out


def busy_overlap(kernels: list[tuple[int, int]], s: int, t: int) -> int:
    """Time in [s, t) covered by at least one kernel: walk the merged kernel intervals."""
    covered, cur = 0, None
    for a, b in sorted(kernels):
        if cur and a <= cur[1]:
            cur[1] = max(cur[1], b)
            continue
        if cur:
            covered += max(0, min(cur[1], t) - max(cur[0], s))
        cur = [a, b]
    if cur:
        covered += max(0, min(cur[1], t) - max(cur[0], s))
    return covered


def test_two_streams_bandwidth_per_kind_and_pageable_finding():
    ev = load(TWO)
    rep = report(TWO)
    cps = copies_of(ev)
    kinds = {(r["direction"], r["memory"]): r for r in rep.tables["kinds"].to_pylist()}
    want: dict[tuple, list[dict]] = {}
    for c in cps:
        want.setdefault((c["direction"], c["memory"]), []).append(c)
    assert set(kinds) == set(want) == {("DtoH", "pageable"), ("HtoD", "pinned")}
    for k, cs in want.items():
        nbytes, d = sum(c["bytes"] for c in cs), sum(c["end"] - c["start"] for c in cs)
        assert (kinds[k]["copies"], kinds[k]["bytes"], kinds[k]["total_ns"]) == (len(cs), nbytes, d)
        assert kinds[k]["gbps"] == pytest.approx(nbytes / d, rel=1e-12)
    page = want[("DtoH", "pageable")]
    pinned = want[("HtoD", "pinned")]
    pinned_gbps = sum(c["bytes"] for c in pinned) / sum(c["end"] - c["start"] for c in pinned)
    page_bytes, page_ns = sum(c["bytes"] for c in page), sum(c["end"] - c["start"] for c in page)
    assert 1.2 < page_bytes / page_ns < 1.4  # the 1.3 GB/s pageable DtoH copy
    (f,) = [f for f in rep.findings if f.evidence["cause"] == "pageable"]
    assert f.severity == "warning" and f.location == "record.py(39): <module>"
    assert abs(f.evidence["impact_ns"] - (page_ns - page_bytes / pinned_gbps)) <= 1
    assert f.evidence["pinned_gbps"] == round(pinned_gbps, 3)
    assert "pinned HtoD measured in this trace" in f.evidence["pinned_reference"]
    assert kinds[("DtoH", "pageable")]["synchronous"] == 4 and kinds[("HtoD", "pinned")]["synchronous"] == 0


def test_two_streams_exposed_copies_and_compute_streams():
    ev = load(TWO)
    rep = report(TWO)
    cps = copies_of(ev)
    kern = [(ival(e), e["args"]["stream"], e["name"]) for e in ev if e.get("cat") == "kernel"]
    compute_streams = {st for _, st, n in kern if not re.match(r"^nccl.*Kernel|^Memcpy|^Memset|^dma|.*Sync", n)}
    want: dict[tuple, list[int]] = {}
    for c in cps:
        exposed = (c["end"] - c["start"]) - busy_overlap([iv for iv, _, _ in kern], c["start"], c["end"])
        want.setdefault((c["stream"], c["direction"]), []).append(exposed)
    got = {(r["stream"], r["direction"]): r for r in rep.tables["overlap"].to_pylist()}
    assert set(got) == set(want)
    for k, ex in want.items():
        assert got[k]["exposed_ns"] == sum(ex) and got[k]["copies"] == len(ex)
        assert got[k]["compute_stream"] == (k[0] in compute_streams)
    # the pinned HtoD copies share stream 30 with the elementwise kernels: one finding for them,
    # none for the pageable ones (the pageable finding covers those)
    exposed = [f for f in rep.findings if f.evidence["cause"].startswith("exposed")]
    assert [f.evidence["cause"] for f in exposed] == ["exposed on compute stream"]
    assert exposed[0].evidence["impact_ns"] == sum(want[(30, "HtoD")]) and exposed[0].evidence["streams"] == [30]


def test_ddp_small_pageable_copies_are_synchronous_but_not_flagged():
    rep = report(DATA / "ddp_mlp_2ranks")
    files = sorted((DATA / "ddp_mlp_2ranks").glob("*.json.gz"))
    cps = [c for p in files for c in copies_of(load(p))]
    small_pageable = [c for c in cps if c["memory"] == "pageable"]
    assert small_pageable and max(c["bytes"] for c in small_pageable) < PAGEABLE_MIN_BYTES
    sync = rep.tables["synchronous"].to_pylist()
    assert sum(r["copies"] for r in sync) == len(small_pageable) == 8
    assert {r["reason"] for r in sync} == {"pageable"} and all(r["ranks"] == [0, 1] for r in sync)
    assert not [f for f in rep.findings if f.evidence["cause"] == "pageable"]
    kinds = {(r["direction"], r["memory"]): r for r in rep.tables["kinds"].to_pylist()}
    dtod = [c for c in cps if c["direction"] == "DtoD"]
    assert kinds[("DtoD", "device")]["bytes"] == sum(c["bytes"] for c in dtod)
    assert rep.summary["copies"] == len(cps) == 38
    assert rep.summary["pinned_reference_gbps"] == REFERENCE_PINNED_GBPS  # no pinned copy in this trace


def _batch(kind: str, **cols) -> pa.RecordBatch:
    n = len(cols["start_ns"])
    cols.setdefault("rank", pa.array([0] * n, pa.int32()))
    cols.setdefault("device", pa.array([0] * n, pa.int32()))
    return conform(kind, pa.table(cols)).to_batches()[0]


def test_built_run_blocking_unnamed_and_stated_reference():
    """Copies as a live CUPTI capture gives them (no name, so memory unknown), one launched by a
    blocking cudaMemcpy, one waited for by its op, and a big pageable HtoD with no pinned copy
    to compare with: the stated reference bandwidth is used and named."""
    mib = 1 << 20
    tool = Copies()
    tool.on_batch("memcpy", _batch(
        "memcpy", start_ns=[0, 1_000_000, 2_000_000, 10_000_000], end_ns=[100_000, 1_100_000, 2_050_000, 30_000_000],
        stream=[7, 7, 7, 7], correlation=[1, 2, 3, 4], bytes=[4 * mib, 4 * mib, 1024, 100 * mib],
        direction=["HtoD", "DtoH", "DtoH", "HtoD"], op_id=pa.array([None, None, 0, None], pa.int64()),
        name=pa.array([None, None, None, "Memcpy HtoD (Pageable -> Device)"], pa.string())))
    tool.on_batch("api", _batch(
        "api", start_ns=[0, 990_000, 1_990_000, 2_060_000, 9_000_000], end_ns=[5, 1_100_000, 2_000_000, 2_070_000, 30_000_000],
        correlation=[1, 2, 3, 99, 4], op_id=pa.array([None, None, 0, 0, None], pa.int64()),
        name=["cudaMemcpyAsync", "cudaMemcpy", "cudaMemcpyAsync", "cudaStreamSynchronize", "cudaMemcpyAsync"]))
    tool.on_batch("op", _batch("op", start_ns=[1_980_000], end_ns=[2_080_000], id=[0], name=["aten::copy_"],
                               call_site=["eval.py(3): main"], depth=pa.array([0], pa.int32())))
    rep = tool.report()
    kinds = {(r["direction"], r["memory"]): r["copies"] for r in rep.tables["kinds"].to_pylist()}
    assert kinds == {("HtoD", "unknown"): 1, ("DtoH", "unknown"): 2, ("HtoD", "pageable"): 1}
    reasons = sorted((r["reason"], r["call_site"]) for r in rep.tables["synchronous"].to_pylist())
    assert reasons == [("blocking memcpy", None), ("pageable", None), ("synchronized", "eval.py(3): main")]
    (page,) = [f for f in rep.findings if f.evidence["cause"] == "pageable"]
    assert page.evidence["pinned_gbps"] == REFERENCE_PINNED_GBPS
    assert "stated reference" in page.evidence["pinned_reference"]
    assert abs(page.evidence["impact_ns"] - (20_000_000 - 100 * mib / REFERENCE_PINNED_GBPS)) <= 1
    # no kernel at all: every non-pageable copy is exposed, all on one finding per site/kind
    assert rep.summary["exposed_ns"] == 100_000 + 100_000 + 50_000 + 20_000_000


def test_no_copies_is_a_note():
    rep = report(Path(pastaprof.__file__).parent / "data" / "example_gpt2_train_3steps.pt.trace.json.gz")
    assert rep.summary == {"note": "no GPU copies in this run"} and not rep.tables


def test_zero_duration_and_huge_copies_do_not_break_the_tool():
    """Sanitizer runs record copies as instants (end == start); a pageable instant must not be
    divided by, and an exposure of nothing is 0."""
    tool = Copies()
    tool.on_batch("memcpy", _batch(
        "memcpy", start_ns=[5, 100], end_ns=[5, 50], stream=[7, 7], correlation=[1, 2], bytes=[64 << 20, 1 << 40],
        direction=["DtoH", "HtoD"], name=["Memcpy DtoH (Device -> Pageable)", "Memcpy HtoD (Pinned -> Device)"]))
    rep = tool.report()
    kinds = {(r["direction"], r["memory"]): r for r in rep.tables["kinds"].to_pylist()}
    assert kinds[("DtoH", "pageable")]["gbps"] is None and kinds[("DtoH", "pageable")]["total_ns"] == 0
    assert kinds[("HtoD", "pinned")]["total_ns"] == 0  # end before start occupies nothing
    assert rep.summary["exposed_ns"] == 0 and rep.findings == []
