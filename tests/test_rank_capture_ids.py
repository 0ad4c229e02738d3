"""Op ids of a rank read from several capture files (a profiler ``schedule`` with
``tensorboard_trace_handler`` writes one file per cycle): each file is linked on its own and
its ops numbered after the earlier files' (processor/link.py ``RankLinker``), by every path
that joins them -- load, import (then analyze of the stored run), and analyze of the folder.

Numbering each file from 0 gave the joined rank every id twice (cpu_tb_2cycles: 436 ops, 218
ids), and the ops tool then took parents from the other file: ``evaluate_function:
AddmmBackward0`` got 195.2 ms of self CPU time against 0.36 ms with each file analysed on its
own, and the module ``(no module)`` 981 ms of self time in 529 ms of inclusive time.

The independent reference: every file analysed alone, as a trace of its own."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from conftest import DATA

import pastaprof

FOLDERS = [DATA / "ranks" / "cpu_tb_2cycles", DATA / "recorded" / "tb_schedule"]
IDS = [f.name for f in FOLDERS]
PY = [sys.executable, "-m", "pastaprof.cli"]


def _cli(*args: str) -> None:
    r = subprocess.run([*PY, *args], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def _ops_tables(path: Path, tmp: Path) -> dict[str, list[dict]]:
    """``pastaprof analyze -t ops --json`` of ``path``: its tables, as JSON rows."""
    out = tmp / f"ops-{len(list(tmp.iterdir()))}.json"
    _cli("analyze", str(path), "-t", "ops", "-q", "--json", str(out))
    return json.loads(out.read_text())["tools"]["ops"]["tables"]


def _per_file(folder: Path, column: str) -> Counter:
    """Per op name: ``column`` of the ops table summed over the folder's files analysed alone."""
    total: Counter = Counter()
    for f in sorted(folder.iterdir()):
        (rep,) = pastaprof.analyze(f, tools=["ops"])
        for row in rep.tables["ops"].to_pylist():
            total[row["name"]] += row[column] or 0
    return total


def _linked(run, kind: str) -> list[tuple]:
    """Per row of ``kind`` (in correlation order): its correlation and the (name, start, end)
    of the op its op_id names, or None."""
    return [tuple(r) for r in run.sql(f"""
        SELECT k.correlation, CAST(o.name AS VARCHAR), o.start_ns, o.end_ns
        FROM {kind} k LEFT JOIN op o ON o.id = k.op_id AND o.rank = k.rank
        ORDER BY k.correlation, k.start_ns""").fetchall()]


def _check_ids(run) -> None:
    """Op ids unique per rank; every parent_id and op_id names an op of the rank."""
    n, distinct = run.sql("SELECT count(*), count(DISTINCT (rank, id)) FROM op").fetchall()[0]
    assert n > 100 and distinct == n
    orphans = run.sql("""SELECT count(*) FROM op c WHERE c.parent_id IS NOT NULL AND NOT EXISTS
                         (SELECT 1 FROM op p WHERE p.id = c.parent_id AND p.rank = c.rank)""").fetchall()[0][0]
    assert orphans == 0
    for kind in ("kernel", "api"):
        if run.table(kind).num_rows:
            dangling = run.sql(f"""SELECT count(*) FROM {kind} k WHERE k.op_id IS NOT NULL AND NOT EXISTS
                                   (SELECT 1 FROM op o WHERE o.id = k.op_id AND o.rank = k.rank)""").fetchall()[0][0]
            assert dangling == 0


@pytest.mark.parametrize("folder", FOLDERS, ids=IDS)
def test_op_ids_unique_per_rank_and_links_stay_in_their_file(folder, tmp_path):
    """Load and ``pastaprof import``: one rank, unique op ids, and each kernel's and API
    call's op the one it has with its file loaded alone (same name and times)."""
    _cli("import", str(folder), "-o", str(tmp_path / "run"))
    alone = [pastaprof.load(f) for f in sorted(folder.iterdir())]
    for run in (pastaprof.load(folder), pastaprof.load(tmp_path / "run")):
        assert run.ranks == [0]
        _check_ids(run)
        assert run.sql("SELECT count(*) FROM op").fetchall()[0][0] == sum(a.table("op").num_rows for a in alone)
        for kind in ("kernel", "api"):
            if not run.table(kind).num_rows:
                continue
            want = sorted(row for a in alone for row in _linked(a, kind))
            got = _linked(run, kind)
            assert len({r[0] for r in got}) == len(got)  # correlations go on across the cycles
            assert got == want and any(r[1] is not None for r in got)


