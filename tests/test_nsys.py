"""The Nsight Systems importer against plain SQL on the same real exports (tests/data/nsys/).

Every count, total and link the importer produces is recomputed here with sqlite3
queries of the file itself: per process (= rank), kernels, copies, memsets,
synchronizations, API calls and NVTX ranges; kernel <-> API links on (pid,
correlationId); the op each kernel is attributed to; every default tool and the
diff of the before/after pair.  Then hostile files: truncations, flipped bytes,
foreign SQLite, missing tables, unknown schema versions -- one line, exit 2, the
file untouched.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from pastaprof.api import analyze, import_trace, load
from pastaprof.errors import InputError
from pastaprof.store.run import open_run_dir
from pastaprof.tools.registry import DEFAULT_TOOLS

DATA = Path(__file__).parent / "data" / "nsys"
BEFORE, AFTER = DATA / "mfu_2gpu_before.sqlite", DATA / "mfu_2gpu_after.sqlite"
PID = "((CAST({c} AS INTEGER) >> 24) & 16777215)"
OP_TEXT = "%, op_id = %"


def sql(path: Path, q: str) -> list[tuple]:
    con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    try:
        return con.execute(q).fetchall()
    finally:
        con.close()


def gpu_pids(path: Path) -> list[int]:
    """Processes with CUDA activity, in pid order: the ranks, 0..n-1."""
    rows = sql(path, f"""SELECT {PID.format(c='globalPid')} FROM CUPTI_ACTIVITY_KIND_KERNEL
                         UNION SELECT {PID.format(c='globalTid')} FROM CUPTI_ACTIVITY_KIND_RUNTIME""")
    return sorted(r[0] for r in rows)


def tally(path: Path, table: str, pid_col: str, where: str = "1") -> dict[int, tuple[int, int]]:
    """rank -> (count, total ns) of ``table`` by an SQL GROUP BY."""
    rank_of = {p: r for r, p in enumerate(gpu_pids(path))}
    rows = sql(path, f"SELECT {PID.format(c=pid_col)}, count(*), sum(\"end\" - start) FROM {table} "
                     f"WHERE {where} GROUP BY 1")
    return {rank_of[p]: (n, s) for p, n, s in rows if p in rank_of}


def ours(run, kind: str) -> dict[int, tuple[int, int]]:
    t = run.table(kind)
    out = {}
    for r in sorted(set(t["rank"].to_pylist())):
        sub = t.filter(pc.equal(t["rank"], r))
        out[r] = (sub.num_rows, int(pc.sum(pc.subtract(sub["end_ns"], sub["start_ns"])).as_py() or 0))
    return out


@pytest.fixture(scope="module")
def runs():
    return {p: load(p) for p in (BEFORE, AFTER)}


@pytest.mark.parametrize("path", [BEFORE, AFTER], ids=["before", "after"])
def test_counts_and_totals_equal_sql(runs, path):
    run = runs[path]
    assert run.ranks == [0, 1]
    nvtx_range = "eventType IN (59, 60)"
    nvtx_text = "coalesce(text, (SELECT value FROM StringIds WHERE id = textId))"
    expect = {
        "kernel": tally(path, "CUPTI_ACTIVITY_KIND_KERNEL", "globalPid"),
        "memcpy": tally(path, "CUPTI_ACTIVITY_KIND_MEMCPY", "globalPid"),
        "memset": tally(path, "CUPTI_ACTIVITY_KIND_MEMSET", "globalPid"),
        "sync": tally(path, "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "globalPid"),
        "api": tally(path, "CUPTI_ACTIVITY_KIND_RUNTIME", "globalTid"),
        "op": tally(path, "NVTX_EVENTS", "globalTid", f"{nvtx_range} AND {nvtx_text} LIKE '{OP_TEXT}'"),
        "range": tally(path, "NVTX_EVENTS", "globalTid", f"{nvtx_range} AND {nvtx_text} NOT LIKE '{OP_TEXT}'"),
    }
    for kind, want in expect.items():
        assert ours(run, kind) == want, kind
    # the README's counts of the before file, as a check of the checks
    if path == BEFORE:
        assert [expect["kernel"][r][0] for r in (0, 1)] == [1993, 2017]
        assert sum(n for n, _ in expect["api"].values()) == 7466
        assert sum(n for n, _ in expect["op"].values()) + sum(n for n, _ in expect["range"].values()) == 19118


def test_bytes_kinds_and_names_equal_sql(runs):
    run = runs[BEFORE]
    mc = run.table("memcpy")
    want = dict(sql(BEFORE, "SELECT copyKind, sum(bytes) FROM CUPTI_ACTIVITY_KIND_MEMCPY GROUP BY 1"))
    got = {d: int(pc.sum(mc.filter(pc.equal(mc["direction"].cast(pa.string()), d))["bytes"]).as_py())
           for d in set(mc["direction"].cast(pa.string()).to_pylist())}
    assert got == {"HtoD": want[1], "DtoD": want[8]}
    ms = run.table("memset")
    assert pc.sum(ms["bytes"]).as_py() == sql(BEFORE, "SELECT sum(bytes) FROM CUPTI_ACTIVITY_KIND_MEMSET")[0][0]
    # kernel names: the demangled name of StringIds, per name count
    k = run.table("kernel")
    names = dict(sql(BEFORE, "SELECT s.value, count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                             "JOIN StringIds s ON s.id = k.demangledName GROUP BY 1"))
    vc = pc.value_counts(k["name"].cast(pa.string()).combine_chunks())
    assert {d["values"]: d["counts"] for d in vc.to_pylist()} == names
    # API names lose CUPTI's _vNNNN suffix; driver calls are driver
    api = run.table("api")
    by = {d["values"]: d["counts"] for d in pc.value_counts(api["name"].cast(pa.string()).combine_chunks()).to_pylist()}
    assert by["cudaLaunchKernel"] == sql(BEFORE, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s "
                                                 "ON s.id = r.nameId WHERE s.value = 'cudaLaunchKernel_v7000'")[0][0]
    drivers = sql(BEFORE, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE eventClass = 1")[0][0]
    assert pc.sum(pc.equal(api["api_kind"].cast(pa.string()), "driver").cast(pa.int64())).as_py() == drivers
    # grid and registers of one kernel, straight from its row
    row = sql(BEFORE, "SELECT start, gridX, gridY, gridZ, blockX, registersPerThread, staticSharedMemory + "
                      "dynamicSharedMemory FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY start LIMIT 1")[0]
    first = k.take(pc.sort_indices(k, [("start_ns", "ascending")])[:1]).to_pylist()[0]
    assert (first["grid_x"], first["grid_y"], first["grid_z"], first["block_x"], first["registers"],
            first["shared_bytes"]) == row[1:]


def test_epoch_clock_from_the_session_start(runs):
    run = runs[BEFORE]
    utc, sysns = sql(BEFORE, "SELECT utcEpochNs, systemClockNs FROM TARGET_INFO_SESSION_START_TIME")[0]
    first = sql(BEFORE, "SELECT min(start) FROM CUPTI_ACTIVITY_KIND_KERNEL")[0][0]
    assert pc.min(run.table("kernel")["start_ns"]).as_py() == first - sysns + utc
    clock = run.manifest["clock"]
    assert clock["domain"] == "unix_epoch_ns" and clock["offset_ns"] == utc - sysns
    assert clock["anchor"] == "TARGET_INFO_SESSION_START_TIME.utcEpochNs"
    assert run.manifest["format"] == "nsys-sqlite" and run.manifest["format_version"] == "3.25.0"


def test_links_are_the_sql_join_on_pid_and_correlation(runs):
    """Correlation ids repeat across the two processes; a kernel links to the call of ITS process."""
    collide = sql(BEFORE, f"""SELECT count(*) FROM (SELECT correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME
                              GROUP BY correlationId HAVING count(DISTINCT {PID.format(c='globalTid')}) > 1)""")[0][0]
    run = runs[BEFORE]
    rank_of = {p: r for r, p in enumerate(gpu_pids(BEFORE))}
    pairs = sql(BEFORE, f"""SELECT {PID.format(c='k.globalPid')}, k.start, r.start FROM CUPTI_ACTIVITY_KIND_KERNEL k
                            JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId
                            AND {PID.format(c='r.globalTid')} = {PID.format(c='k.globalPid')}""")
    utc, sysns = sql(BEFORE, "SELECT utcEpochNs, systemClockNs FROM TARGET_INFO_SESSION_START_TIME")[0]
    want = sorted((rank_of[p], ks - sysns + utc, rs - sysns + utc) for p, ks, rs in pairs)
    k, api = run.table("kernel"), run.table("api")
    got = []
    for r in run.ranks:
        kr, ar = (t.filter(pc.equal(t["rank"], r)) for t in (k, api))
        idx = pc.index_in(kr["correlation"], ar["correlation"])
        ok = pc.is_valid(idx)
        got += [(r, ks, ar["start_ns"][i].as_py()) for ks, i in zip(kr.filter(ok)["start_ns"].to_pylist(),
                                                                    pc.drop_null(idx).to_pylist())]
    assert sorted(got) == want and len(want) > 3900
    assert collide > 100  # the collision is real: a join on correlationId alone would cross processes
    # and kernel.op_id is the op_id of that call
    for r in run.ranks:
        kr, ar = (t.filter(pc.equal(t["rank"], r)) for t in (k, api))
        idx = pc.index_in(kr["correlation"], ar["correlation"])
        linked = pc.take(ar["op_id"], idx)
        assert pc.all(pc.or_kleene(pc.is_null(idx), pc.equal(pc.fill_null(linked, -1),
                                                             pc.fill_null(kr["op_id"], -1)))).as_py()


def test_kernels_are_attributed_to_the_innermost_nvtx_op_around_their_launch(runs):
    """Independent: for each launch call, the NVTX op range on its thread that contains it
    and starts last (innermost), by SQL; its name (before ', seq') is the kernel's op."""
    run = runs[BEFORE]
    rows = sql(BEFORE, """
        WITH ops AS (SELECT start, "end", globalTid, text FROM NVTX_EVENTS
                     WHERE eventType = 59 AND text LIKE '%, op_id = %'),
             hit AS (SELECT k.start AS ks, r.start AS rs,
                            (SELECT o.text FROM ops o WHERE o.globalTid = r.globalTid AND o.start <= r.start
                             AND o."end" >= r.start ORDER BY o.start DESC, o."end" ASC LIMIT 1) AS op
                     FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN CUPTI_ACTIVITY_KIND_RUNTIME r
                     ON r.correlationId = k.correlationId
                     AND (r.globalTid >> 24) & 16777215 = (k.globalPid >> 24) & 16777215)
        SELECT op, count(*) FROM hit GROUP BY 1""")
    want = {}
    for text, n in rows:
        name = None if text is None else re.split(r", (?:seq|op_id) = ", text)[0]
        want[name] = want.get(name, 0) + n
    k, op = run.table("kernel"), run.table("op")
    names = {}
    for r in run.ranks:
        kr, orr = (t.filter(pc.equal(t["rank"], r)) for t in (k, op))
        idx = pc.index_in(kr["op_id"], orr["id"])
        for i in idx.to_pylist():
            key = None if i is None else orr["name"][i].as_py()
            names[key] = names.get(key, 0) + 1
    unlinked = sql(BEFORE, """SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k WHERE NOT EXISTS (SELECT 1 FROM
        CUPTI_ACTIVITY_KIND_RUNTIME r WHERE r.correlationId = k.correlationId
        AND (r.globalTid >> 24) & 16777215 = (k.globalPid >> 24) & 16777215)""")[0][0]
    want[None] = want.get(None, 0) + unlinked
    assert names == want
    assert want["flash_attn::_flash_attn_forward"] > 0


