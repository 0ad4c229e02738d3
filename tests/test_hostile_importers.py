"""Hand-made hostile inputs for the importers other than Kineto's, each built from a real sample:
memory snapshot pickles that crash or recurse, lone surrogates in text, Nsight Systems exports
with a huge rowid, a view in place of a table, and MPI ranks that are not distinct.  Each is
read (with the numbers of the sample) or refused in one line, exit 2, never a crash."""

from __future__ import annotations

import gzip
import json
import pickle
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import DATA

import pastaprof

SNAP = DATA / "snapshots" / "oom.pickle"
NSYS = DATA / "nsys" / "mfu_2gpu_after.sqlite"
ET = DATA / "recorded" / "et_beside_kineto" / "rank-0.et.json.gz"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pastaprof.cli", *args], capture_output=True, text=True, timeout=120)


def test_a_pickle_that_crashes_python_when_loaded_is_one_line(tmp_path):
    """A tuple nested 200,000 deep as a dict key: hashing it overflowed the C stack (exit 139,
    and import left its partial run directory)."""
    p = tmp_path / "deep.pickle"
    p.write_bytes(b"\x80\x02}(X\x08\x00\x00\x00segments]" + b")" + b"\x85" * 200_000 + b"K\x01u.")
    r = cli("import", str(p), "-o", str(tmp_path / "run"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "crashes Python" in r.stderr, r.stderr
    assert [q.name for q in tmp_path.iterdir()] == ["deep.pickle"]


def _snapshot(tmp: Path, change) -> Path:
    s = pickle.loads(SNAP.read_bytes())  # the repository's own sample: trusted
    change(s)
    p = tmp / "s.pickle"
    p.write_bytes(pickle.dumps(s, 2))
    return p


@pytest.mark.parametrize("case", ["deep_action", "line_2_31", "device_list", "surrogate_frame"])
def test_odd_snapshot_values_are_read_around(tmp_path, case):
    """A list nested 100,000 deep where a string belongs (str() raised RecursionError), a line
    past int32, an annotation device that is a list (unhashable), a lone surrogate in a frame
    name (Arrow refused it): the snapshot's blocks are read as from the sample (but for the
    entry whose action is no text)."""
    def change(s):
        e = s["device_traces"][0][0]
        if case == "deep_action":
            e["action"] = "__DEEP__"
        elif case == "line_2_31":
            e["frames"][0]["line"] = 2**31
        elif case == "device_list":
            s["external_annotations"] = [{"name": "a", "stage": "START", "time_us": 1, "device": [0]}]
        else:
            e["frames"][0]["name"] = "\ud800"
    p = _snapshot(tmp_path, change)
    if case == "deep_action":  # the nested list written as opcodes: pickling one would recurse here
        p.write_bytes(p.read_bytes().replace(b"X\x08\x00\x00\x00__DEEP__", b"]" * 100_000 + b"a" * 99_999, 1))
    r = cli("import", str(p), "-o", str(tmp_path / "run"))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    base = pastaprof.load(SNAP).table("alloc").num_rows
    lost = 1 if case == "deep_action" else 0  # the entry without an action is no alloc any more
    assert pastaprof.load(tmp_path / "run").table("alloc").num_rows == base - lost > 0


def test_a_lone_surrogate_in_an_execution_trace_is_read(tmp_path):
    d = json.loads(gzip.decompress(ET.read_bytes()))
    node = next(n for n in d["nodes"] if not n["name"].startswith("[pytorch"))
    node["name"] = "\ud800"
    p = tmp_path / "s.et.json"
    p.write_text(json.dumps(d))  # "\\ud800": orjson refuses it, the salvage path reads it
    r = cli("import", str(p), "-o", str(tmp_path / "run"))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr


def _nsys(tmp: Path, *sql: str) -> Path:
    p = tmp / "x.sqlite"
    shutil.copy(NSYS, p)
    con = sqlite3.connect(p)
    for s in sql:
        con.execute(s)
    con.commit()
    con.close()
    return p


@pytest.mark.parametrize("sql", [
    ["UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET rowid = 9223372036854775807 "
     "WHERE rowid = (SELECT max(rowid) FROM CUPTI_ACTIVITY_KIND_KERNEL)"],
    ["ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL RENAME TO K2", "CREATE VIEW CUPTI_ACTIVITY_KIND_KERNEL AS SELECT * FROM K2"],
], ids=["rowid_2_63", "view"])
def test_nsys_kernels_behind_a_huge_rowid_or_a_view_are_all_read(tmp_path, sql):
    """One rowid of 2**63-1 made 2**45 rowid ranges (memory ran out); a view has no rowid (0
    kernels were read, exit 0).  Both give the sample's kernels."""
    want = pastaprof.load(NSYS).table("kernel").num_rows
    assert pastaprof.load(_nsys(tmp_path, *sql)).table("kernel").num_rows == want > 1000


def test_nsys_mpi_ranks_that_are_not_distinct_fall_back_to_pid_order(tmp_path):
    """MPI_RANKS naming rank 0 for both GPU processes merged them into one rank, silently."""
    p = _nsys(tmp_path, "CREATE TABLE MPI_RANKS (globalTid INTEGER, rank INTEGER)",
              "INSERT INTO MPI_RANKS SELECT DISTINCT globalPid, 0 FROM CUPTI_ACTIVITY_KIND_KERNEL")
    run = pastaprof.load(p)
    assert run.ranks == pastaprof.load(NSYS).ranks == [0, 1]
    assert any("no rank each of their own" in n for n in run.manifest["notes"])