@pytest.mark.parametrize("folder", FOLDERS, ids=IDS)
def test_self_cpu_of_joined_captures_is_the_sum_over_files(folder, tmp_path):
    """Per op name, self CPU time (and kernels, GPU time) equals the sum over the files analysed
    alone, and self time never exceeds inclusive time (op and module rows) -- for ``analyze`` of
    the folder, of the run ``pastaprof import`` stored, and of the run ``analyze -o`` stored."""
    (tmp_path / "json").mkdir()
    want = {c: _per_file(folder, c) for c in ("self_cpu_ns", "cpu_ns", "kernels", "self_gpu_ns", "gpu_ns")}
    _cli("import", str(folder), "-o", str(tmp_path / "imported"))
    _cli("analyze", str(folder), "-t", "ops", "-q", "-o", str(tmp_path / "stored"))
    for path in (folder, tmp_path / "imported", tmp_path / "stored"):
        tables = _ops_tables(path, tmp_path / "json")
        by_name = {r["name"]: r for r in tables["ops"]}
        assert set(by_name) == set(want["self_cpu_ns"]), path
        for column, total in want.items():
            assert {n: by_name[n][column] or 0 for n in total} == dict(total), (path, column)
        for r in tables["ops"] + tables["modules"]:
            assert r["self_cpu_ns"] <= r["cpu_ns"], (path, r)
    # per op, too (the tool's details)
    (rep,) = pastaprof.analyze(folder, tools=["ops"])
    per_op = rep.details["per op"]
    assert all(s <= c for s, c in zip(per_op["self_cpu_ns"].to_pylist(), per_op["cpu_ns"].to_pylist()))


def test_two_profiler_sessions_of_one_process_keep_their_steps_and_launches(tmp_path):
    """A process that opens ``torch.profiler.profile()`` twice: each session restarts
    ``ProfilerStep#N``, and its launches may be numbered from where the first's were.  The
    real GPU trace twice, the second 10 s later (tensorboard names of one pid): every step of
    both sessions is a step of its own with the kernels it has alone, correlation ids are
    unique in the rank, and each kernel joins the launch of its own session."""
    import gzip

    src = DATA / "mlp_train_3steps.pt.trace.json.gz"
    doc = json.loads(gzip.decompress(src.read_bytes()))
    for i, shift_us in enumerate((0, 10_000_000)):  # the second file: the first's events 10 s later
        for e in doc["traceEvents"]:
            if isinstance(e.get("ts"), (int, float)):
                e["ts"] += shift_us
        (tmp_path / f"node_77.{1790000000000 + i}.pt.trace.json").write_text(json.dumps(doc))
    (alone,) = pastaprof.analyze(src, tools=["steps"])
    (both,) = pastaprof.analyze(tmp_path, tools=["steps"])
    one = [(r["label"], r["kernels"]) for r in alone.tables["steps"].to_pylist()]
    assert len(one) == 3 and [(r["label"], r["kernels"]) for r in both.tables["steps"].to_pylist()] == one + one
    run = pastaprof.load(tmp_path)
    n, distinct = run.sql("SELECT count(*), count(DISTINCT correlation) FROM kernel").fetchall()[0]
    joined = run.sql("""SELECT count(*) FROM kernel k JOIN api a ON a.rank = k.rank AND a.correlation = k.correlation
                        AND a.start_ns <= k.start_ns AND k.start_ns - a.start_ns < 5e9""").fetchall()[0][0]
    assert n == 2 * pastaprof.load(src).table("kernel").num_rows and distinct == n and joined == n