def test_every_default_tool_runs_with_checked_numbers(runs):
    run = runs[BEFORE]
    reports = {r.tool: r for r in analyze(run, list(DEFAULT_TOOLS))}
    assert set(reports) == set(DEFAULT_TOOLS)
    k_n, k_ns = sql(BEFORE, 'SELECT count(*), sum("end" - start) FROM CUPTI_ACTIVITY_KIND_KERNEL')[0]
    ks = reports["kernels"].summary
    assert ks["kernels"] == k_n and ks["kernel_ns"] == k_ns
    assert ks["memcpy_bytes"] == sql(BEFORE, "SELECT sum(bytes) FROM CUPTI_ACTIVITY_KIND_MEMCPY")[0][0]
    api_n, api_ns = sql(BEFORE, 'SELECT count(*), sum("end" - start) FROM CUPTI_ACTIVITY_KIND_RUNTIME')[0]
    assert reports["cuda_api"].summary["api_calls"] == api_n and reports["cuda_api"].summary["api_ns"] == api_ns
    c = reports["copies"].summary
    assert c["copies"] == sql(BEFORE, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY")[0][0]
    assert reports["ops"].summary["ops"] == sum(n for n, _ in tally(BEFORE, "NVTX_EVENTS", "globalTid",
                                                                     f"eventType IN (59, 60) AND text LIKE '{OP_TEXT}'").values())
    tl = reports["timeline"].summary
    assert tl["kernels"] == k_n
    for r in (reports["steps"], reports["memory"]):
        assert r.summary is not None


def test_diff_before_after_top_kernel_changes_equal_sql():
    def per_name(path: Path) -> dict[str, int]:
        return dict(sql(path, 'SELECT s.value, sum(k."end" - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k '
                              "JOIN StringIds s ON s.id = k.demangledName GROUP BY 1"))
    b, a = per_name(BEFORE), per_name(AFTER)
    delta = {n: a.get(n, 0) - b.get(n, 0) for n in set(a) & set(b)}
    worst, best = max(delta, key=delta.get), min(delta, key=delta.get)
    from pastaprof.report.diff import diff

    d = diff(BEFORE, AFTER).to_dict(None)
    kreg = [x for x in d["regressions"] if x["kind"] == "kernel"]
    kimp = [x for x in d["improvements"] if x["kind"] == "kernel"]
    assert kreg[0]["base_name"] == worst and kreg[0]["delta_ns"] == delta[worst]
    assert kimp[0]["base_name"] == best and kimp[0]["delta_ns"] == delta[best]
    r = subprocess.run([sys.executable, "-m", "pastaprof.cli", "diff", str(BEFORE), str(AFTER)],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "ncclDevKernel_SendRecv" in r.stdout and "Traceback" not in r.stderr


def test_import_to_a_run_dir_then_info_names_format_and_version(tmp_path):
    out = import_trace(BEFORE, tmp_path / "run")
    run = open_run_dir(out)
    assert run.manifest["format"] == "nsys-sqlite" and run.manifest["importer"] == "nsys"
    assert run.table("kernel").num_rows == 4010
    r = subprocess.run([sys.executable, "-m", "pastaprof.cli", "info", str(BEFORE)], capture_output=True, text=True)
    assert r.returncode == 0 and "format=nsys-sqlite 3.25.0" in r.stdout
    r = subprocess.run([sys.executable, "-m", "pastaprof.cli", "info", str(out)], capture_output=True, text=True)
    assert r.returncode == 0 and "format=nsys-sqlite 3.25.0" in r.stdout


def test_ranks_option_and_a_folder_of_exports(tmp_path):
    one = load(BEFORE, ranks=[1])
    assert one.ranks == [1] and one.table("kernel").num_rows == 2017
    (tmp_path / "job").mkdir()
    shutil.copy(BEFORE, tmp_path / "job" / "node0.sqlite")
    shutil.copy(AFTER, tmp_path / "job" / "node1.sqlite")
    (tmp_path / "job" / "notes.txt").write_text("hello")
    run = load(tmp_path / "job")
    assert run.ranks == [0, 1, 2, 3]
    per = {r: n for r, (n, _) in ours(run, "kernel").items()}
    assert per == {0: 1993, 1: 2017, 2: tally(AFTER, "CUPTI_ACTIVITY_KIND_KERNEL", "globalPid")[0][0],
                   3: tally(AFTER, "CUPTI_ACTIVITY_KIND_KERNEL", "globalPid")[1][0]}


# --- hostile and foreign files: one line, exit 2, the file untouched ----------------------------------------

def cli_error(path: Path) -> str:
    r = subprocess.run([sys.executable, "-m", "pastaprof.cli", "info", str(path)], capture_output=True, text=True)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pastaprof: error: ") and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def digest(path: Path) -> tuple[str, int]:
    return hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns


def _edit(tmp: Path, name: str, *stmts: str) -> Path:
    p = tmp / name
    shutil.copy(BEFORE, p)
    con = sqlite3.connect(p)
    for s in stmts:
        con.execute(s)
    con.commit()
    con.close()
    return p


def test_unknown_major_version_and_missing_tables(tmp_path):
    p = _edit(tmp_path, "v9.sqlite", "UPDATE META_DATA_EXPORT SET value = '9.0.1' WHERE name = 'EXPORT_SCHEMA_VERSION'")
    assert "schema 9.0.1: major version '9' is not one pastaprof reads (3.x)" in cli_error(p)
    # a minor version it has not seen is read (columns are probed)
    p = _edit(tmp_path, "v3_99.sqlite", "UPDATE META_DATA_EXPORT SET value = '3.99.0' WHERE name = 'EXPORT_SCHEMA_VERSION'")
    assert load(p).table("kernel").num_rows == 4010
    # columns dropped: the kernel names and grids read as null, counts unchanged
    p = _edit(tmp_path, "nocols.sqlite", "ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL DROP COLUMN gridX",
              "ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL DROP COLUMN greenContextId")
    k = load(p).table("kernel")
    assert k.num_rows == 4010 and k["grid_x"].null_count == 4010
    # no runtime table, no NVTX: kernels alone, unlinked
    p = _edit(tmp_path, "gpu_only.sqlite", "DROP TABLE CUPTI_ACTIVITY_KIND_RUNTIME", "DROP TABLE NVTX_EVENTS")
    run = load(p)
    assert run.table("kernel").num_rows == 4010 and run.table("kernel")["op_id"].null_count == 4010
    assert run.table("op").num_rows == 0 and run.table("api").num_rows == 0
    # no session start: session-relative times, said in a note and the manifest
    p = _edit(tmp_path, "noclock.sqlite", "DROP TABLE TARGET_INFO_SESSION_START_TIME")
    run = load(p)
    assert run.manifest["clock"]["domain"] == "nsys_session_ns"
    assert pc.min(run.table("kernel")["start_ns"]).as_py() == sql(BEFORE, "SELECT min(start) FROM "
                                                                          "CUPTI_ACTIVITY_KIND_KERNEL")[0][0]


def test_a_sqlite_that_is_not_nsys_and_other_foreign_files(tmp_path):
    p = tmp_path / "app.sqlite"
    con = sqlite3.connect(p)
    con.execute("CREATE TABLE users (id INTEGER, name TEXT)")
    con.commit()
    con.close()
    line = cli_error(p)
    assert "is an SQLite database, not a trace any importer reads" in line
    (tmp_path / "blob.bin").write_bytes(bytes(range(256)) * 4)
    assert "not JSON" in cli_error(tmp_path / "blob.bin")  # the Kineto importer's fallback names it


def test_string_values_in_integer_columns_are_one_line(tmp_path):
    p = _edit(tmp_path, "text_in_int.sqlite", "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = 'soon' WHERE rowid = 5",
              "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET gridX = 'a,b\nc' WHERE rowid = 6")
    with pytest.raises(InputError, match="integer column holds"):
        load(p)
    line = cli_error(p)
    assert "integer column holds" in line and str(p) in line
    # a crafted text that would pass as extra CSV rows is caught by the row count
    q = _edit(tmp_path, "rows_in_text.sqlite",
              "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET gridX = '1' || char(10) || (SELECT group_concat(x, ',') FROM "
              "(SELECT 7 AS x FROM CUPTI_ACTIVITY_KIND_KERNEL LIMIT 17)) WHERE rowid = 6")
    with pytest.raises(InputError, match="integer column holds"):
        load(q)
    # a fraction in a nullable INTEGER column (correlationId) is no integer either: not truncated silently
    f = _edit(tmp_path, "fraction.sqlite", "UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET correlationId = 2.5 WHERE rowid = 9")
    with pytest.raises(InputError, match="integer column holds a value that is no 64-bit integer"):
        load(f)
    assert sorted(x.name for x in tmp_path.iterdir()) == ["fraction.sqlite", "rows_in_text.sqlite", "text_in_int.sqlite"]


@pytest.mark.parametrize("seed", range(6))
def test_fuzz_truncated_and_flipped_files(tmp_path, seed):
    """Truncations and flipped bytes: imported (damage SQLite does not notice) or one
    InputError line; never a traceback, the file never written."""
    rng = random.Random(seed)
    data = bytearray(BEFORE.read_bytes())
    if seed % 2 == 0:
        data = data[: rng.randrange(100, len(data))]
    else:
        for _ in range(rng.choice([1, 16, 256])):
            i = rng.randrange(100 if seed < 3 else 0, len(data))
            data[i] ^= 1 << rng.randrange(8)
    p = tmp_path / f"fuzz{seed}.sqlite"
    p.write_bytes(bytes(data))
    os.chmod(p, 0o444)
    before = digest(p)
    try:
        run = load(p)
        assert run.table("kernel").num_rows <= 4010
    except InputError as e:
        assert "\n" not in str(e) and str(p) in str(e)
    assert digest(p) == before
    assert sorted(x.name for x in tmp_path.iterdir()) == [p.name]  # no -journal, -wal, -shm beside it


def test_truncated_file_cli_is_one_line(tmp_path):
    p = tmp_path / "cut.sqlite"
    p.write_bytes(BEFORE.read_bytes()[: 1 << 20])
    line = cli_error(p)
    assert "corrupt or truncated SQLite database" in line and str(p) in line


def test_a_file_in_a_read_only_folder_is_read_and_nothing_written(tmp_path):
    d = tmp_path / "ro"
    d.mkdir()
    shutil.copy(BEFORE, d / "r.sqlite")
    before = digest(d / "r.sqlite")
    os.chmod(d, 0o555)
    try:
        assert load(d / "r.sqlite").table("kernel").num_rows == 4010
        assert sorted(x.name for x in d.iterdir()) == ["r.sqlite"] and digest(d / "r.sqlite") == before
    finally:
        os.chmod(d, 0o755)


def test_os_runtime_cuda_events_and_memory_usage_when_present(tmp_path):
    """Tables the real files lack, filled from their own rows (times of real calls), mapped as documented."""
    p = _edit(tmp_path, "extra.sqlite",
              "CREATE TABLE OSRT_API (start INTEGER, end INTEGER, globalTid INTEGER, nameId INTEGER)",
              "INSERT INTO OSRT_API SELECT start, end, globalTid, nameId FROM CUPTI_ACTIVITY_KIND_RUNTIME LIMIT 7",
              # the export has this table (empty): its own columns, timestamp instead of start/end
              "INSERT INTO CUPTI_ACTIVITY_KIND_CUDA_EVENT (timestamp, deviceId, contextId, streamId, correlationId, "
              "globalPid, eventId, eventSyncId) SELECT start, deviceId, contextId, streamId, correlationId, globalPid, "
              "eventId, eventSyncId FROM CUPTI_ACTIVITY_KIND_SYNCHRONIZATION LIMIT 5",
              "CREATE TABLE CUDA_GPU_MEMORY_USAGE_EVENTS (start INTEGER, globalPid INTEGER, deviceId INTEGER, "
              "address INTEGER, bytes INTEGER, memKind INTEGER, memoryOperationType INTEGER, correlationId INTEGER)",
              "INSERT INTO CUDA_GPU_MEMORY_USAGE_EVENTS SELECT start, globalPid, deviceId, 4096 * rowid, bytes, 2, "
              "rowid % 2, correlationId FROM CUPTI_ACTIVITY_KIND_MEMCPY LIMIT 10")
    run = load(p)
    rng = run.table("range")
    assert pc.sum(pc.equal(rng["domain"].cast(pa.string()), "osrt").cast(pa.int64())).as_py() == 7
    sync = run.table("sync")
    assert pc.sum(pc.equal(sync["name"].cast(pa.string()), "Event Record").cast(pa.int64())).as_py() == 5
    assert run.table("sync").num_rows == 366 + 5
    assert run.table("alloc").num_rows == 5 and run.table("free").num_rows == 5
    assert set(run.table("alloc")["memory_kind"].cast(pa.string()).to_pylist()) == {"device"}


def test_no_python_object_per_row_in_the_fetch():
    """The integer CSV path: 4010 kernel rows arrive as one string per chunk, parsed by Arrow."""
    from pastaprof.importers.nsys_sql import Db, connect

    db = Db(BEFORE, connect(BEFORE))
    t = db.fetch("CUPTI_ACTIVITY_KIND_KERNEL", {"start": "start", "corr": "correlationId"})
    want = sql(BEFORE, "SELECT start, correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY rowid")
    assert list(zip(t["start"].to_pylist(), t["corr"].to_pylist())) == want
    assert np.asarray(t["start"]).dtype == np.int64
