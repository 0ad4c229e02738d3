"""Capture memory is bounded: past PASTAPROF_BUFFER_MB of op rows a flush writes them to disk
at once (none dropped), whatever the flush period and the machine's load; past CAP_BUFFERS
budgets, where flushes cannot run, rows are dropped and counted, and the drops are said in the
exit line and in run.json.  Real torch CPU programs under ``pastaprof run``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")

import pastaprof  # noqa: E402
from pastaprof.live.flush import CAP_BUFFERS, ROW_BYTES  # noqa: E402
from pastaprof.live.supervise import program_notes  # noqa: E402

PP = [sys.executable, "-m", "pastaprof.cli", "run"]
TINY_OPS = textwrap.dedent("""
    import sys, torch
    x = torch.ones(4)
    for _ in range(int(sys.argv[1])):
        x = x + 1
    print("done", flush=True)
""")


# The ops run on a TorchScript fork (a C++ thread, no GIL) while the main thread holds the GIL
# (a switch interval of 1000 s): no flush can run until the ops are done.
HELD_FLUSHES = textwrap.dedent("""
    import sys, torch

    @torch.jit.script
    def adds(n: int) -> int:
        x = torch.ones(4)
        for _ in range(n):
            x = x + 1
        return int(x[0])

    @torch.jit.script
    def launch(n: int) -> torch.jit.Future[int]:
        return torch.jit._fork(adds, n)

    torch.jit._wait(launch(10))  # compiled before the GIL is held
    sys.setswitchinterval(1000.0)
    fut = launch(int(sys.argv[1]))
    while not fut.done():
        pass
    sys.setswitchinterval(0.005)
    print("done", torch.jit._wait(fut), flush=True)
""")


def _run(tmp_path: Path, name: str, iterations: int, buffer_mb: int, program: str = TINY_OPS) -> dict:
    script = tmp_path / f"{name}.py"
    script.write_text(program)
    env = dict(os.environ, PASTAPROF_BUFFER_MB=str(buffer_mb), PASTAPROF_FLUSH_MS="600000")  # no periodic flush
    r = subprocess.run([*PP, "-o", str(tmp_path / name), "--", sys.executable, str(script), str(iterations)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0 and r.stdout.startswith("done"), r.stderr
    m = json.loads((tmp_path / name / "run.json").read_text())
    m["_stderr"] = r.stderr
    return m


def _adds(run: Path) -> int:
    t = pastaprof.load(run).table("op")
    return sum(1 for name in t["name"].to_pylist() if name == "aten::add")


def test_past_the_buffer_budget_rows_go_to_disk_not_dropped(tmp_path):
    m = _run(tmp_path, "run", 30_000, buffer_mb=1)
    over = m["processes"][0]["capture_overhead"]
    rows = (1 << 20) // ROW_BYTES
    cap = over["bounds"]["cap_rows"]
    assert over["bounds"]["buffer_rows"] == rows == 8192 and cap == CAP_BUFFERS * rows == 131_072
    assert _adds(tmp_path / "run") == 30_000  # every op, none dropped
    assert m["dropped_events"] == 0 and "dropped" not in m["_stderr"]
    total = m["rows"]["op"]
    # more rows than the buffer may hold, none dropped: they were written as the program ran (the
    # period is 10 minutes), and the buffer never held more than its cap (exact, kept in C)
    assert 0 < over["max_pending_rows"] <= cap < total == 5 * 30_000 + 3


def test_when_flushes_cannot_run_the_cap_drops_and_counts(tmp_path):
    """The GIL held while ops run on a C++ thread: the buffer fills to its cap and no further;
    every op past it is counted, and the count is said."""
    held = _run(tmp_path, "held", 100_000, buffer_mb=1, program=HELD_FLUSHES)
    ref = _run(tmp_path, "ref", 100_000, buffer_mb=1024, program=HELD_FLUSHES)  # a cap of 134 M rows
    cap = held["processes"][0]["capture_overhead"]["bounds"]["cap_rows"]
    assert cap == CAP_BUFFERS * 8192
    assert ref["dropped_events"] == 0 and ref["rows"]["op"] > 4 * cap
    assert held["processes"][0]["capture_overhead"]["max_pending_rows"] == cap
    dropped = held["dropped_events"]
    assert cap <= held["rows"]["op"] < 2 * cap  # the cap's rows, and the few recorded after the hold
    assert held["rows"]["op"] + dropped == ref["rows"]["op"]  # each op recorded or counted
    assert f"{dropped} events dropped" in held["_stderr"]
    assert held["processes"][0]["status"]["dropped"].startswith(f"{dropped} events dropped")


@pytest.mark.slow
def test_peak_memory_follows_the_budget_not_the_run_length(tmp_path):
    """1.2 M op rows (~150 MB in the observer's buffer): a 2 MB budget keeps the program's
    peak RSS well below a budget that never spills."""
    small = _run(tmp_path, "small", 240_000, buffer_mb=2)
    large = _run(tmp_path, "large", 240_000, buffer_mb=4096)
    assert small["rows"]["op"] == large["rows"]["op"] >= 240_000
    assert small["dropped_events"] == large["dropped_events"] == 0
    assert large["processes"][0]["capture_overhead"]["deadline_flushes"] == 0
    saved = large["program"]["max_rss_bytes"] - small["program"]["max_rss_bytes"]
    assert saved > 80 << 20, (small["program"], large["program"])


def test_drops_are_said_in_the_exit_line_and_run_json(tmp_path):
    manifest = {"processes": [{"pid": 7, "status": {"dropped": "12 events dropped: ..."},
                               "capture_overhead": {"bounds": {"deadline_ms": 2000}}}], "dropped_events": 12}
    notes = program_notes(tmp_path, manifest, -9, None)
    assert notes == "; the program was killed by SIGKILL; 12 events dropped"
    written = json.loads((tmp_path / "run.json").read_text())
    assert written["program"] == {"exit_code": -9, "signal": "SIGKILL", "unflushed_pids": [], "running_pids": [],
                                  "lost_at_most_ms": 0}
    assert written["dropped_events"] == 12
