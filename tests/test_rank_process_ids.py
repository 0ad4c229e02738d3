"""Op ids of a live rank recorded by several processes: each process numbers its ops (one
counter per process -- a forked child, a DataLoader worker, goes on from its parent's count
at the fork as the parent does; a spawned child of the same rank starts at 1 again), so the
stored rank had ids twice and the tools, which match ops by (rank, id), took parents from the
other process.  Compaction (store/compact.py) now shifts every later process's op ids -- and
every column that refers to them -- past the earlier processes' (processor/link.py
``RankLinker.process_shifts``, ``shift_op_ids``).

Before: a program that forks with torch ops in both processes stored 1503 ops with 1003
distinct ids, 800 parent_ids named an op of the other pid, and the ops tool gave ``(no
module)`` 2.24 ms of self CPU time in 1.83 ms of inclusive time.

The independent reference: each pid's ops analysed alone (their ids are unique within it)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import pastaprof
from pastaprof.processor.link import RankLinker, shift_op_ids
from pastaprof.store.compact import compact
from pastaprof.store.parts import write_part
from pastaprof.store.run import Run

PROGRAM = textwrap.dedent("""
    import os, sys, multiprocessing as mp
    import torch

    def work(n):
        m = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        x = torch.randn(8, 16)
        for _ in range(n):
            m(x).sum()

    if __name__ == "__main__":
        torch.set_num_threads(1)
        work(20)
        if "spawn" in sys.argv[1:]:  # a child of the same rank whose ids start at 1 again
            p = mp.get_context("spawn").Process(target=work, args=(15,))
            p.start(); work(10); p.join()
        pid = os.fork()  # the child goes on from the parent's count, as the parent does
        if pid == 0:
            work(30)
            os._exit(0)
        work(25)
        os.waitpid(pid, 0)
