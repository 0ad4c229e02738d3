"""The steps tool on real traces, every number checked against an independent tally of the trace JSON.

The tallies below parse the Kineto JSON with orjson and walk the events in plain Python
(loops, stacks, sorted lists): nothing of the tool's vectorized code or SQL is reused.
"""

from __future__ import annotations

import math
import statistics
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from conftest import interval_ns as ival
from conftest import raw_events as load

import pastaprof
from pastaprof.events.schema import schema
from pastaprof.tools.steps import Steps

DATA = Path(__file__).parent / "data"
EXAMPLE = Path(pastaprof.__file__).parent / "data" / "example_gpt2_train_3steps.pt.trace.json.gz"
REPO = Path(__file__).resolve().parents[1]
HOST_CATS = {"cpu_op", "user_annotation", "cuda_runtime", "cuda_driver"}
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
DELAY = 30_000


def steps_of(path: Path) -> list[dict]:
    (rep,) = pastaprof.analyze(path, tools=["steps"])
    return rep, rep.tables["steps"].to_pylist()


def host_windows_optimizer(ev: list[dict]) -> list[tuple[int, int]]:
    ends = sorted(ival(e)[1] for e in ev if e.get("cat") == "user_annotation"
                  and e["name"].startswith("Optimizer.step#"))
    lo = min(ival(e)[0] for e in ev if e.get("cat") in HOST_CATS and e.get("ph") == "X")
    return [(min(lo, ends[0]), ends[0])] + list(zip(ends[:-1], ends[1:]))


def launches(ev: list[dict]) -> dict[int, int]:
    return {e["args"]["correlation"]: ival(e)[0] for e in ev
            if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}


def gpu_intervals(ev: list[dict]) -> list[tuple[int, int, int | None]]:
    """(start, end, launch start or None) of every GPU activity."""
    calls = launches(ev)
    out = []
    for e in ev:
        if e.get("cat") in GPU_CATS and e.get("ph") == "X":
            s, t = ival(e)
            out.append((s, t, calls.get(e.get("args", {}).get("correlation"))))
    return out


