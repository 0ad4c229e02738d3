"""Engines: the per-rank map + combine, in this process and on a real Dask cluster.

The local engine and ``--engine dask`` run the same map and combine (engine/mapcombine.py),
so their reports must be equal: every table, every finding's id and impact, every summary.
The cluster is a real distributed.LocalCluster of two worker processes (one per test module);
the jobs are built from the real 2-rank DDP trace in tests/data.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import pastaprof
from pastaprof.api import analyze, import_trace
from pastaprof.engine.dask import _chunks
from pastaprof.errors import InputError, UsageError
from pastaprof.tools.base import Finding, PerRankTool, Report

DATA = Path(__file__).parent / "data"
DDP = DATA / "ddp_mlp_2ranks"
distributed = pytest.importorskip("distributed")


class GpuTimePerRank(PerRankTool):
    """A PerRankTool with an answer that is easy to compute independently: kernel count and
    summed kernel time per rank, the process that mapped it, and one finding for the
    rank with the most kernel time."""

    name = "gpu_time_per_rank"
    consumes = ("kernel",)

    def map_rank(self, rank: int, tables: dict[str, pa.Table]) -> dict[str, pa.Table]:
        k = tables["kernel"]
        ranks = set(k["rank"].to_pylist())
        assert ranks <= {rank}, f"map of rank {rank} saw rows of ranks {ranks}"
        dur = (k["end_ns"].to_numpy() - k["start_ns"].to_numpy()).sum() if k.num_rows else 0
        return {"rank": pa.table({"rank": [rank], "kernels": [k.num_rows], "kernel_ns": [int(dur)],
                                  "pid": [os.getpid()]})}

    def combine(self, summaries: dict[int, dict[str, pa.Table]]) -> Report:
        t = pa.concat_tables([s["rank"] for s in summaries.values()])
        top = int(np.argmax(t["kernel_ns"].to_numpy()))
        f = Finding("info", f"rank {t['rank'][top].as_py()} has the most kernel time",
                    {"kernel_ns": t["kernel_ns"][top].as_py()}, impact_ns=t["kernel_ns"][top].as_py())
        return Report(self.name, tables={"per_rank": t.drop_columns(["pid"])}, findings=[f],
                      summary={"ranks": list(summaries), "pids": sorted(set(t["pid"].to_pylist()))})


def _shard_job(root: Path, n: int) -> Path:
    """``n`` rank shards: copies of the two real DDP ranks with distributedInfo rank r, times
    shifted by r us, and rank r's kernels stretched by (1 + r/10) so ranks differ."""
    docs = [json.load(gzip.open(DDP / f"rank-{r}.pt.trace.json.gz")) for r in (0, 1)]
    root.mkdir(parents=True, exist_ok=True)
    for r in range(n):
        doc = json.loads(json.dumps(docs[r % 2]))
        doc["distributedInfo"].update(rank=r, world_size=n)
        for e in doc["traceEvents"]:
            if "ts" in e and e.get("ph") != "M":
                e["ts"] = round(float(e["ts"]) + r, 3)
            if e.get("cat") == "kernel" and "dur" in e:
                e["dur"] = round(float(e["dur"]) * (1 + r / 10), 3)
        with gzip.open(root / f"rank-{r}.pt.trace.json.gz", "wt") as f:
            json.dump(doc, f)
    return root


@pytest.fixture(scope="module")
def cluster():
    import logging

    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                      silence_logs=logging.ERROR) as c, Client(c) as client:
        pids = client.run(os.getpid)
        assert len(set(pids.values())) == 2 and os.getpid() not in pids.values()
        yield c.scheduler_address


@pytest.fixture(scope="module")
def job4(tmp_path_factory) -> Path:
    return _shard_job(tmp_path_factory.mktemp("job") / "job4", 4)


def _expected_kernel_ns(job: Path) -> dict[int, tuple[int, int]]:
    """Kernels and summed kernel time per rank, straight from the JSON (Kineto us -> ns)."""
    out = {}
    for p in sorted(job.glob("rank-*.json.gz")):
        doc = json.load(gzip.open(p))
        durs = [round(float(e["dur"]) * 1000) for e in doc["traceEvents"] if e.get("cat") == "kernel"]
        out[doc["distributedInfo"]["rank"]] = (len(durs), sum(durs))
    return out


def assert_same(a: list[Report], b: list[Report]) -> None:
    assert [r.tool for r in a] == [r.tool for r in b]
    for x, y in zip(a, b):
        assert list(x.tables) == list(y.tables), x.tool
        for name in x.tables:
            assert x.tables[name].equals(y.tables[name]), (x.tool, name)
        assert [(f.id, f.impact_ns, f.severity, f.title, f.location) for f in x.findings] == \
               [(f.id, f.impact_ns, f.severity, f.title, f.location) for f in y.findings], x.tool
        assert json.dumps([f.evidence for f in x.findings], default=str) == \
               json.dumps([f.evidence for f in y.findings], default=str), x.tool
        assert json.dumps(x.summary, default=str, sort_keys=True) == json.dumps(y.summary, default=str, sort_keys=True)


