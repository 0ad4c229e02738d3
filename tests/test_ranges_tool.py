"""The ranges tool on real traces: counts, times, percentiles and the GPU time launched inside each
range family, against plain-Python tallies of the raw Kineto JSON."""

from __future__ import annotations

import math
import re
from collections import defaultdict
from pathlib import Path

import pyarrow as pa
import pytest
from conftest import interval_ns as ival
from conftest import raw_events as load

import pastaprof
from pastaprof.tools.ranges import Ranges, family

DATA = Path(__file__).parent / "data"
EXAMPLE = Path(pastaprof.__file__).parent / "data" / "example_gpt2_train_3steps.pt.trace.json.gz"
WITH_RANGES = [EXAMPLE, DATA / "mlp_train_3steps.pt.trace.json.gz",
               DATA / "recorded" / "cuda_graphs_mlp_4replays.pt.trace.json.gz",
               DATA / "recorded" / "compile_mlp_train_2steps.pt.trace.json.gz"]
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def tally(ev: list[dict]) -> dict[str, dict]:
    calls = {e["args"]["correlation"]: e for e in ev
             if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    launched = []
    for e in ev:
        if e.get("cat") in GPU_CATS and e.get("ph") == "X":
            c = calls.get(e.get("args", {}).get("correlation"))
            if c is not None:
                s, t = ival(e)
                launched.append(((c["pid"], c["tid"]), ival(c)[0], t - s))
    out: dict[str, dict] = defaultdict(lambda: {"d": [], "gpu": 0, "n": 0})
    for e in ev:
        if e.get("cat") != "user_annotation" or e.get("ph") != "X":
            continue
        s, t = ival(e)
        name = re.sub(r"(?<=[#_ \-.:A-Za-z])\d+$", "N", e["name"])
        f = out[name]
        f["d"].append(t - s)
        for thread, at, d in launched:
            if thread == (e["pid"], e["tid"]) and s <= at < t:
                f["gpu"] += d
                f["n"] += 1
    return dict(out)


@pytest.mark.parametrize("path", WITH_RANGES, ids=lambda p: p.name.split(".")[0])
def test_range_families_match_raw_tally(path):
    (rep,) = pastaprof.analyze(path, tools=[Ranges()])
    want = tally(load(path))
    rows = {r["range"]: r for r in rep.tables["ranges"].to_pylist()}
    assert set(rows) == set(want)
    for name, w in want.items():
        r, d = rows[name], sorted(w["d"])
        assert (r["count"], r["total_ns"], r["max_ns"]) == (len(d), sum(d), max(d))
        assert r["p99_ns"] == d[max(0, math.ceil(0.99 * len(d)) - 1)]  # nearest rank
        assert (r["gpu_ns"], r["gpu_activities"]) == (w["gpu"], w["n"])
        assert r["domain"] == "user"
    assert rep.summary["gpu_activities"] == sum(w["n"] for w in want.values())


def test_example_optimizer_step_launches_its_kernels():
    (rep,) = pastaprof.analyze(EXAMPLE, tools=[Ranges()])
    rows = {r["range"]: r for r in rep.tables["ranges"].to_pylist()}
    opt = rows["Optimizer.step#AdamW.step"]
    assert opt["count"] == 3 and opt["gpu_activities"] > 0 and 0 < opt["gpu_share"] < 1
    assert rows["Optimizer.zero_grad#AdamW.zero_grad"]["gpu_ns"] == 0  # set_to_none: no kernels


def test_no_ranges_says_why_in_one_line():
    (rep,) = pastaprof.analyze(DATA / "bert4_infer_2iters.pt.trace.json.gz", tools=[Ranges()])
    assert rep.tables == {} and rep.findings == []
    assert "no host ranges" in rep.summary["note"] and "\n" not in rep.summary["note"]


def test_family_names():
    assert family("step12") == "stepN" and family("ProfilerStep#3") == "ProfilerStep#N"
    assert family("replay_0") == "replay_N" and family("Optimizer.step#AdamW.step") == "Optimizer.step#AdamW.step"
    assert family("42") == "42" and family("") == ""


def _ranges_table(durations: list[int], name: str = "load_batch") -> pa.Table:
    """NVTX-like ranges back to back on one thread, 1 us apart."""
    starts = [sum(durations[:i]) + 1000 * i for i in range(len(durations))]
    n = len(durations)
    return pa.table({"start_ns": pa.array(starts, pa.int64()),
                     "end_ns": pa.array([s + d for s, d in zip(starts, durations)], pa.int64()),
                     "rank": pa.array([0] * n, pa.int32()), "pid": pa.array([1] * n, pa.int64()),
                     "tid": pa.array([1] * n, pa.int64()), "name": pa.array([f"{name}{i}" for i in range(n)]),
                     "domain": pa.array(["nvtx"] * n)})


def test_a_varying_family_is_one_finding_with_its_excess():
    from pastaprof.events.schema import conform

    durs = [1_000_000] * 9 + [21_000_000]  # one instance 20 ms over the median of 1 ms
    tool = Ranges()
    tool.on_batch("range", conform("range", _ranges_table(durs)).to_batches()[0])
    rep = tool.report()
    (f,) = rep.findings
    assert f.impact_ns == 20_000_000 and f.location == "range load_batchN"
    assert rep.tables["ranges"]["domain"].to_pylist() == ["nvtx"]
    # the same family without the slow instance: nothing to say
    tool = Ranges()
    tool.on_batch("range", conform("range", _ranges_table(durs[:-1])).to_batches()[0])
    assert tool.report().findings == []


def test_a_range_ending_before_it_starts_holds_nothing():
    from pastaprof.events.schema import conform

    t = _ranges_table([1_000_000, 1_000_000])
    t = t.set_column(1, "end_ns", pa.array([t["start_ns"][0].as_py() - 5, t["end_ns"][1].as_py()], pa.int64()))
    tool = Ranges()
    tool.on_batch("range", conform("range", t).to_batches()[0])
    api = conform("api", pa.table({"start_ns": pa.array([t["start_ns"][0].as_py() - 2], pa.int64()),
                                   "end_ns": pa.array([t["start_ns"][0].as_py()], pa.int64()),
                                   "rank": pa.array([0], pa.int32()), "pid": pa.array([1], pa.int64()),
                                   "tid": pa.array([1], pa.int64()), "correlation": pa.array([9], pa.int64()),
                                   "name": pa.array(["cudaLaunchKernel"])}))
    k = conform("kernel", pa.table({"start_ns": pa.array([10**6], pa.int64()), "end_ns": pa.array([2 * 10**6], pa.int64()),
                                    "rank": pa.array([0], pa.int32()), "correlation": pa.array([9], pa.int64()),
                                    "name": pa.array(["k"])}))
    tool.on_batch("api", api.to_batches()[0])
    tool.on_batch("kernel", k.to_batches()[0])
    (row,) = tool.report().tables["ranges"].to_pylist()
    assert row["gpu_ns"] == 0 and row["gpu_activities"] == 0 and row["total_ns"] == 1_000_000


LIVE_RANGES = """
import json, sys, time
import pastaprof
with pastaprof.range("warmup"):  # the first range starts the capture session: not timed
    pass
took = {"load": [], "train": []}
for i in range(4):
    for name, sleep in (("load", 0.004), ("train", 0.012)):
        t0 = time.perf_counter_ns()
        with pastaprof.range(f"{name}{i}"):
            time.sleep(sleep)
        took[name].append(time.perf_counter_ns() - t0)
json.dump(took, open(sys.argv[1], "w"))
"""


def test_live_pastaprof_ranges_against_the_programs_own_clock(tmp_path):
    """pastaprof.range in a live run: one family per name stem, its count, and total and max no
    longer than the program's own clock measured around each ``with`` block, and no shorter than its sleep."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("PASTAPROF_")}
    prog, took = tmp_path / "prog.py", tmp_path / "took.json"
    prog.write_text(LIVE_RANGES)
    r = subprocess.run([sys.executable, "-m", "pastaprof.cli", "run", "-o", str(tmp_path / "run"), "--",
                        sys.executable, str(prog), str(took)], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    outer = json.loads(took.read_text())
    (rep,) = pastaprof.analyze(tmp_path / "run", tools=["ranges"])
    rows = {row["range"]: row for row in rep.tables["ranges"].to_pylist()}
    assert set(rows) == {"loadN", "trainN", "warmup"} and rows["warmup"]["count"] == 1
    for name, row, sleep in (("load", rows["loadN"], 4_000_000), ("train", rows["trainN"], 12_000_000)):
        assert row["count"] == 4 and row["gpu_ns"] == 0
        # each range holds its sleep (at least that long) and lies inside the program's measurement
        assert 4 * sleep <= row["total_ns"] <= sum(outer[name])
        assert sleep <= row["max_ns"] <= max(outer[name]) and row["mean_ns"] == pytest.approx(row["total_ns"] / 4)
