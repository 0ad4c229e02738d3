"""The critical_path tool: a planted step whose critical path and what-ifs are worked out by hand
below, and on real traces the model's reproduction of the measured step, the path summing to the
step and what-if savings bounded by the time removed."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

import pastaprof
from pastaprof.events.schema import conform
from pastaprof.tools.critical_path import BETWEEN, CriticalPath

DATA = Path(__file__).parent / "data"
EXAMPLE = Path(pastaprof.__file__).parent / "data" / "example_gpt2_train_3steps.pt.trace.json.gz"
T0 = 1_796_000_000_000_000_000
REAL = [EXAMPLE, DATA / "gpt2_small2l_train_3steps.pt.trace.json.gz", DATA / "mlp_train_3steps.pt.trace.json.gz",
        DATA / "bert4_infer_2iters.pt.trace.json.gz", DATA / "two_streams_copies.pt.trace.json.gz",
        DATA / "leak_5steps.pt.trace.json.gz"]


def _t(kind: str, rows: list[dict]) -> pa.Table:
    cols = {k: [r.get(k) for r in rows] for k in {k for r in rows for k in r}}
    for k in ("start_ns", "end_ns"):
        cols[k] = [T0 + v for v in cols[k]]
    cols.setdefault("rank", [0] * len(rows))
    cols.setdefault("pid", [1] * len(rows))
    cols.setdefault("tid", [1] * len(rows))
    return conform(kind, pa.table(cols))


def planted() -> CriticalPath:
    """Op a launches a 10 ms kernel and the host synchronizes on it; op b then works 4.9 ms and
    launches a tiny kernel; the step (ProfilerStep#1) is 16 ms."""
    tool = CriticalPath()
    tables = {
        "range": _t("range", [{"start_ns": 0, "end_ns": 16_000_000, "name": "ProfilerStep#1", "domain": "user"}]),
        "op": _t("op", [{"start_ns": 0, "end_ns": 1_000_000, "name": "aten::a", "id": 0, "depth": 0,
                         "call_site": "train.py(3): step"},
                        {"start_ns": 10_200_000, "end_ns": 15_200_000, "name": "aten::b", "id": 1, "depth": 0,
                         "call_site": "train.py(9): step"}]),
        "api": _t("api", [{"start_ns": 100_000, "end_ns": 110_000, "name": "cudaLaunchKernel", "correlation": 1,
                           "op_id": 0},
                          {"start_ns": 1_000_000, "end_ns": 10_125_000, "name": "cudaDeviceSynchronize",
                           "correlation": 2},
                          {"start_ns": 15_100_000, "end_ns": 15_110_000, "name": "cudaLaunchKernel", "correlation": 3,
                           "op_id": 1}]),
        "kernel": _t("kernel", [{"start_ns": 120_000, "end_ns": 10_120_000, "name": "big_kernel", "correlation": 1,
                                 "stream": 7, "device": 0, "op_id": 0},
                                {"start_ns": 15_130_000, "end_ns": 15_140_000, "name": "tiny_kernel",
                                 "correlation": 3, "stream": 7, "device": 0, "op_id": 1}]),
    }
    for kind, t in tables.items():
        for b in t.to_batches():
            tool.on_batch(kind, b)
    return tool


def test_planted_step_path_and_what_ifs_by_hand():
    rep = planted().report()
    assert rep.summary["model_ns"] == rep.summary["measured_ns"] == 16_000_000
    path = {(r["kind"], r["name"]): r["on_path_ns"] for r in rep.tables["critical path"].to_pylist()}
    assert path == {("gpu", "big_kernel"): 10_000_000,
                    ("cpu", "aten::b"): 4_900_000 + 10_000,           # its host work and its launch call
                    ("cpu", "host after the last call"): 890_000,
                    ("cpu", "aten::a"): 100_000,                       # before it launched the kernel
                    ("cpu", BETWEEN): 75_000,                          # sync returned .. b began
                    ("launch", "launch latency"): 20_000,
                    ("sync", "cudaDeviceSynchronize"): 5_000}          # its own cost after the kernel
    assert sum(path.values()) == rep.summary["model_ns"]
    what = {r["name"]: (r["removed_ns"], r["saved_ns"]) for r in rep.tables["what if"].to_pylist()}
    # no big kernel: the sync returns 5 us after it starts (1 ms), the rest shifts 9.12 ms earlier
    assert what["big_kernel"] == (10_000_000, 10_125_000 - 1_005_000)
    # no host work in a: the kernel starts 100 us earlier and so does everything after the sync
    assert what["aten::a"] == (1_000_000, 100_000)  # all of a: its host time and its launch call
    # no host work in b: the step ends 4.91 ms earlier (the tiny kernel is never last)
    assert what["aten::b"] == (4_910_000, 4_910_000)
    (f,) = rep.findings  # the largest saving: the kernel; 6 ms of the 16 ms path are the host's
    assert f.location == "big_kernel" and f.evidence["saved_per_step_ns"] == 9_120_000
    assert f.impact_ns == 9_120_000  # one step
    assert "bound by the GPU" in f.title and rep.summary["cpu_share"] == round(5_975_000 / 16_000_000, 4)
    # the op's what-if names its call site
    sites = {r["name"]: r["call_site"] for r in rep.tables["what if"].to_pylist()}
    assert sites["aten::b"] == "train.py(9): step"


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name.split(".")[0])
def test_real_steps_are_reproduced_and_the_path_adds_up(path):
    (rep,) = pastaprof.analyze(path, tools=["critical_path"])
    s = rep.summary
    assert abs(s["model_error"]) < 0.01, s
    cp = rep.tables["critical path"].to_pylist()
    assert sum(r["on_path_ns"] for r in cp) == s["model_ns"]
    for r in rep.tables["what if"].to_pylist():
        assert 0 <= r["saved_ns"] <= r["removed_ns"] + 1, r
    (steps,) = pastaprof.analyze(path, tools=["steps"])
    walls = sorted(steps.tables["steps"]["wall_ns"].to_pylist())
    assert s["steps"] == len(walls)
    # the median step (lower middle) is the one followed
    row = next(r for r in steps.tables["steps"].to_pylist() if r["label"] == s["step"])
    assert row["wall_ns"] == walls[(len(walls) - 1) // 2]


def test_example_is_host_bound_and_zeroing_every_kernel_leaves_the_host_chain():
    (rep,) = pastaprof.analyze(EXAMPLE, tools=["critical_path"])
    assert rep.summary["cpu_share"] > 0.9
    (f,) = rep.findings
    assert "bound by the host" in f.title and f.impact_ns == f.evidence["saved_per_step_ns"] * 3


def test_no_steps_says_why():
    rep = CriticalPath().report()
    assert "no steps" in rep.summary["note"] and not rep.tables


def test_option_picks_another_step():
    path = DATA / "mlp_train_3steps.pt.trace.json.gz"
    (rep,) = pastaprof.analyze(path, tools=[CriticalPath(step=0)])
    assert rep.summary["step"] == "step0" and abs(rep.summary["model_error"]) < 0.01