def test_per_rank_tool_maps_each_rank_once_and_keeps_no_batches(job4):
    tool = GpuTimePerRank()
    (rep,) = analyze(job4, tools=[tool])
    want = _expected_kernel_ns(job4)
    got = {r: (k, ns) for r, k, ns in zip(*(rep.tables["per_rank"][c].to_pylist()
                                            for c in ("rank", "kernels", "kernel_ns")))}
    assert rep.summary["ranks"] == list(range(4))
    assert set(got) == set(want)
    for r, (k, ns) in want.items():  # the importer rounds each kernel's start and end to ns
        assert got[r][0] == k and abs(got[r][1] - ns) <= k, (r, got[r], (k, ns))
    assert rep.findings[0].title == "rank 3 has the most kernel time"  # stretched most
    assert rep.summary["pids"] == [os.getpid()]
    assert all(not b for b in tool._batches.values())  # nothing of any rank held


def test_dask_equals_local_with_default_tools(job4, cluster):
    local = analyze(job4)
    dist = analyze(job4, engine="dask", scheduler=cluster)
    assert sum(len(r.findings) for r in local) > 0 and any(t.num_rows for r in local for t in r.tables.values())
    assert_same(local, dist)


def test_dask_runs_the_map_on_the_workers(job4, cluster):
    from distributed import Client

    with Client(cluster) as c:
        workers = set(c.run(os.getpid).values())
    (local,) = analyze(job4, tools=[GpuTimePerRank()])
    (dist,) = analyze(job4, tools=[GpuTimePerRank()], engine="dask", scheduler=cluster)
    assert set(dist.summary["pids"]) == workers  # 4 ranks in 4 chunks over 2 workers: both mapped
    local.summary.pop("pids"), dist.summary.pop("pids")
    assert_same([local], [dist])


def test_dask_equals_local_mixed_tools_and_rank_subset(job4, cluster):
    tools = ["steps", "kernels", "timeline"]
    for ranks in ([3, 1], [2]):
        a = analyze(job4, tools=[*tools, GpuTimePerRank()], ranks=ranks)
        b = analyze(job4, tools=[*tools, GpuTimePerRank()], ranks=ranks, engine="dask", scheduler=cluster)
        assert a[-1].summary["ranks"] == sorted(ranks)
        a[-1].summary.pop("pids"), b[-1].summary.pop("pids")
        assert_same(a, b)


def test_real_ddp_pair_and_run_dir_agree(cluster, tmp_path):
    """The real 2-rank trace; its run directory; both engines: four equal answers, and --out
    under dask stores the same rows as the local import."""
    trace_local = analyze(DDP)
    trace_dask = analyze(DDP, engine="dask", scheduler=cluster, out=tmp_path / "run_dask")
    assert_same(trace_local, trace_dask)
    run = import_trace(DDP, tmp_path / "run")
    assert_same(trace_local, analyze(run))
    assert_same(trace_local, analyze(run, engine="dask", scheduler=cluster))
    a = json.loads((tmp_path / "run" / "run.json").read_text())
    b = json.loads((tmp_path / "run_dask" / "run.json").read_text())
    assert a["rows"] == b["rows"] and a["ranks"] == b["ranks"] == [0, 1]
    assert sum(a["rows"].values()) > 1000


def test_run_in_memory_is_refused_by_dask_with_one_line(cluster):
    run = pastaprof.load(DDP)
    with pytest.raises(UsageError, match="not a Run in memory"):
        analyze(run, engine="dask", scheduler=cluster)
    assert_same(analyze(DDP), analyze(run))  # the local engine splits a Run in memory by rank


def test_bad_input_on_a_worker_is_one_input_error(cluster, tmp_path):
    job = _shard_job(tmp_path / "job", 3)
    (job / "rank-1.pt.trace.json.gz").write_bytes(gzip.compress(b'{"traceEvents": [{"ph": "X", "ts": '))
    with pytest.raises(InputError) as local:
        analyze(job)
    with pytest.raises(InputError) as dist:
        analyze(job, engine="dask", scheduler=cluster)
    assert str(dist.value) == str(local.value) and "rank-1" in str(dist.value)


def test_engine_options_are_checked_first():
    with pytest.raises(UsageError, match="unknown engine"):
        analyze(DDP, engine="spark")
    with pytest.raises(UsageError, match="--scheduler needs --engine dask"):
        analyze(DDP, scheduler="tcp://127.0.0.1:1")


def _cli(*args: str, pre: str = "") -> subprocess.CompletedProcess:
    code = f"{pre}import sys; from pastaprof.cli import cli; sys.argv = ['pastaprof', *{list(args)!r}]; cli()"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_cli_without_distributed_is_one_line_exit_2(tmp_path):
    r = _cli("analyze", str(DDP), "--engine", "dask", "-q", "--json", str(tmp_path / "f.json"),
             pre="import sys; sys.modules['distributed'] = None; ")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("pastaprof: error: --engine dask needs Dask distributed")
    assert not (tmp_path / "f.json").exists()


