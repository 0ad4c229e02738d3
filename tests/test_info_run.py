"""`pastaprof info` on runs that `pastaprof run` recorded: the program, how it ended, its
processes, what the capture could not do and what it lost (report/run_info.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pastaprof.report.run_info import run_lines

APP = textwrap.dedent("""
    import os, signal, sys, time
    import pastaprof
    for i in range(3):
        with pastaprof.range(f"step{i}"):
            pass
        pastaprof.step()
    if sys.argv[1] == "exit3":
        sys.exit(3)
    time.sleep(1.5)  # > one flush period: the ranges above are on disk
    os.kill(os.getpid(), signal.SIGKILL)
""")


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pastaprof.cli", *args], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "160", "PASTAPROF_FLUSH_MS": "200", **(env or {})})


def _recorded(tmp_path: Path, mode: str) -> tuple[Path, subprocess.CompletedProcess]:
    app = tmp_path / "app\x1b[2J.py"  # a name with an escape sequence: info must not pass it to the terminal
    app.write_text(APP)
    run = tmp_path / "run"
    return run, _cli("run", "-o", str(run), "--", sys.executable, str(app), mode)


def test_info_says_how_the_program_ended_and_its_processes(tmp_path):
    run, r = _recorded(tmp_path, "exit3")
    assert r.returncode == 3, r.stderr
    m = json.loads((run / "run.json").read_text())
    pid = m["processes"][0]["pid"]
    out = _cli("info", str(run))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    program = next(line for line in lines if "program:" in line)
    assert program.rstrip().endswith(f"->  exit 3 after {m['capture_overhead']['wall_seconds']:.2f} s")
    assert "app\\x1b[2J.py" in program and "\x1b[2J" not in out.stdout
    assert "  processes: 1 on rank 0" in lines
    # the statuses that are not "ok", as run.json has them (this machine's GPU status, or none)
    not_ok = {k: v for k, v in m["status"].items() if v != "ok"}
    for k, v in not_ok.items():
        assert f"  {k}: {v}" in lines
    assert not any("dropped" in line or "without a final flush" in line or "still running" in line for line in lines)
    assert all(f"pid {pid}" in line for line in lines if "pid" in line)


def test_info_names_the_signal_and_the_process_that_lost_its_last_flush(tmp_path):
    run, r = _recorded(tmp_path, "kill")
    assert r.returncode == -9 or r.returncode == 137, (r.returncode, r.stderr)
    m = json.loads((run / "run.json").read_text())
    pid, lost = m["processes"][0]["pid"], m["program"]["lost_at_most_ms"]
    out = _cli("info", str(run))
    assert out.returncode == 0, out.stderr
    assert "->  killed by SIGKILL" in out.stdout
    assert f"ended without a final flush: pid {pid}: events of the last {lost:,} ms or less lost" in out.stdout


def test_run_lines_take_any_manifest_without_raising():
    """run.json is a file anyone may have edited: wrong types give fewer lines, never an error."""
    assert run_lines({"format": "pytorch-kineto"}) == [] and run_lines([]) == []  # type: ignore[arg-type]
    hostile = {"format": "pastaprof-live", "command": [1, None], "exit_code": "x", "program": {"signal": 7,
               "exit_code": True, "unflushed_pids": "12", "running_pids": None, "lost_at_most_ms": float("nan")},
               "capture_overhead": {"wall_seconds": float("nan")}, "processes": [5, {"rank": "0", "handlers": 3},
                                                                               {"rank": 2, "handlers": {"torch": []}}],
               "status": ["ok"], "dropped_events": -0.5}
    assert run_lines(hostile) == ["program: (command not recorded)  ->  exit status unknown",
                                  "processes: 2 on rank 2"]
    dropped = run_lines({"format": "pastaprof-live", "dropped_events": 1200, "command": ["a b", "c"],
                         "program": {"exit_code": 0, "unflushed_pids": [7, 8], "running_pids": [8],
                                     "lost_at_most_ms": 250},
                         "processes": [{"rank": 0, "handlers": {"torch": {"shapes": {
                             "mode": "sample", "ops": 1000, "ops_with_shapes": 40}}}}]})
    assert dropped == ["program: 'a b' c  ->  exit 0", "processes: 1 on rank 0",
                       "1,200 events dropped during capture: counts and totals are low",
                       "ended without a final flush: pid 7: events of the last 250 ms or less lost",
                       "still running when the run was stored: pid 8 (events after its last flush are not in the run)",
                       "op shapes: 40 of 1,000 ops (sample)"]


@pytest.mark.parametrize("value", ["sample", "all"])
def test_shapes_line_only_when_sampled(value):
    m = {"format": "pastaprof-live", "processes": [{"rank": 0, "handlers": {"torch": {"shapes": {
        "mode": value, "ops": 10, "ops_with_shapes": 10 if value == "all" else 3}}}}]}
    assert any(line.startswith("op shapes:") for line in run_lines(m)) == (value == "sample")
