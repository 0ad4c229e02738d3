"""Capture gated at the source: outside the selected steps and ranges the op observer is
out of PyTorch's RecordFunction and the module-call wrapper only calls through, so narrowed
capture costs (nearly) nothing there, not only records nothing.  Real PyTorch on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import pastaprof

APP = textwrap.dedent("""
    import sys, torch, pastaprof
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x = torch.randn(4, 8)
    for i in range(6):
        with pastaprof.range(f"s{i}"):
            with pastaprof.range("fwd" if i in (1, 4) else "other"):
                loss = net(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        print(f"step {i} loss {loss.item():.6f}")
""")


def _run(tmp_path: Path, name: str, *flags: str, **env: str) -> tuple[subprocess.CompletedProcess, Path]:
    app = tmp_path / "app.py"
    app.write_text(APP)
    out = tmp_path / name
    r = subprocess.run([sys.executable, "-m", "pastaprof.cli", "run", "-o", str(out), *flags, "--",
                        sys.executable, str(app)], capture_output=True, text=True,
                       env=dict(os.environ, PASTAPROF_FLUSH_MS="200", **env))
    assert r.returncode == 0, r.stderr
    return r, out


def _ops_in(run: pastaprof.Run, windows: list[tuple[int, int]]) -> int:
    """Ops of an ungated run that started inside these time windows."""
    start = np.asarray(run.table("op")["start_ns"].to_numpy())
    return int(sum(((start >= lo) & (start <= hi)).sum() for lo, hi in windows))


def _ranges(run: pastaprof.Run, name: str) -> list[dict]:
    return sorted((r for r in run.table("range").to_pylist() if r["name"] == name), key=lambda r: r["start_ns"])


@pytest.fixture(scope="module")
def ungated(tmp_path_factory):
    pytest.importorskip("torch")
    return _run(tmp_path_factory.mktemp("ungated"), "run")


def _process(out: Path) -> dict:
    """The run's manifest entry of its one process."""
    return json.loads((out / "run.json").read_text())["processes"][0]


def _torch_handler(out: Path) -> dict:
    handler = _process(out)["handlers"]["torch"]
    if handler["mechanism"] != "native":  # no compiler: the Python fallback is gated in the store only
        pytest.skip("the native op observer did not build here")
    return handler


def test_step_window_observes_only_its_steps(tmp_path, ungated):
    bare_out, all_run = ungated
    r, out = _run(tmp_path, "steps", "--steps", "2:4")
    losses = [line for line in r.stdout.splitlines() if line.startswith("step")]
    assert len(losses) == 6 and losses == [line for line in bare_out.stdout.splitlines() if line.startswith("step")]
    _torch_handler(out)
    run, full = pastaprof.load(out), pastaprof.load(all_run)
    # optimizer steps count (a post-hook of optimizer.step, inside its record_function range):
    # step 2 begins as the second optimizer.step ends, step 4 as the fourth does
    opt = _ranges(full, "Optimizer.step#SGD.step")
    assert len(opt) == 6
    expected = _ops_in(full, [(opt[1]["end_ns"], opt[3]["end_ns"])])
    assert expected > 0 and run.table("op").num_rows == expected
    # recorded outside the window, dropped by the store: step 0 only (the observer learns the
    # program's signatures in it), then the gate at the source closes until step 2
    assert _process(out)["filtered_by_kind"]["op"] == _ops_in(full, [(0, opt[0]["end_ns"])]) > 0
    assert _torch_handler(out)["gate_changes"] == 3  # closed at step 1, open at step 2, closed at 4
    modules = run.table("op")["module"].drop_null().to_pylist()
    assert modules and all(m.startswith("Sequential_0") for m in modules)


def test_store_only_gating_keeps_the_same_ops(tmp_path):
    """PASTAPROF_OFF=gate: the observer records throughout and the store alone gates -- the A/B
    that the gate at the source loses nothing inside a window (scripts/gpu_live_check.py runs it
    for CUPTI's kernels on the GPU).  Same program, same window: the same ops, by name and
    shape, and everything outside the window filtered by the store instead."""
    pytest.importorskip("torch")
    _, gated = _run(tmp_path, "gated", "--steps", "2:4")
    _, store = _run(tmp_path, "store", "--steps", "2:4", PASTAPROF_OFF="gate")
    assert _torch_handler(store)["gate_changes"] == 0 and _torch_handler(gated)["gate_changes"] == 3

    def ops(out: Path) -> list[tuple[str, str]]:
        t = pastaprof.load(out).table("op")
        return sorted(zip(t["name"].to_pylist(), t["input_shapes"].to_pylist()))

    assert ops(gated) == ops(store) and len(ops(gated)) > 0
    filtered = {name: _process(out)["filtered_by_kind"]["op"] for name, out in (("gated", gated), ("store", store))}
    assert filtered["store"] > filtered["gated"] > 0  # steps 0, 1, 4, 5 against step 0 only


def test_ranges_observe_only_inside_them(tmp_path, ungated):
    _, all_run = ungated
    r, out = _run(tmp_path, "ranges", "--ranges", "fwd")
    _torch_handler(out)
    run, full = pastaprof.load(out), pastaprof.load(all_run)
    expected = _ops_in(full, [(r["start_ns"], r["end_ns"]) for r in _ranges(full, "fwd")])
    assert expected > 0 and run.table("op").num_rows == expected
    opt = _ranges(full, "Optimizer.step#SGD.step")
    filtered = _process(out)["filtered_by_kind"]["op"]
    assert filtered == _ops_in(full, [(0, opt[0]["end_ns"])]) > 0  # step 0 only, as above
    assert _torch_handler(out)["gate_changes"] == 5  # closed after step 0; open and closed twice
    # the forward's ops carry their module paths (the wrapper is back inside the range)
    modules = set(run.table("op")["module"].drop_null().to_pylist())
    assert {"Sequential_0/Linear_0", "Sequential_0/ReLU_0", "Sequential_0/Linear_1"} <= modules


def test_ranges_on_two_threads_lose_no_op_inside_them(tmp_path):
    """Ranges opening and closing on two threads at once switch the observer from both: every
    op inside a selected range is still recorded (each thread's ops have their own input size)."""
    pytest.importorskip("torch")
    app = tmp_path / "threads.py"
    app.write_text(textwrap.dedent("""
        import threading, torch, pastaprof
        def work(size, n):
            x, y = torch.zeros(size), torch.zeros(size + 100)
            for i in range(n):
                with pastaprof.range("sel"):
                    x.add_(1)
                y.add_(1)  # outside this thread's range (inside the other's, at times)
        threads = [threading.Thread(target=work, args=(s, 300)) for s in (3, 5)]
        [t.start() for t in threads]
        [t.join() for t in threads]
    """))
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "pastaprof.cli", "run", "-o", str(out), "--ranges", "sel", "--",
                        sys.executable, str(app)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    handler = _torch_handler(out)
    ops = pastaprof.load(out).table("op")
    adds = [s for n, s in zip(ops["name"].to_pylist(), ops["input_shapes"].to_pylist()) if n == "aten::add_"]
    assert adds.count("[[3],[],[]]") == 300 and adds.count("[[5],[],[]]") == 300
    assert handler["gate_changes"] > 2  # the observer was switched while the threads ran