def test_cli_unreachable_scheduler_is_one_line_exit_2():
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = _cli("analyze", str(DDP), "--engine", "dask", "--scheduler", f"tcp://127.0.0.1:{port}", "-q")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "cannot reach the Dask scheduler" in r.stderr


def test_cli_engine_dask_local_cluster_json_equals_local(tmp_path):
    """The command line with its own LocalCluster (no --scheduler): the same JSON."""
    from pastaprof.report.findings import write_json

    a, b = tmp_path / "local.json", tmp_path / "dask.json"
    write_json(analyze(DDP), a, source=str(DDP))
    r2 = _cli("analyze", str(DDP), "-q", "--json", str(b), "--engine", "dask")
    assert r2.returncode == 0, r2.stderr
    assert a.read_text() == b.read_text()
    assert "error" not in r2.stderr.lower() and "traceback" not in r2.stderr.lower()


def test_chunks_cover_every_rank_once_in_order():
    for n_ranks in (1, 2, 7, 64, 1024):
        ranks = list(range(0, 3 * n_ranks, 3))
        for n in (1, 3, 8, 4096):
            cs = _chunks(ranks, n)
            assert [r for c in cs for r in c] == ranks and all(cs)
            assert len(cs) == min(n, n_ranks) and max(map(len, cs)) - min(map(len, cs)) <= 1


def test_ranks_only_known_once_read_go_to_one_task(cluster, tmp_path):
    """Files that state no rank (no distributedInfo, no rank-N name) get ranks by file order:
    the plan cannot be cut up front, so one task reads them all, with the same answer."""
    job = tmp_path / "anon"
    job.mkdir()
    for r, name in ((0, "a.pt.trace.json.gz"), (1, "b.pt.trace.json.gz")):
        doc = json.load(gzip.open(DDP / f"rank-{r}.pt.trace.json.gz"))
        doc.pop("distributedInfo")
        with gzip.open(job / name, "wt") as f:
            json.dump(doc, f)
    a = analyze(job, tools=["kernels", GpuTimePerRank()])
    b = analyze(job, tools=["kernels", GpuTimePerRank()], engine="dask", scheduler=cluster)
    assert a[1].summary["ranks"] == [0, 1]
    a[1].summary.pop("pids"), b[1].summary.pop("pids")
    assert_same(a, b)


def test_no_rank_selected_is_the_same_error(cluster, job4):
    for engine in ("local", "dask"):
        with pytest.raises(InputError, match="no trace matches the selected ranks"):
            analyze(job4, ranks=[99], engine=engine, scheduler=cluster if engine == "dask" else None)


class Broken(GpuTimePerRank):
    name = "broken_map"

    def map_rank(self, rank, tables):
        if rank == 2:
            raise ValueError("planted")
        return super().map_rank(rank, tables)


def test_a_tool_bug_in_map_rank_names_the_tool_and_rank(cluster, job4):
    for engine in ("local", "dask"):
        with pytest.raises(RuntimeError, match=r"tool 'broken_map': map_rank of rank 2 failed: planted"):
            analyze(job4, tools=[Broken()], engine=engine, scheduler=cluster if engine == "dask" else None)


def test_live_path_maps_the_ranks_at_the_end_with_the_same_answer(job4):
    """Batches that arrive without rank boundaries (pastaprof run) reach a PerRankTool's
    default report, which maps rank by rank: the same report as the engine's."""
    from pastaprof.processor.pipeline import Processor

    run = pastaprof.load(job4)
    proc = Processor([GpuTimePerRank()])
    k = run.table("kernel")
    for i in range(0, k.num_rows, 97):  # small batches, ranks interleaved as they arrive
        proc.submit("kernel", k.slice(i, 97))
    (live,) = proc.finish()
    (offline,) = analyze(job4, tools=[GpuTimePerRank()])
    assert_same([live], [offline])


def test_a_rank_mapped_twice_is_refused():
    from pastaprof.engine.mapcombine import Combiner, RankResult, plan

    tools = [GpuTimePerRank()]
    comb = Combiner(tools, plan(tools, store=False))
    comb.add(RankResult(3, [], {0: {}}))
    with pytest.raises(InputError, match="rank 3: was mapped twice"):
        comb.add(RankResult(3, [], {0: {}}))


def test_the_ranks_tool_is_the_same_on_both_engines(job4, cluster):
    """The ranks tool (a PerRankTool: clocks, collectives, stragglers across ranks)."""
    from pastaprof.tools.registry import available

    if "ranks" not in available():
        pytest.skip("no ranks tool installed")
    a = analyze(job4, tools=["ranks"])
    b = analyze(job4, tools=["ranks"], engine="dask", scheduler=cluster)
    assert a[0].tables and any(t.num_rows for t in a[0].tables.values())
    assert_same(a, b)
