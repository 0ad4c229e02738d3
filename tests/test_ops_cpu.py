"""The ops tool's self CPU time, launch-to-start delay and per-site / per-module CPU time on real
traces, checked against plain-Python tallies of the raw Kineto JSON (stacks per thread, dicts by
correlation and external id): nothing of the tool's NumPy or SQL is reused."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest
from conftest import interval_ns as ival
from conftest import raw_events as load

import pastaprof

DATA = Path(__file__).parent / "data"
EXAMPLE = Path(pastaprof.__file__).parent / "data" / "example_gpt2_train_3steps.pt.trace.json.gz"
TRACES = [EXAMPLE, DATA / "mlp_train_3steps.pt.trace.json.gz", DATA / "bert4_infer_2iters.pt.trace.json.gz",
          DATA / "two_streams_copies.pt.trace.json.gz"]


def self_cpu_by_name(ev: list[dict]) -> dict[str, int]:
    """dur minus the durations of the directly nested cpu_ops of the same thread (a stack)."""
    by_thread: dict = defaultdict(list)
    for e in ev:
        if e.get("cat") == "cpu_op" and e.get("ph") == "X":
            s, t = ival(e)
            by_thread[(e["pid"], e["tid"])].append((s, -t, e["name"]))
    out: dict[str, int] = defaultdict(int)
    for items in by_thread.values():
        stack: list[list] = []  # [end, name, self]
        for s, neg_t, name in [*sorted(items), (None, None, None)]:
            while stack and (s is None or stack[-1][0] <= s):
                _, done, self_ns = stack.pop()
                out[done] += max(self_ns, 0)
            if s is None:
                break
            t = -neg_t
            if stack:
                stack[-1][2] -= t - s
            stack.append([t, name, t - s])
    return dict(out)


def launch_delays_by_op(ev: list[dict]) -> dict[str, list[int]]:
    """Kernel start minus its runtime call's start, per name of the cpu_op whose External id the call carries."""
    ops = {e["args"]["External id"]: e["name"] for e in ev
           if e.get("cat") == "cpu_op" and "External id" in e.get("args", {})}
    calls = {e["args"]["correlation"]: e for e in ev
             if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    out: dict[str, list[int]] = defaultdict(list)
    for e in ev:
        if e.get("cat") != "kernel" or e.get("ph") != "X":
            continue
        call = calls.get(e.get("args", {}).get("correlation"))
        if call is None or call.get("args", {}).get("External id") not in ops:
            continue
        out[ops[call["args"]["External id"]]].append(ival(e)[0] - ival(call)[0])
    return dict(out)


@pytest.fixture(scope="module", params=TRACES, ids=lambda p: p.name.split(".")[0])
def traced(request):
    (rep,) = pastaprof.analyze(request.param, tools=["ops"])
    return load(request.param), rep


def test_self_cpu_per_op_name_matches_a_stack_walk(traced):
    ev, rep = traced
    want = self_cpu_by_name(ev)
    got = {r["name"]: r["self_cpu_ns"] for r in rep.tables["ops"].to_pylist()}
    assert got == want
    # self times partition the ops' time: their sum is the union of top-level ops per thread
    rows = rep.tables["ops"].to_pylist()
    assert all(r["self_cpu_ns"] <= r["cpu_ns"] for r in rows)
    per_op = rep.details["per op"]
    top = sum(c for c, d in zip(per_op["cpu_ns"].to_pylist(), per_op["depth"].to_pylist()) if d == 0)
    assert sum(want.values()) == sum(r["self_cpu_ns"] for r in rows) == top


def test_launch_delay_per_op_matches_correlation_join(traced):
    ev, rep = traced
    want = launch_delays_by_op(ev)
    rows = {r["name"]: r for r in rep.tables["ops"].to_pylist()}
    assert want, "the trace has kernels launched by ops"
    checked = 0
    for name, delays in want.items():
        r = rows[name]
        assert r["max_launch_delay_ns"] == max(delays)
        assert r["launch_delay_ns"] == pytest.approx(sum(delays) / len(delays), abs=0.5)
        checked += 1
    assert checked >= 3
    # ops that launched no kernel have no delay
    assert all(r["launch_delay_ns"] is None for n, r in rows.items() if n not in want and not r["kernels"])


def test_cpu_per_call_site_and_module_sum_self_times(traced):
    ev, rep = traced
    per_op = rep.details["per op"].to_pylist()
    by_site: dict = defaultdict(int)
    by_module: dict = defaultdict(int)
    for r in per_op:
        if r["call_site"] is not None:
            by_site[r["call_site"]] += r["self_cpu_ns"]
        by_module[r["module"] or "(no module)"] += r["self_cpu_ns"]
    for r in rep.tables["call sites"].to_pylist():
        assert r["self_cpu_ns"] == by_site[r["call_site"]]
    assert {r["module"]: r["self_cpu_ns"] for r in rep.tables["modules"].to_pylist()} == dict(by_module)
    # and the modules' CPU time is the ops' self time, all of it, once
    assert sum(by_module.values()) == sum(self_cpu_by_name(ev).values())
    # a module's inclusive time: its ops not nested in an op of the same module (it counted
    # depth-0 ops only, so backward ops on the autograd thread made self exceed inclusive)
    for r in rep.tables["modules"].to_pylist():
        assert r["self_cpu_ns"] <= r["cpu_ns"], r


def test_example_launch_delays_show_queueing_behind_the_lm_head():
    """On the bundled GPT-2 trace the mm kernels queue (ms of delay) while addmm's start ~20 us after launch."""
    (rep,) = pastaprof.analyze(EXAMPLE, tools=["ops"])
    rows = {r["name"]: r for r in rep.tables["ops"].to_pylist()}
    assert rows["aten::mm"]["launch_delay_ns"] > 1_000_000
    assert rows["aten::addmm"]["launch_delay_ns"] < 100_000


def test_a_modules_inclusive_time_covers_its_self_time_with_backward_ops(tmp_path):
    """Live training: backward ops run on the autograd engine's thread (not at depth 0 of the
    module's forward); the modules table counted depth-0 ops only, so a Linear showed 0.35 s of
    CPU time and 1.10 s of self time."""
    torch = pytest.importorskip("torch")
    del torch
    import subprocess
    import sys
    import textwrap

    prog = tmp_path / "train.py"
    prog.write_text(textwrap.dedent("""
        import torch
        net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        for _ in range(20):
            opt.zero_grad()
            net(torch.randn(32, 64)).sum().backward()
            opt.step()
    """))
    r = subprocess.run([sys.executable, "-m", "pastaprof.cli", "run", "-o", str(tmp_path / "run"), "--",
                        sys.executable, str(prog)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    (rep,) = pastaprof.analyze(tmp_path / "run", tools=["ops"])
    rows = {r["module"]: r for r in rep.tables["modules"].to_pylist()}
    assert {"Sequential_0/Linear_0", "Sequential_0/Linear_1", "Sequential_0/ReLU_0"} <= set(rows)
    for r in rows.values():
        assert 0 < r["self_cpu_ns"] <= r["cpu_ns"], r
