"""Every registered tool's findings on the real traces (Kineto, nsys, rocpd, memory snapshots) and
the bundled example carry what issue F section 3 asks of a finding (conftest.assert_finding_contract:
an int time at stake, a location, one sentence of suggestion), are ordered by their time at stake;
and three back-to-back copies of the example find the same as the example."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TRACES, assert_finding_contract

import pastaprof
from pastaprof.tools.base import SEVERITY_RANK, ordered_findings
from pastaprof.tools.registry import DEFAULT_TOOLS, available

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"
EXAMPLE = pastaprof.example_path()
SOURCES = [EXAMPLE, *TRACES, DATA / "ddp_mlp_2ranks", *sorted((DATA / "recorded").glob("*.pt.trace.json.gz")),
           DATA / "nsys" / "mfu_2gpu_before.sqlite", DATA / "rocpd" / "single_3.0.3.db",
           DATA / "snapshots" / "oom.pickle", DATA / "snapshots" / "leak.pickle"]


@pytest.fixture(scope="module")
def every_finding() -> dict[str, list]:
    tools = list(available())
    return {src.name: ordered_findings(pastaprof.analyze(src, tools=tools)) for src in SOURCES}


def test_every_finding_of_every_tool_has_its_impact_location_and_suggestion(every_finding):
    for findings in every_finding.values():
        for f in findings:
            assert_finding_contract(f)
    kinds = {(f.tool, f.kind or "") for fs in every_finding.values() for f in fs}
    # the hotspots and the memory findings measured in bytes are among those checked
    assert {("kernels", "dominant kernel"), ("kernels", "many small kernels")} <= kinds
    tools = {t for t, _ in kinds}
    assert {"ops", "memory", "timeline", "steps", "gemm", "copies", "cuda_api", "ranks", "sequences"} <= tools
    memory = [f for fs in every_finding.values() for f in fs if f.tool == "memory"]
    assert {"leak", "never freed", "oom"} <= {_memory_kind(f) for f in memory}
    for f in memory:  # the bytes at stake are the finding's own measured bytes
        want = {"leak": "total_growth_bytes", "never freed": "bytes", "oom": "allocated_bytes",
                "fragmentation": "bytes_saveable", "pattern": "peak_bytes_saved"}.get(_memory_kind(f))
        assert f.impact_ns == 0 and (want is None or f.impact_bytes == f.evidence[want] >= 0), f.title


def _memory_kind(f) -> str:
    ev = f.evidence
    return ("leak" if "total_growth_bytes" in ev else "oom" if "allocated_bytes" in ev
            else "fragmentation" if "bytes_saveable" in ev else "pattern" if "peak_bytes_saved" in ev
            else "never freed" if "top_site_blocks" in ev else "other")


def test_findings_ordered_by_time_at_stake_hotspots_last(every_finding):
    for name, findings in every_finding.items():
        keys = [(-f.impact_ns, SEVERITY_RANK[f.severity], -(f.impact_bytes or 0)) for f in findings]
        assert keys == sorted(keys), name
        zero = [i for i, f in enumerate(findings) if f.impact_ns == 0]
        assert zero == list(range(len(findings) - len(zero), len(findings))), name  # all after the timed ones
        hot = [f for f in findings if f.kind in ("dominant kernel", "many small kernels")]
        assert all(f.impact_ns == 0 and f.evidence["at_stake"] for f in hot), name


@pytest.fixture(scope="module")
def example_x3(tmp_path_factory) -> Path:
    big = tmp_path_factory.mktemp("x3") / "example_x3.pt.trace.json"
    subprocess.run([sys.executable, str(REPO / "bench" / "make_big_trace.py"), "--copies", "3", "-o", str(big)],
                   check=True, capture_output=True, timeout=300)
    return big


@pytest.mark.parametrize("tools", [list(DEFAULT_TOOLS), ["ranges", "sequences", "critical_path"]],
                         ids=["default", "ranges+sequences+critical_path"])
def test_three_copies_of_the_example_find_the_same(example_x3, tools):
    """Thresholds are relative: the same ids, in the same order; the sequences' kernels and shares alike."""
    one, three = pastaprof.analyze(EXAMPLE, tools=tools), pastaprof.analyze(example_x3, tools=tools)
    a, b = ordered_findings(one), ordered_findings(three)
    assert a and [f.id for f in a] == [f.id for f in b]
    for fa, fb in zip(a, b):
        assert fa.location == fb.location and fa.severity == fb.severity, fa.title
        if fa.impact_ns:  # three copies: about three times the time at stake
            assert fb.impact_ns == pytest.approx(3 * fa.impact_ns, rel=0.1), fa.title
    seq1, seq3 = (next(r for r in reps if r.tool == "sequences") for reps in (one, three)) if "sequences" in tools \
        else (None, None)
    if seq1 is not None:
        rows1, rows3 = seq1.tables["sequences"].to_pylist(), seq3.tables["sequences"].to_pylist()
        assert [r["kernels"] for r in rows1] == [r["kernels"] for r in rows3]
        for r1, r3 in zip(rows1, rows3):
            assert r3["count"] == 3 * r1["count"] and r3["share"] == pytest.approx(r1["share"], abs=0.01)
        assert seq1.findings and [f.evidence["kernels"] for f in seq1.findings] == \
            [f.evidence["kernels"] for f in seq3.findings]
