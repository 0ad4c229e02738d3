"""The kernels tool's findings against tallies of the raw Kineto JSON: a hotspot is a share of
all GPU activity time (copies and memsets count), many small kernels a share of the launches;
both relative, so copies of a run find the same; and every finding of the default tools on the
real traces says where and what to do."""

from __future__ import annotations

import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TRACES, dur_ns, raw_events

import pastaprof
from pastaprof.tools.kernels import DOMINANT_SHARE, TINY_KERNEL_NS, TINY_SHARE

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "src" / "pastaprof" / "data" / "example_gpt2_train_3steps.pt.trace.json.gz"
PATHS = [EXAMPLE, *TRACES, *sorted((REPO / "tests" / "data" / "ddp_mlp_2ranks").glob("*.gz"))]


def tallies(path: Path) -> tuple[dict[str, list[int]], int]:
    """Kernel durations per name, and all GPU activity time (kernels, copies, memsets)."""
    ev = raw_events(path)
    per: dict[str, list[int]] = {}
    for e in ev:
        if e.get("cat") == "kernel" and e.get("ph") == "X":
            per.setdefault(e["name"], []).append(dur_ns(e))
    copies = sum(dur_ns(e) for e in ev if e.get("cat") in ("gpu_memcpy", "gpu_memset") and e.get("ph") == "X")
    return per, sum(map(sum, per.values())) + copies


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.name.split(".")[0])
def test_findings_match_the_raw_tallies(path):
    per, gpu = tallies(path)
    (rep,) = pastaprof.analyze(path, tools=["kernels"])
    top5 = sorted(per, key=lambda n: -sum(per[n]))[:5]
    want = {n: round(sum(per[n]) / gpu, 4) for n in top5 if sum(per[n]) / gpu >= DOMINANT_SHARE}
    got = {f.location: f.evidence["share"] for f in rep.findings if f.kind == "dominant kernel"}
    assert got == want
    launches = sum(map(len, per.values()))
    tiny = {n: len(v) for n, v in per.items() if statistics.median_low(v) < TINY_KERNEL_NS}
    small = [f for f in rep.findings if f.kind == "many small kernels"]
    if sum(tiny.values()) / launches >= TINY_SHARE:
        (f,) = small
        assert f.evidence["launches"] == sum(tiny.values())
        assert f.evidence["share_of_launches"] == round(sum(tiny.values()) / launches, 4)
        assert tiny[f.location] == max(tiny.values())
    else:
        assert small == []
    assert all(f.impact_ns == 0 and f.evidence["at_stake"] and f.suggestion for f in rep.findings)  # hotspots


def test_copies_dominate_so_no_kernel_is_a_hotspot():
    """two_streams_copies: its sgemm is 90% of kernel time but copies are most of the GPU's time."""
    path = REPO / "tests" / "data" / "two_streams_copies.pt.trace.json.gz"
    per, gpu = tallies(path)
    kernel_ns = sum(map(sum, per.values()))
    assert max(sum(v) for v in per.values()) / kernel_ns > 0.85 and kernel_ns / gpu < 0.1
    (rep,) = pastaprof.analyze(path, tools=["kernels"])
    assert [f for f in rep.findings if f.kind == "dominant kernel"] == []


def test_three_copies_of_a_run_find_the_same(tmp_path):
    src = REPO / "tests" / "data" / "bert4_infer_2iters.pt.trace.json.gz"
    big = tmp_path / "x3.pt.trace.json"
    subprocess.run([sys.executable, str(REPO / "bench" / "make_big_trace.py"), "--copies", "3", "--source", str(src),
                    "-o", str(big)], check=True, capture_output=True, timeout=300)
    (one,), (three,) = pastaprof.analyze(src, tools=["kernels"]), pastaprof.analyze(big, tools=["kernels"])
    assert len(one.findings) == 2 and [f.id for f in one.findings] == [f.id for f in three.findings]
    for a, b in zip(one.findings, three.findings):
        key = "share" if a.kind == "dominant kernel" else "share_of_launches"
        assert a.evidence[key] == pytest.approx(b.evidence[key], abs=0.01)


@pytest.mark.parametrize("path", [EXAMPLE, *TRACES, REPO / "tests" / "data" / "ddp_mlp_2ranks"],
                         ids=lambda p: p.name.split(".")[0])
def test_every_default_finding_says_where_and_what_to_do(path):
    reports = pastaprof.analyze(path)
    findings = [f for r in reports for f in r.findings]
    assert findings
    for f in findings:
        assert f.location and f.suggestion and f.to_dict()["suggestion"] == f.suggestion, (f.tool, f.title)
        assert "consider" not in f.location  # a place, not advice
