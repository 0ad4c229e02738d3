"""Trace files whose bytes are no UTF-8 JSON text, through the real CLI: a file zero-filled past a
crash, a 10 GB sparse file after its first bytes, UTF-16 and UTF-32 text, a file whose read fails
(EIO).  Each is refused in one ``pastaprof: error:`` line within seconds (the NULs are never
staged), exit 2, no traceback."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import DATA

SRC = DATA / "mlp_train_3steps.pt.trace.json.gz"


def one_line(path: Path | str, timeout: float = 60) -> str:
    r = subprocess.run([sys.executable, "-m", "pastaprof.cli", "analyze", str(path), "-q", "-t", "kernels"],
                       capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    assert r.returncode == 2 and "Traceback" not in r.stderr, (r.returncode, r.stderr[-2000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"pastaprof: error: {path}: "), lines
    return lines[0]


def test_a_trace_zero_filled_past_a_crash(tmp_path):
    text = gzip.decompress(SRC.read_bytes())
    p = tmp_path / "crashed.json"
    p.write_bytes(text[: len(text) // 2] + b"\x00" * (64 << 20))
    assert f"a NUL byte at byte {len(text) // 2} of the JSON text" in one_line(p)


def test_a_sparse_10_gb_file_after_its_first_bytes_is_refused_at_once(tmp_path):
    """It was staged byte by byte, all 10 GB of it, before anything said no (minutes, a full disk)."""
    p = tmp_path / "sparse.json"
    p.write_bytes(b'{"traceEvents": [')
    os.truncate(p, 10 << 30)
    assert "a NUL byte at byte 17 of the JSON text" in one_line(p, timeout=30)


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be", "utf-32"])
def test_utf16_and_utf32_text_is_named(tmp_path, encoding):
    p = tmp_path / f"{encoding}.json"
    p.write_bytes(gzip.decompress(SRC.read_bytes()).decode().encode(encoding))
    assert "UTF-16 or UTF-32 text" in one_line(p)


@pytest.mark.skipif(not os.path.exists("/proc/self/mem"), reason="no /proc")
def test_a_read_error_is_one_line():
    """/proc/self/mem is a regular file whose read at offset 0 fails with EIO (as a failing disk's would)."""
    assert "read error: Input/output error" in one_line("/proc/self/mem")
