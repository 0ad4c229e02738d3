"""A folder of traces holding entries named like traces that are none (a FIFO, links to /dev/zero,
to a directory, dangling, looping) and traces reached through a link out of the folder, through
the real CLI: the traces are read, the odd entries are never opened (a FIFO blocks, /dev/zero never
ends) and each is named in a note, as is every link out of the folder."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from conftest import DATA

SRC = DATA / "mlp_train_3steps.pt.trace.json.gz"
KERNELS = 81


def _analyze(folder: Path, tmp: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pastaprof.cli", "analyze", str(folder), "-q", "-t", "kernels",
                           "--json", str(tmp / "f.json")], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)


def test_entries_that_are_no_file_are_skipped_by_name_never_opened(tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    shutil.copy(SRC, job / "rank-0.pt.trace.json.gz")
    os.mkfifo(job / "rank-1.pt.trace.json")                     # opening it would block
    (job / "rank-2.pt.trace.json").symlink_to("/dev/zero")       # reading it would never end
    (job / "rank-3.pt.trace.json.gz").symlink_to("gone.json.gz")
    (job / "rank-4.pt.trace.json").symlink_to("rank-4.pt.trace.json")
    (job / "rank-5.pt.trace.json").mkdir()
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(job / "rank-6.pt.trace.json"))
    s.close()
    r = _analyze(job, tmp_path)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    notes = [line for line in r.stderr.splitlines() if line.startswith("pastaprof: note: skipped 6 files")]
    assert len(notes) == 1, r.stderr
    for name, what in [("rank-1.pt.trace.json", "a FIFO"), ("rank-2.pt.trace.json", "a link to a character device"),
                       ("rank-3.pt.trace.json.gz", "a dangling link")]:
        assert f"{name}: {what}" in notes[0], notes[0]
    assert "and 3 more" in notes[0], notes[0]
    assert f'"kernels": {KERNELS}' in (tmp_path / "f.json").read_text()


def test_a_trace_read_through_a_link_out_of_the_folder_is_said(tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    outside = tmp_path / "elsewhere" / "t.pt.trace.json.gz"
    outside.parent.mkdir()
    shutil.copy(SRC, outside)
    (job / "rank-0.pt.trace.json.gz").symlink_to(outside)
    r = _analyze(job, tmp_path)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert (f"pastaprof: note: read 1 trace through a link out of the folder: rank-0.pt.trace.json.gz -> {outside}"
            in r.stderr.splitlines()), r.stderr
