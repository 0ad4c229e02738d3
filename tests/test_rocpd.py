"""rocpd (rocprofv3 SQLite) import: counts, totals and links against an independent SQL tally
of the same files; a 12-process job (more files than SQLite's ATTACH limit); column probing
on a minimal file; refusals in one line; a fixed-seed fuzz.  The databases are schema-built
(tests/data/rocpd/make_rocpd.py says why and from which published schema)."""

from __future__ import annotations

import random
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from pastaprof import api
from pastaprof.errors import PastaprofError
from pastaprof.events.schema import conform
from pastaprof.importers.registry import importer_for
from pastaprof.importers.rocpd import RocpdImporter
from pastaprof.processor.link import link_rank

DATA = Path(__file__).parent / "data" / "rocpd"
SINGLES = ["single_3.0.0.db", "single_3.0.3.db", "minimal_3.0.0.db"]


def _uuid(con: sqlite3.Connection) -> str:
    (name,) = con.execute("SELECT name FROM sqlite_master WHERE name LIKE 'rocpd_metadata_%'").fetchone()
    return name[len("rocpd_metadata"):]


def _tally(path: Path) -> dict:
    """What the file holds, by plain SQL on its per-process tables."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    u = _uuid(con)
    q = lambda sql: con.execute(sql.replace("{u}", u)).fetchall()  # noqa: E731
    cat = lambda c: f"""(SELECT count(*) FROM rocpd_region{{u}} R JOIN rocpd_event{{u}} E ON E.id = R.event_id
                        JOIN rocpd_string{{u}} S ON S.id = E.category_id WHERE S.string {c})"""  # noqa: E731
    out = {
        "kernels": q("SELECT count(*), sum(\"end\" - start) FROM rocpd_kernel_dispatch{u}")[0],
        "copies": dict((r[0], (r[1], r[2])) for r in q(
            """SELECT CASE WHEN s.type = 'CPU' AND d.type = 'GPU' THEN 'HtoD' WHEN s.type = 'GPU' AND d.type = 'CPU'
                      THEN 'DtoH' WHEN s.id = d.id THEN 'DtoD' ELSE 'PtoP' END, count(*), sum(size)
               FROM rocpd_memory_copy{u} M JOIN rocpd_info_agent{u} s ON s.id = M.src_agent_id
               JOIN rocpd_info_agent{u} d ON d.id = M.dst_agent_id GROUP BY 1""")),
        "api": q(f"SELECT {cat('NOT LIKE ' + repr('MARKER%'))}")[0][0],
        "ranges": q(f"SELECT {cat('= ' + repr('MARKER_CORE_API'))}")[0][0],
        "allocs": q("SELECT count(*) FROM rocpd_memory_allocate{u} WHERE type IN ('ALLOC', 'REALLOC')")[0][0],
        "frees": q("SELECT count(*) FROM rocpd_memory_allocate{u} WHERE type IN ('FREE', 'RECLAIM')")[0][0],
        "launch_links": q("""SELECT count(*) FROM rocpd_kernel_dispatch{u} K JOIN rocpd_event{u} KE ON KE.id = K.event_id
                             JOIN rocpd_event{u} RE ON RE.correlation_id = KE.correlation_id
                             JOIN rocpd_region{u} R ON R.event_id = RE.id
                             JOIN rocpd_string{u} N ON N.id = R.name_id WHERE N.string = 'hipLaunchKernel'""")[0][0],
        "pid": q("SELECT pid FROM rocpd_info_process{u}")[0][0],
    }
    con.close()
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("rocpd")
    out = {}
    for name in SINGLES + ["job"]:
        out[name] = api.import_trace(DATA / name, base / name)
    return out


def _sql(run: Path, sql: str):
    return duckdb.sql(sql.replace("RUN", str(run))).fetchall()


@pytest.mark.parametrize("name", SINGLES)
def test_counts_and_totals_equal_an_sql_tally(runs, name):
    want, run = _tally(DATA / name), runs[name]
    assert _sql(run, "SELECT count(*), sum(end_ns - start_ns) FROM 'RUN/kernel/*.parquet'")[0] == want["kernels"]
    got = dict((r[0], (r[1], r[2])) for r in _sql(
        run, "SELECT direction, count(*), sum(bytes) FROM 'RUN/memcpy/*.parquet' GROUP BY 1"))
    assert got == want["copies"] and set(got) == {"HtoD", "DtoH", "DtoD", "PtoP"}
    assert _sql(run, "SELECT count(*) FROM 'RUN/api/*.parquet'")[0][0] == want["api"]
    assert _sql(run, "SELECT count(*) FROM 'RUN/range/*.parquet'")[0][0] == want["ranges"] == 3
    assert _sql(run, "SELECT count(*) FROM 'RUN/alloc/*.parquet'")[0][0] == want["allocs"]
    assert _sql(run, "SELECT count(*) FROM 'RUN/free/*.parquet'")[0][0] == want["frees"]
    links = _sql(run, """SELECT count(*) FROM 'RUN/kernel/*.parquet' k JOIN 'RUN/api/*.parquet' a
                         ON a.correlation = k.correlation AND a.rank = k.rank WHERE a.name = 'hipLaunchKernel'""")
    assert links[0][0] == want["launch_links"] == want["kernels"][0]
    assert _sql(run, "SELECT DISTINCT pid FROM 'RUN/kernel/*.parquet'") == [(want["pid"],)]


def test_grid_is_in_workgroups_and_devices_are_gpu_indices(runs):
    con = sqlite3.connect(DATA / "single_3.0.3.db")
    u = _uuid(con)
    sizes = sorted(con.execute(f"SELECT grid_size_x, workgroup_size_x FROM rocpd_kernel_dispatch{u}").fetchall())
    rows = sorted(_sql(runs["single_3.0.3.db"], "SELECT grid_x, block_x FROM 'RUN/kernel/*.parquet'"))
    assert rows == sorted(((g + w - 1) // w, w) for g, w in sizes)
    assert {d for (d,) in _sql(runs["single_3.0.3.db"], "SELECT DISTINCT device FROM 'RUN/kernel/*.parquet'")} == {0, 1}
    kinds = dict(_sql(runs["single_3.0.3.db"], "SELECT memory_kind, count(*) FROM 'RUN/alloc/*.parquet' GROUP BY 1"))
    assert kinds == {"device": 3, "scratch": 3}


def test_a_job_of_twelve_files_is_twelve_ranks_from_their_environment(runs):
    run = runs["job"]
    files = sorted((DATA / "job").glob("*.db"))
    assert len(files) == 12  # more than SQLite's ATTACH limit
    by_pid = {_tally(f)["pid"]: _tally(f) for f in files}
    got = _sql(run, "SELECT rank, min(pid), max(pid), count(*) FROM 'RUN/kernel/*.parquet' GROUP BY 1 ORDER BY 1")
    assert [r[0] for r in got] == list(range(12))
    for rank, pid, pid2, n in got:
        assert pid == pid2 == 5000 + (7 * rank) % 12 and n == by_pid[pid]["kernels"][0]
    import json

    man = json.loads((run / "run.json").read_text())
    assert all(v["from"] == "environment" and v["guess"] is False for v in man["rank_source"].values())
    assert man["format"] == "rocpd" and man["format_version"] == "3.0.3"


def test_info_names_format_and_version(runs):
    r = subprocess.run([sys.executable, "-m", "pastaprof.cli", "info", str(runs["single_3.0.0.db"])],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "format=rocpd" in r.stdout and "rocpd_schema=3.0.0" in r.stdout


def test_every_default_tool_runs(runs):
    reports = api.analyze(runs["single_3.0.3.db"])
    by = {r.tool: r for r in reports}
    assert {"steps", "kernels", "ops", "timeline", "cuda_api", "copies", "memory"} <= set(by)
    assert by["kernels"].summary["kernels"] == _tally(DATA / "single_3.0.3.db")["kernels"][0]
    assert by["steps"].summary["steps"] == 3  # the roctx train_step_N ranges
    assert by["cuda_api"].summary["sync_calls"] == 3


def test_the_file_is_opened_read_only(tmp_path):
    db = tmp_path / "a.db"
    shutil.copy(DATA / "single_3.0.0.db", db)
    before = (db.read_bytes(), db.stat().st_mtime_ns)
    api.import_trace(db, tmp_path / "run")
    assert (db.read_bytes(), db.stat().st_mtime_ns) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.db", "run"]  # no journal or WAL beside it


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pastaprof.cli", *args], capture_output=True, text=True)


def test_an_unknown_major_version_is_refused_in_one_line(tmp_path):
    db = tmp_path / "v4.db"
    shutil.copy(DATA / "single_3.0.3.db", db)
    con = sqlite3.connect(db)
    con.execute(f"UPDATE rocpd_metadata{_uuid(con)} SET value = '4.1.0' WHERE tag = 'schema_version'")
    con.commit()
    con.close()
    r = _cli("analyze", str(db))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "schema 4.1.0" in r.stderr and "3.0.x" in r.stderr


def test_foreign_sqlite_and_cut_files_are_one_line(tmp_path):
    other = tmp_path / "other.db"
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE t (x)")
    con.commit()
    con.close()
    cut = tmp_path / "cut.db"
    cut.write_bytes((DATA / "single_3.0.0.db").read_bytes()[:3000])
    for p in (other, cut):
        r = _cli("analyze", str(p))
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr


def test_claims():
    imp = RocpdImporter()
    assert imp.sniff(DATA / "single_3.0.3.db").version == "3.0.3"
    assert imp.sniff(DATA / "job").score == 100
    assert imp.sniff(Path(__file__)) is None
    assert importer_for(DATA / "job")[0].name == "rocpd"


JUNK = [None, "junk", -1, 2 ** 62, -(2 ** 63), 1.5e300, "\x1b[2J<script>", b"\xff\xfe", 0, ""]


def _mutate(rng: random.Random, db: Path) -> None:
    k = rng.randrange(6)
    if k == 4:
        data = bytearray(db.read_bytes())
        for _ in range(rng.randrange(1, 20)):
            data[rng.randrange(100, len(data))] = rng.randrange(256)
        db.write_bytes(bytes(data))
        return
    if k == 5:
        db.write_bytes(db.read_bytes()[: rng.randrange(100, db.stat().st_size)])
        return
    con = sqlite3.connect(db)
    tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    t = rng.choice(tables)
    if k == 0:
        con.execute(f'DROP TABLE "{t}"')
    else:
        cols = [r[1] for r in con.execute(f'PRAGMA table_info("{t}")')]
        for _ in range(rng.randrange(1, 4)):
            c = rng.choice(cols)
            try:
                con.execute(f'UPDATE "{t}" SET "{c}" = ? WHERE abs(random()) % 3 = 0', (rng.choice(JUNK),))
            except sqlite3.IntegrityError:  # an INTEGER PRIMARY KEY takes integers only
                pass
    con.commit()
    con.close()


def test_fuzz_fixed_seed_one_line_or_events(tmp_path):
    rng = random.Random(20261201)
    imp = RocpdImporter()
    ok = refused = 0
    for i in range(200):
        db = tmp_path / f"f{i}.db"
        shutil.copy(DATA / rng.choice(SINGLES), db)
        _mutate(rng, db)
        try:
            if imp.sniff(db) is None:
                refused += 1
                continue
            for _rank, tables, _meta in imp.import_ranks(db):
                for kind, t in link_rank(tables).items():
                    conform(kind, t)
            ok += 1
        except PastaprofError as e:
            assert "\n" not in str(e), (i, str(e))
            refused += 1
        db.unlink()
    assert ok + refused == 200 and ok > 40 and refused > 20


def test_a_column_of_numbers_and_text_across_batches(tmp_path, monkeypatch):
    """SQLite is typeless: one batch of rows may give a column as numbers, the next as text."""
    import pastaprof.importers.rocpd.db as rocpd

    db = tmp_path / "a.db"
    shutil.copy(DATA / "single_3.0.3.db", db)
    con = sqlite3.connect(db)
    con.execute(f"UPDATE rocpd_kernel_dispatch{_uuid(con)} SET start = 'x', dispatch_id = 'y' WHERE id = 12")
    con.commit()
    con.close()
    monkeypatch.setattr(rocpd, "BATCH", 4)
    ((_rank, tables, meta),) = list(RocpdImporter().import_ranks(db))
    assert tables["kernel"].num_rows == 11 and meta["dropped"] == {"kernel rows without a time": 1}


def test_hostile_names_reach_the_terminal_escaped(tmp_path):
    db = tmp_path / "h.db"
    shutil.copy(DATA / "single_3.0.3.db", db)
    con = sqlite3.connect(db)
    con.execute(f"UPDATE rocpd_info_kernel_symbol{_uuid(con)} SET display_name = ?", ("\x1b[2J\x07<b>evil</b>",))
    con.commit()
    con.close()
    r = _cli("analyze", str(db), "-t", "kernels")
    assert r.returncode == 0 and "\x1b[2J" not in r.stdout and "\x07" not in r.stdout and "evil" in r.stdout


def test_a_folder_skips_sqlite_files_that_are_no_rocpd(tmp_path):
    shutil.copy(DATA / "single_3.0.0.db", tmp_path / "a.db")
    con = sqlite3.connect(tmp_path / "b.db")
    con.execute("CREATE TABLE t (x)")
    con.commit()
    con.close()
    notes: list[str] = []
    got = list(RocpdImporter().import_ranks(tmp_path, note=notes.append))
    assert [r for r, _t, _m in got] == [0] and any("b.db" in n and "no rocpd" in n for n in notes)
