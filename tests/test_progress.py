"""Progress of a long import on stderr: one plain line per real phase when stderr is not a
terminal (a CI log), none for small inputs or -q."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pastaprof.report.progress import PROGRESS_MIN_BYTES

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "src" / "pastaprof" / "data" / "example_gpt2_train_3steps.pt.trace.json.gz"
LINE = re.compile(r"^pastaprof: (.+) \((\d+\.\d) s\)$")


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("big") / "x2.pt.trace.json"
    subprocess.run([sys.executable, str(REPO / "bench" / "make_big_trace.py"), "--copies", "2", "-o", str(out)],
                   check=True, capture_output=True, timeout=300)
    assert out.stat().st_size >= PROGRESS_MIN_BYTES
    return out


def phases(*args: str) -> tuple[list[tuple[str, float]], float, subprocess.CompletedProcess]:
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "pastaprof.cli", *args], capture_output=True, text=True, timeout=600)
    wall = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    found = [(m[1], float(m[2])) for m in map(LINE.match, r.stderr.splitlines()) if m]
    return found, wall, r


def test_a_line_per_phase_when_stderr_is_a_pipe(big, tmp_path):
    found, wall, r = phases("analyze", str(big), "-t", "kernels,steps", "--json", str(tmp_path / "f.json"))
    names = [n for n, _ in found]
    assert names == [f"reading {big.name} ({big.stat().st_size / 1e6:.0f} MB)", "rank 0 read, mapping it",
                     "running the tools", "writing the report", "done"], r.stderr
    times = [t for _, t in found]
    assert times == sorted(times) and times[0] == 0.0 and times[-1] <= wall
    assert (tmp_path / "f.json").stat().st_size > 0


def test_the_html_report_names_its_own_phase(big, tmp_path):
    found, _, _ = phases("report", str(big), "-o", str(tmp_path / "p.html"), "-t", "kernels")
    assert [n for n, _ in found][-2:] == ["writing the HTML page", "done"]


def test_no_progress_for_small_inputs_or_quiet(big, tmp_path):
    assert EXAMPLE.stat().st_size < PROGRESS_MIN_BYTES
    found, _, _ = phases("analyze", str(EXAMPLE), "-t", "kernels")
    assert found == []
    found, _, _ = phases("analyze", str(big), "-t", "kernels", "-q", "--json", str(tmp_path / "q.json"))
    assert found == []
