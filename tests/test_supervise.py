"""The `pastaprof run` parent while the program runs: asleep in one call, and no thread of it
able to take a signal meant for the supervisor (live/supervise.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc (Linux)")


def _started(tmp_path: Path, seconds: float) -> tuple[subprocess.Popen, int]:
    """`pastaprof run -- sleep SECONDS` and the program's pid, once the program runs."""
    proc = subprocess.Popen([sys.executable, "-m", "pastaprof.cli", "run", "-o", str(tmp_path / "run"), "--",
                             "sleep", str(seconds)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    end = time.monotonic() + 60
    while time.monotonic() < end:
        kids = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        if kids:
            return proc, int(kids[0])
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("the program did not start within 60 s")


def _status(pid: int, tid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/task/{tid}/status").read_text().splitlines()
    return dict(ln.split(":\t", 1) for ln in lines if ":\t" in ln)


def test_every_thread_of_the_parent_blocks_the_signals_it_takes(tmp_path):
    """A thread that does not block SIGCHLD or SIGTERM (numpy's OpenBLAS workers, started by an
    import before the program was spawned, did not) takes them when the main thread is not in
    sigtimedwait: a SIGCHLD is then lost, a SIGTERM kills pastaprof mid-compaction."""
    proc, _child = _started(tmp_path, 3)
    try:
        time.sleep(0.5)
        tids = [int(t) for t in os.listdir(f"/proc/{proc.pid}/task") if int(t) != proc.pid]
        assert tids, "the parent has threads besides its main one (the warm-up, OpenBLAS, jemalloc)"
        for tid in tids:
            blocked = int(_status(proc.pid, tid)["SigBlk"], 16)
            for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1):
                assert blocked >> (sig - 1) & 1, (tid, Path(f"/proc/{proc.pid}/task/{tid}/comm").read_text(), sig)
    finally:
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err


def test_the_parent_sleeps_in_one_call_while_the_program_runs(tmp_path):
    """No polling: the main thread does not wake (no voluntary context switch) while a quiet
    program runs, where a 0.5 s poll woke it twice a second."""
    proc, child = _started(tmp_path, 4)
    try:
        time.sleep(0.5)
        before = int(_status(proc.pid, proc.pid)["voluntary_ctxt_switches"])
        time.sleep(2.0)
        after = int(_status(proc.pid, proc.pid)["voluntary_ctxt_switches"])
        assert Path(f"/proc/{child}").exists()  # still running: the 2 s were all waiting
    finally:
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert after - before == 0