""")


def _record(tmp_path: Path, *args: str) -> Path:
    prog = tmp_path / "prog.py"
    prog.write_text(PROGRAM)
    out = tmp_path / "run"
    env = dict(os.environ, PASTAPROF_FLUSH_MS="200")
    r = subprocess.run([sys.executable, "-m", "pastaprof.cli", "run", "-o", str(out), "--", sys.executable,
                        str(prog), *args], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    return out


def _ops_report(run: Run) -> dict[str, pa.Table]:
    (rep,) = pastaprof.analyze(run, tools=["ops"])
    return rep.tables


@pytest.mark.parametrize("args", [(), ("spawn",)], ids=["fork", "fork+spawn"])
def test_processes_of_a_rank_get_distinct_op_ids(tmp_path, args):
    pytest.importorskip("torch")
    run = pastaprof.load(_record(tmp_path, *args))
    op = run.table("op")
    pids = sorted(set(op["pid"].to_pylist()))
    assert len(pids) == (3 if args else 2)
    for rank in set(op["rank"].to_pylist()):
        ids = op.filter(pc.equal(op["rank"], rank))["id"].to_pylist()
        assert None not in ids and len(set(ids)) == len(ids), "op ids repeat within a rank"
    # every parent is an op of the same process; live ops keep external_id == id
    rows = op.select(["rank", "pid", "id", "parent_id", "external_id"]).to_pylist()
    by_id = {(r["rank"], r["id"]): r for r in rows}
    with_parent = [r for r in rows if r["parent_id"] is not None]
    assert with_parent
    for r in with_parent:
        parent = by_id.get((r["rank"], r["parent_id"]))
        assert parent is not None and parent["pid"] == r["pid"]
    assert all(r["external_id"] == r["id"] for r in rows)

    tables = _ops_report(run)
    for name in ("ops", "modules"):
        for row in tables[name].to_pylist():
            assert row["self_cpu_ns"] <= row["cpu_ns"], (name, row)
    # the reference: each process's ops analysed on their own
    want_self: Counter = Counter()
    want_cpu: Counter = Counter()
    for pid in pids:
        alone = Run(run.manifest, tables={"op": op.filter(pc.equal(op["pid"], pid))})
        for row in _ops_report(alone)["ops"].to_pylist():
            want_self[row["name"]] += row["self_cpu_ns"]
            want_cpu[row["name"]] += row["cpu_ns"]
    got = {r["name"]: r for r in tables["ops"].to_pylist()}
    assert {n: r["self_cpu_ns"] for n, r in got.items()} == dict(want_self)
    assert {n: r["cpu_ns"] for n, r in got.items()} == dict(want_cpu)


def _ops(pid: int, ids: list[int | None], parents: list[int | None], t0: int) -> pa.Table:
    n = len(ids)
    return pa.table({"start_ns": pa.array([t0 + 10 * i for i in range(n)], pa.int64()),
                     "end_ns": pa.array([t0 + 10 * i + 5 for i in range(n)], pa.int64()),
                     "rank": pa.array([0] * n, pa.int32()), "pid": pa.array([pid] * n, pa.int64()),
                     "tid": pa.array([1] * n, pa.int64()), "name": pa.array(["aten::x"] * n),
                     "id": pa.array(ids, pa.int64()), "parent_id": pa.array(parents, pa.int64()),
                     "external_id": pa.array(ids, pa.int64())})


def _calls(pid: int, op_ids: list[int | None], t0: int) -> pa.Table:
    n = len(op_ids)
    return pa.table({"start_ns": pa.array([t0 + i for i in range(n)], pa.int64()),
                     "end_ns": pa.array([t0 + i + 1 for i in range(n)], pa.int64()),
                     "rank": pa.array([0] * n, pa.int32()), "pid": pa.array([pid] * n, pa.int64()),
                     "correlation": pa.array(range(n), pa.int64()), "name": pa.array(["cudaLaunchKernel"] * n),
                     "op_id": pa.array(op_ids, pa.int64())})


def test_compaction_shifts_every_op_id_column_of_later_processes(tmp_path):
    """Synthetic parts: two processes with the same ids; the later one's op ids, parent ids
    and the op_id of its API calls follow the earlier one's; the earlier keeps its own."""
    d = tmp_path / "run"
    d.mkdir()
    write_part(d / "op" / "rank-0-pid-100-part-00000.parquet", _ops(100, [1, 2, 3], [None, 1, 1], 1_000))
    write_part(d / "op" / "rank-0-pid-200-part-00000.parquet", _ops(200, [1, 2, 3], [None, 1, None], 2_000))
    # unreadable as ops (a null id): left out, as before, without upsetting the others
    write_part(d / "op" / "rank-0-pid-400-part-00000.parquet", _ops(400, [None], [None], 500))
    write_part(d / "op" / "rank-0-pid-300-part-00000.parquet", _ops(300, [], [], 3_000))  # an empty part
    write_part(d / "api" / "rank-0-pid-100-part-00000.parquet", _calls(100, [2, None], 1_000))
    write_part(d / "api" / "rank-0-pid-200-part-00000.parquet", _calls(200, [2, 1], 2_000))
    m = compact(d)
    assert m["rows"]["op"] == 6
    run = pastaprof.load(d)
    op = sorted(run.table("op").select(["pid", "id", "parent_id", "external_id"]).to_pylist(),
                key=lambda r: (r["pid"], r["id"]))
    assert [(r["pid"], r["id"], r["parent_id"], r["external_id"]) for r in op] == [
        (100, 1, None, 1), (100, 2, 1, 2), (100, 3, 1, 3),
        (200, 4, None, 4), (200, 5, 4, 5), (200, 6, None, 6)]
    api = sorted(run.table("api").select(["pid", "op_id"]).to_pylist(), key=lambda r: (r["pid"], str(r["op_id"])))
    assert [(r["pid"], r["op_id"]) for r in api] == [(100, 2), (100, None), (200, 4), (200, 5)]