def union_in(intervals: list[tuple[int, int]], lo: int, hi: int) -> int:
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted((max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return total + (cur_e - cur_s if cur_e is not None else 0)


def idle_split(acts: list[tuple[int, int, int | None]], windows: list[tuple[int, int]]) -> list[dict[str, int]]:
    """The idle rule, one gap at a time: [prev end, next start] classified by the next activity."""
    gaps = []
    prev = windows[0][0]
    for s, e, launch in sorted(acts, key=lambda a: a[0]):
        if s > prev:
            g = s - prev
            cls = "host_wait" if launch is not None and launch > prev else "kernel_wait" if g < DELAY else "other_idle"
            gaps.append((prev, s, cls))
        prev = max(prev, e)
    if windows[-1][1] > prev:
        gaps.append((prev, windows[-1][1], "host_wait"))
    out = []
    for lo, hi in windows:
        d = {"host_wait": 0, "kernel_wait": 0, "other_idle": 0}
        for a, b, cls in gaps:
            d[cls] += max(0, min(b, hi) - max(a, lo))
        out.append(d)
    return out


@pytest.fixture(scope="module")
def example():
    return load(EXAMPLE), *steps_of(EXAMPLE)


def test_example_has_three_optimizer_steps_with_tallied_walls(example):
    ev, rep, rows = example
    windows = host_windows_optimizer(ev)
    assert rep.summary["rule"] == "optimizer steps"
    assert len(rows) == 3 == len(windows)
    assert [r["wall_ns"] for r in rows] == [hi - lo for lo, hi in windows]
    assert [r["label"] for r in rows] == ["step 0", "step 1", "step 2"]
    # work after the last optimizer step: the rank's last host or GPU end minus the last step end
    last = max(max(ival(e)[1] for e in ev if e.get("cat") in HOST_CATS and e.get("ph") == "X"),
               max(t for _, t, _ in gpu_intervals(ev)))
    assert rep.summary["after_last_step_ns"] == last - windows[-1][1]


def test_example_gpu_split_matches_independent_sweep(example):
    ev, _, rows = example
    windows = host_windows_optimizer(ev)
    base = rows[0]["start_ns"] - windows[0][0]  # the tool's clock adds baseTimeNanoseconds
    acts = gpu_intervals(ev)
    idle = idle_split(acts, windows)
    for r, (lo, hi), want in zip(rows, windows, idle):
        assert r["start_ns"] - base == lo
        busy = union_in([(s, e) for s, e, _ in acts], lo, hi)
        assert r["gpu_busy_ns"] == busy
        assert r["gpu_idle_ns"] == (hi - lo) - busy
        assert {k: r[f"{k}_ns"] for k in want} == want
        assert r["host_wait_ns"] + r["kernel_wait_ns"] + r["other_idle_ns"] == r["gpu_idle_ns"]
        assert (r["compute_ns"] + r["communication_ns"] + r["memory_ns"] + r["other_gpu_ns"]) == r["gpu_busy_ns"]
        # memsets are the only MEMORY activities of the example: exposed memory = memset union minus compute
        kern = [ival(e) for e in ev if e.get("cat") == "kernel" and e.get("ph") == "X"]
        assert r["compute_ns"] == union_in(kern, lo, hi)
        assert r["memory_ns"] == busy - union_in(kern, lo, hi)


def test_example_per_step_launch_counts(example):
    ev, _, rows = example
    windows = host_windows_optimizer(ev)
    calls = launches(ev)
    for cat, col in (("kernel", "kernels"), ("gpu_memset", "memsets")):
        launched = [calls.get(e["args"]["correlation"], ival(e)[0]) for e in ev
                    if e.get("cat") == cat and e.get("ph") == "X"]
        want = [sum(lo <= t < hi for t in launched) for lo, hi in windows]
        assert [r[col] for r in rows] == want
    assert [r["kernels"] for r in rows] == [1153, 1153, 1153]
    assert {r["top_op"] for r in rows} == {"aten::mm"}
    cpu_ops = [ival(e)[0] for e in ev if e.get("cat") == "cpu_op" and e.get("ph") == "X"]
    assert [r["cpu_ops"] for r in rows] == [sum(lo <= t < hi for t in cpu_ops) for lo, hi in windows]


def test_step_ranges_rule_and_warmup_outlier():
    path = DATA / "mlp_train_3steps.pt.trace.json.gz"
    ev = load(path)
    rep, rows = steps_of(path)
    ranges = sorted(ival(e) for e in ev if e.get("cat") == "user_annotation" and e["name"] in
                    ("step0", "step1", "step2"))
    assert rep.summary["rule"] == "step ranges"
    walls = [b - a for a, b in ranges]
    assert [r["wall_ns"] for r in rows] == walls
    med = statistics.median(walls)
    assert [r["outlier"] for r in rows] == [w > 1.25 * med for w in walls] == [True, False, False]
    (f,) = rep.findings
    assert f.evidence["impact_ns"] == walls[0] - med
    assert f.evidence["steps"] == ["step0"]
    assert "host wait" in f.title and f.evidence["suggestion"]
    # the first step: its excess is one-time work, said so (not a cost every step pays)
    assert f.evidence["first_step"] is True and "step0 of rank 0, the first, took" in f.title
    assert f.title.endswith(": one-time work") and f.evidence["suggestion"].startswith("The first step does one-time")
    # the excess is split over the components exactly
    total = sum(v for k, v in f.evidence.items() if k.startswith("excess_"))
    meds = {c: statistics.median(r[f"{c}_ns"] for r in rows) for c in
            ("host_wait", "kernel_wait", "other_idle", "compute", "communication", "memory", "other_gpu")}
    assert total == pytest.approx(walls[0] - sum(meds.values()), abs=8)


def top_level_ops(ev: list[dict]) -> list[tuple[int, int, str]]:
    """Depth-0 cpu_ops of the thread with the most of them, by start, via a stack per thread."""
    by_tid: dict = {}
    for e in ev:
        if e.get("cat") == "cpu_op" and e.get("ph") == "X":
            s, t = ival(e)
            by_tid.setdefault((e["pid"], e["tid"]), []).append((s, -t, e["name"]))
    tops = {}
    for key, items in by_tid.items():
        stack, top = [], []
        for s, neg_t, name in sorted(items):
            while stack and stack[-1] <= s:
                stack.pop()
            if not stack:
                top.append((s, -neg_t, name))
            stack.append(-neg_t)
        tops[key] = top
    return max(tops.values(), key=len)


@pytest.mark.parametrize("name, count", [("bert4_infer_2iters.pt.trace.json.gz", 2),
                                         ("two_streams_copies.pt.trace.json.gz", 4),
                                         ("leak_5steps.pt.trace.json.gz", 5)])
def test_repeated_ops_rule_finds_inference_iterations(name, count):
    path = DATA / name
    ev = load(path)
    rep, rows = steps_of(path)
    top = top_level_ops(ev)
    n = len(top)
    period = next(p for p in range(1, n // 2 + 1) if n % p == 0 and
                  all(top[i][2] == top[i + p][2] for i in range(n - p)))
    starts = [top[i][0] for i in range(0, n, period)]
    last_ops_end = max(t for _, t, _ in top[-period:])
    tail = [t for _, t, launch in gpu_intervals(ev) if launch is not None and launch >= starts[-1]]
    ends = starts[1:] + [max([last_ops_end, *tail])]
    assert rep.summary["rule"] == "repeated ops"
    assert len(rows) == count == len(starts)
    assert [r["wall_ns"] for r in rows] == [b - a for a, b in zip(starts, ends)]
    calls = launches(ev)
    kern = [calls.get(e["args"].get("correlation"), ival(e)[0]) for e in ev if e.get("cat") == "kernel"]
    assert [r["kernels"] for r in rows] == [sum(a <= t < b for t in kern) for a, b in zip(starts, ends)]


def test_ddp_steps_per_rank():
    rep, rows = steps_of(DATA / "ddp_mlp_2ranks")
    assert rep.summary["rule"] == "optimizer steps" and rep.summary["steps"] == 6
    for rank in (0, 1):
        ev = load(DATA / "ddp_mlp_2ranks" / f"rank-{rank}.pt.trace.json.gz")
        windows = host_windows_optimizer(ev)
        mine = [r for r in rows if r["rank"] == rank]
        assert [r["wall_ns"] for r in mine] == [b - a for a, b in windows]
        base = mine[0]["start_ns"] - windows[0][0]
        acts = gpu_intervals(ev)
        for r, (lo, hi) in zip(mine, windows):
            assert r["end_ns"] - base == hi
            assert r["gpu_busy_ns"] == union_in([(s, e) for s, e, _ in acts], lo, hi)
        # NCCL kernels are COMMUNICATION: exposed = union(compute + comm) - union(compute)
        kern = [(ival(e), e["name"]) for e in ev if e.get("cat") == "kernel"]
        comp = [iv for iv, n in kern if not n.startswith("nccl")]
        for r, (lo, hi) in zip(mine, windows):
            assert r["communication_ns"] == union_in([iv for iv, _ in kern], lo, hi) - union_in(comp, lo, hi)
            assert r["communication_ns"] > 0
    assert {p["rank"]: p["steps"] for p in rep.summary["per_rank"]} == {0: 3, 1: 3}


def test_every_real_trace_has_steps_or_a_note():
    paths = [EXAMPLE, DATA / "ddp_mlp_2ranks", *sorted(DATA.glob("*.json.gz")), *sorted((DATA / "foreign").glob("*.json"))]
    for path in paths:
        rep, rows = steps_of(path)
        assert rows or rep.summary.get("note"), path
        for r in rows:
            assert r["wall_ns"] >= 0
            if r["gpu_busy_ns"] is not None:
                assert r["host_wait_ns"] + r["kernel_wait_ns"] + r["other_idle_ns"] == r["gpu_idle_ns"], path
                assert r["gpu_idle_ns"] >= 0 and r["gpu_busy_ns"] <= r["wall_ns"]
        for f in rep.findings:
            assert f.evidence["impact_ns"] > 0 and f.location and f.evidence["suggestion"]


PROFILE_SCRIPT = r"""
import sys, torch
from torch.profiler import ProfilerActivity, profile, schedule
x = torch.randn(48, 48)
with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=0, active=4)) as p:
    for i in range(4):
        for _ in range(12 if i == 2 else 2):
            x = torch.tanh(x @ x)
        p.step()
p.export_chrome_trace(sys.argv[1])
"""


def test_profiler_step_rule_on_a_real_cpu_profile(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "cpu.pt.trace.json"
    subprocess.run([sys.executable, "-c", PROFILE_SCRIPT, str(out)], check=True, capture_output=True, timeout=300)
    ev = load(out)
    marks = sorted((ival(e), e["name"]) for e in ev if e.get("name", "").startswith("ProfilerStep#"))
    rep, rows = steps_of(out)
    assert rep.summary["rule"] == "ProfilerStep"
    assert [r["label"] for r in rows] == [n for _, n in marks]
    assert [r["wall_ns"] for r in rows] == [b - a for (a, b), _ in marks]
    # a CPU-only profile: GPU columns are null, not zeros that look like an idle GPU
    assert all(r["gpu_busy_ns"] is None and r["host_wait_ns"] is None for r in rows)
    walls = [b - a for (a, b), _ in marks]
    med = statistics.median(walls)
    slow = [r["label"] for r in rows if r["outlier"]]
    assert slow == [n for (a, b), n in marks if b - a > 1.25 * med]
    for f in rep.findings:
        assert "no GPU activity" in f.title
        # the first step, when slow, is a finding of its own (one-time work); the others share one
        assert f.evidence["first_step"] == (f.evidence["steps"] == [marks[0][1]])
    assert sum(f.evidence["impact_ns"] for f in rep.findings) == sum(w - med for w in walls if w > 1.25 * med)
    assert len(rep.findings) == (walls[0] > 1.25 * med) + any(w > 1.25 * med for w in walls[1:])


def test_no_host_events_and_no_repetition_give_a_note():
    tool = Steps()
    rep = tool.report()
    assert rep.summary["steps"] == 0 and "no host events" in rep.summary["note"]
    tool = Steps()
    op = schema("op").empty_table()
    one = pa.table({"start_ns": [10, 20, 40], "end_ns": [15, 30, 50], "rank": pa.array([0, 0, 0], pa.int32()),
                    "pid": [1, 1, 1], "tid": [1, 1, 1], "name": ["a", "b", "c"], "id": [0, 1, 2],
                    "depth": pa.array([0, 0, 0], pa.int32())})
    from pastaprof.events.schema import conform
    tool.on_batch("op", conform("op", one).to_batches()[0])
    rep = tool.report()
    assert rep.summary["steps"] == 0 and "do not repeat" in rep.summary["note"]
    assert not rep.tables and op.num_rows == 0


def test_same_findings_for_one_and_many_copies_of_a_program(tmp_path):
    """Thresholds are relative: three back-to-back copies of a run find the same causes at the
    same places, with every copy's warm-up iteration named."""
    src = DATA / "two_streams_copies.pt.trace.json.gz"
    big = tmp_path / "x3.pt.trace.json"
    subprocess.run([sys.executable, str(REPO / "bench" / "make_big_trace.py"), "--copies", "3", "--source", str(src),
                    "-o", str(big)], check=True, capture_output=True, timeout=300)
    one = pastaprof.analyze(src, tools=["steps", "cuda_api", "copies"])
    three = pastaprof.analyze(big, tools=["steps", "cuda_api", "copies"])
    def key(f):
        return f.severity, f.location, f.evidence["cause"], f.evidence["suggestion"]

    for a, b in zip(one[1:], three[1:]):
        assert a.findings and [key(f) for f in a.findings] == [key(f) for f in b.findings], a.tool
        for fa, fb in zip(a.findings, b.findings):
            assert math.isclose(fa.evidence["share_of_span"], fb.evidence["share_of_span"], rel_tol=0.05)
    steps1, steps3 = one[0], three[0]
    assert steps3.summary["steps"] == 3 * steps1.summary["steps"]
    # the run's first step is one-time work, a finding of its own in both; the later copies'
    # warm-ups recur inside the run: the same cause at the same place, a second finding
    (f1,), (f3, later) = steps1.findings, steps3.findings
    assert key(f1) == key(f3) and f1.evidence["first_step"] and f3.evidence["first_step"]
    assert f1.evidence["steps"] == f3.evidence["steps"] == ["iteration 0"]
    assert later.evidence["steps"] == ["iteration 4", "iteration 8"] and not later.evidence["first_step"]
    assert (later.location, later.evidence["cause"]) == (f1.location, f1.evidence["cause"])


def _batch(kind: str, **cols) -> pa.RecordBatch:
    from pastaprof.events.schema import conform

    n = len(cols["start_ns"])
    cols.setdefault("rank", pa.array([0] * n, pa.int32()))
    cols.setdefault("pid", [1] * n)
    cols.setdefault("tid", [1] * n)
    return conform(kind, pa.table(cols)).to_batches()[0]


def test_overlapping_step_ranges_ranks_without_steps_and_gpu_only_ranks():
    """Step ranges that overlap are clipped into disjoint windows (no time counted twice); a rank
    with ops that do not repeat, and a rank with GPU work but no host events, have no steps and
    are named in the summary."""
    tool = Steps()
    tool.on_batch("range", _batch("range", start_ns=[0, 80, 200], end_ns=[100, 150, 260],
                                  name=["step0", "step1", "step2"], domain=["user", "user", None]))
    tool.on_batch("op", _batch("op", start_ns=[0, 10, 30], end_ns=[5, 20, 40], id=[0, 1, 2], name=["a", "b", "c"],
                               depth=pa.array([0, 0, 0], pa.int32()), rank=pa.array([1, 1, 1], pa.int32())))
    tool.on_batch("kernel", _batch("kernel", start_ns=[90, 500], end_ns=[120, 600], device=pa.array([0, 0], pa.int32()),
                                   stream=[7, 7], correlation=[1, 2], name=["k", "k"],
                                   rank=pa.array([0, 2], pa.int32())))
    rep = tool.report()
    rows = rep.tables["steps"].to_pylist()
    assert [(r["rank"], r["start_ns"], r["end_ns"]) for r in rows] == [(0, 0, 100), (0, 100, 150), (0, 200, 260)]
    assert [r["gpu_busy_ns"] for r in rows] == [10, 20, 0]  # the kernel [90, 120) split at the boundary
    assert [r["kernels"] for r in rows] == [1, 0, 0]  # counted once, where it started (no launch call known)
    assert rep.summary["ranks_without_steps"] == [1, 2]
    assert {p["rank"]: p["rule"] for p in rep.summary["per_rank"]} == {0: "step ranges", 1: "none", 2: "none"}


LIVE_STEPS_APP = """
import time, torch, pastaprof
x = torch.randn(64, 64)
marks = []
for i in range(5):
    for _ in range(i + 1):          # step i runs i + 1 matmuls
        x = torch.tanh(x @ x)
    with torch.profiler.record_function(f"train_step_{i}"):
        time.sleep(0.01)
    marks.append(time.time_ns())
    pastaprof.step()
print(" ".join(map(str, marks)))
"""


def test_live_pastaprof_step_calls_become_steps(tmp_path):
    """``pastaprof.step()`` ends the step the previous call began: 5 calls, 4 steps, each from
    one call to the next; the rule comes before the program's own step-like ranges."""
    pytest.importorskip("torch")
    app = tmp_path / "app.py"
    app.write_text(LIVE_STEPS_APP)
    r = subprocess.run([sys.executable, "-m", "pastaprof.cli", "run", "-o", str(tmp_path / "run"), "-t", "steps", "--",
                        sys.executable, str(app)], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    marks = [int(m) for m in r.stdout.split("\n")[0].split()]
    run = pastaprof.load(tmp_path / "run")
    (rep,) = pastaprof.analyze(run, tools=["steps"])
    assert rep.summary["rule"] == "pastaprof.step()"
    rows = rep.tables["steps"].to_pylist()
    assert len(rows) == 4
    for k, row in enumerate(rows):  # each step spans two consecutive calls (each mark is taken just before one)
        assert abs(row["wall_ns"] - (marks[k + 1] - marks[k])) < 5_000_000
    mm = run.sql("select count(*) from op where name = 'aten::mm'").fetchall()[0][0]
    assert mm == 15
    # the program's own step-like ranges (domain record_function) are read too, but the
    # pastaprof.step() rule comes first
    phases = run.sql("select count(*) from range where name like 'train_step_%'").fetchall()[0][0]
    assert phases == 5


def test_host_ranges_keep_every_host_domain_and_drop_gpu_projections():
    from pastaprof.tools._ranges import host_ranges

    domains = ["user", "record_function", "nvtx", "gpu_user", None, "gpu_user"]
    t = pa.table({"name": [f"step{i}" for i in range(6)],
                  "domain": pa.array(domains, pa.string()).dictionary_encode()})
    kept = host_ranges(t)
    assert kept["name"].to_pylist() == ["step0", "step1", "step2", "step4"]