def test_one_process_is_stored_as_written(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    part = d / "op" / "rank-0-pid-100-part-00000.parquet"
    write_part(part, _ops(100, [1, 2, 3], [None, 1, 1], 1_000))
    written = part.read_bytes()
    compact(d)
    assert (d / "op" / "rank-0.parquet").read_bytes() == written


def test_process_shifts_on_odd_input():
    empty = _ops(1, [], [], 0)
    assert RankLinker.process_shifts({}) == {}
    assert RankLinker.process_shifts({1: [_ops(1, [1, 2], [None, 1], 0)]}) == {}
    assert RankLinker.process_shifts({1: [empty], 2: [_ops(2, [None], [None], 5)]}) == {}
    # ids that already follow the earlier process's: not shifted
    assert RankLinker.process_shifts({1: [_ops(1, [1, 2], [None, 1], 0)], 2: [_ops(2, [3, 4], [None, 3], 50)]}) == {}
    # order by first op: the later-starting process is shifted, whatever its pid
    got = RankLinker.process_shifts({9: [_ops(9, [5, 6], [None, 5], 0)], 2: [_ops(2, [1, 7], [None, 1], 100)]})
    assert got == {2: 6}
    assert shift_op_ids("op", empty, 5).equals(empty)
    assert shift_op_ids("tensor", pa.table({"x": [1]}), 5).equals(pa.table({"x": [1]}))
    t = shift_op_ids("kernel", pa.table({"op_id": pa.array([None, 3], pa.int64())}), 10)
    assert t["op_id"].to_pylist() == [None, 13]


def _gpu(pid: int, kind: str, corrs: list[int], t0: int, op_ids: list[int | None] | None = None) -> pa.Table:
    n = len(corrs)
    cols = {"start_ns": pa.array([t0 + 10 * i for i in range(n)], pa.int64()),
            "end_ns": pa.array([t0 + 10 * i + 5 for i in range(n)], pa.int64()),
            "rank": pa.array([0] * n, pa.int32()), "pid": pa.array([pid] * n, pa.int64()),
            "correlation": pa.array(corrs, pa.int64()),
            "name": pa.array(["cudaLaunchKernel" if kind == "api" else "k"] * n)}
    if op_ids is not None:
        cols["op_id"] = pa.array(op_ids, pa.int64())
    return pa.table(cols)


def test_compaction_makes_correlation_ids_of_a_ranks_processes_unique(tmp_path):
    """Two CUDA processes of one rank (a shell script's two programs, a launcher's children without
    RANK): CUPTI numbers each one's launches from 1, and every tool joins a kernel to its launch
    call on (rank, correlation).  The later process's correlation ids -- of its calls, kernels,
    syncs and external-correlation records alike -- follow the earlier one's, so each kernel
    joins its own process's call; the earlier process keeps its ids.  Before, the 3 kernels of
    pid 200 joined pid 100's calls."""
    d = tmp_path / "run"
    d.mkdir()
    write_part(d / "op" / "rank-0-pid-200-part-00000.parquet", _ops(200, [1, 2], [None, None], 2_000))
    for pid, t0 in ((100, 1_000), (200, 2_000)):
        write_part(d / "api" / f"rank-0-pid-{pid}-part-00000.parquet", _gpu(pid, "api", [1, 2, 3], t0))
        write_part(d / "kernel" / f"rank-0-pid-{pid}-part-00000.parquet",
                   _gpu(pid, "kernel", [1, 2, 3], t0 + 3, [None, None, None]))
        write_part(d / "sync" / f"rank-0-pid-{pid}-part-00000.parquet", _gpu(pid, "sync", [3], t0 + 50))
    # pid 200's launch correlation -> op records (kernels 1 and 3 ran under its ops 1 and 2)
    write_part(d / "_external" / "rank-0-pid-200-part-00000.parquet",
               pa.table({"pid": pa.array([200, 200], pa.int64()), "correlation": pa.array([1, 3], pa.int64()),
                         "external_id": pa.array([1, 2], pa.int64())}))
    compact(d)
    run = pastaprof.load(d)
    got = {k: sorted((r["pid"], r["correlation"]) for r in run.table(k).select(["pid", "correlation"]).to_pylist())
           for k in ("api", "kernel", "sync")}
    assert got["api"] == got["kernel"] == [(100, 1), (100, 2), (100, 3), (200, 4), (200, 5), (200, 6)]
    assert got["sync"] == [(100, 3), (200, 6)]
    k = {r["correlation"]: r["op_id"] for r in run.table("kernel").select(["correlation", "op_id"]).to_pylist()}
    assert k == {1: None, 2: None, 3: None, 4: 1, 5: None, 6: 2}
    # the join every tool makes: each kernel's call is of its own process
    api = {(r["rank"], r["correlation"]): r["pid"] for r in run.table("api").to_pylist()}
    assert all(api[(r["rank"], r["correlation"])] == r["pid"] for r in run.table("kernel").to_pylist())


def test_an_exec_d_process_image_gets_ids_after_the_earlier_images(tmp_path):
    """A captured Python program that execs another: the same pid, and the new image numbers its
    ops from 1 again.  Its parts (after the earlier image's: the shard's ``first_part``) are
    taken as another process's, so every op id is unique and every parent contains its child.
    Before: 83 ops with 45 distinct ids."""
    pytest.importorskip("torch")
    (tmp_path / "b.py").write_text("import torch\nx = torch.randn(8, 8)\nfor _ in range(7):\n    x = (x + 1).sigmoid()\n")
    (tmp_path / "a.py").write_text(textwrap.dedent(f"""
        import os, sys, torch
        x = torch.randn(8, 8)
        for _ in range(5):
            x = (x @ x).relu()
        os.execv(sys.executable, [sys.executable, {str(tmp_path / "b.py")!r}])
    """))
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "pastaprof.cli", "run", "-o", str(out), "--", sys.executable,
                        str(tmp_path / "a.py")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    op = pastaprof.load(out).table("op").to_pylist()
    assert len({o["pid"] for o in op}) == 1
    names = Counter(o["name"] for o in op)
    assert names["aten::matmul"] == 5 and names["aten::sigmoid"] == 7
    by_id = {o["id"]: o for o in op}
    assert len(by_id) == len(op)
    for o in op:
        if o["parent_id"] is not None:
            p = by_id[o["parent_id"]]
            assert p["start_ns"] <= o["start_ns"] and o["end_ns"] <= p["end_ns"], (p["name"], o["name"])


def test_correlation_shifts_survive_damaged_and_foreign_parts(tmp_path):
    """Parts a hostile run directory may hold beside good ones: correlation ids as text, out of
    CUPTI's range, external-correlation records with other columns or types.  Compaction raises
    nothing, and the good processes' ids are still made unique."""
    d = tmp_path / "run"
    d.mkdir()
    for pid, t0 in ((100, 1_000), (200, 2_000)):
        write_part(d / "api" / f"rank-0-pid-{pid}-part-00000.parquet", _gpu(pid, "api", [1, 2, 3], t0))
        write_part(d / "kernel" / f"rank-0-pid-{pid}-part-00000.parquet", _gpu(pid, "kernel", [1, 2, 3], t0 + 3))
    text = _gpu(300, "kernel", [1], 3_000).set_column(4, "correlation", pa.array(["x"]))
    write_part(d / "kernel" / "rank-0-pid-300-part-00000.parquet", text)
    write_part(d / "api" / "rank-0-pid-400-part-00000.parquet", _gpu(400, "api", [1 << 62], 4_000))
    write_part(d / "_external" / "rank-0-pid-200-part-00001.parquet",
               pa.table({"pid": pa.array(["200"]), "correlation": pa.array([1]), "external_id": pa.array([1])}))
    write_part(d / "_external" / "rank-0-pid-200-part-00002.parquet",
               pa.table({"pid": pa.array([200], pa.int32()), "correlation": pa.array([2], pa.uint64()),
                         "external_id": pa.array([9]), "extra": pa.array([0.5])}))
    compact(d)
    run = pastaprof.load(d)
    k = sorted((r["pid"], r["correlation"]) for r in run.table("kernel").select(["pid", "correlation"]).to_pylist())
    assert [x for x in k if x[0] in (100, 200)] == [(100, 1), (100, 2), (100, 3), (200, 4), (200, 5), (200, 6)]


def test_a_sanitizer_only_process_gets_correlation_ids_of_its_own(tmp_path):
    """A process of the rank whose only GPU rows are the sanitizer's (its launches numbered from 1
    too): its access rows follow the CUPTI process's ids, so no access joins another's kernel."""
    d = tmp_path / "run"
    d.mkdir()
    write_part(d / "kernel" / "rank-0-pid-100-part-00000.parquet", _gpu(100, "kernel", [1, 2, 3], 1_000))
    write_part(d / "access_launch" / "rank-0-pid-200-part-00000.parquet", _gpu(200, "access_launch", [1, 2], 2_000))
    compact(d)
    run = pastaprof.load(d)
    assert sorted(run.table("access_launch")["correlation"].to_pylist()) == [4, 5]
    assert sorted(run.table("kernel")["correlation"].to_pylist()) == [1, 2, 3]
