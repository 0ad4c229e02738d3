"""The run store: Parquet per kind per rank + run.json, readable by every columnar tool."""

from __future__ import annotations

import json

import duckdb
import pyarrow.parquet as pq
import pytest
from conftest import DATA

import pastaprof
from pastaprof.events.schema import KINDS, SCHEMA_VERSION


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "ddp"
    pastaprof.import_trace(DATA / "ddp_mlp_2ranks", out)
    return out


def test_layout_and_manifest(stored):
    m = json.loads((stored / "run.json").read_text())
    assert m["schema_version"] == SCHEMA_VERSION
    assert m["ranks"] == [0, 1]
    for key in ("command", "host", "devices", "versions", "clock", "capture_overhead", "dropped_events"):
        assert key in m
    assert m["devices"][0]["name"] == "NVIDIA H200"
    assert (stored / "kernel" / "rank-0.parquet").exists() and (stored / "kernel" / "rank-1.parquet").exists()
    assert not list(stored.parent.glob(".*partial*"))


def test_store_round_trips_the_import(stored):
    mem = pastaprof.load(DATA / "ddp_mlp_2ranks")
    disk = pastaprof.load(stored)
    for kind in KINDS:
        a, b = mem.table(kind), disk.table(kind)
        assert a.num_rows == b.num_rows, kind
        if a.num_rows:
            assert a.sort_by([("rank", "ascending"), ("start_ns", "ascending")]).equals(
                b.sort_by([("rank", "ascending"), ("start_ns", "ascending")])), kind


def test_readable_by_duckdb_pyarrow_pandas_polars(stored):
    polars = pytest.importorskip("polars")
    run = pastaprof.load(stored)
    n, total = run.sql("select count(*), sum(end_ns - start_ns) from kernel").fetchall()[0]
    t = run.table("kernel")
    assert n == t.num_rows
    direct = duckdb.sql(f"select count(*), sum(end_ns - start_ns) from read_parquet('{stored}/kernel/*.parquet')").fetchall()[0]
    assert direct == (n, total)
    assert pq.read_table(stored / "kernel" / "rank-0.parquet").num_rows + pq.read_table(
        stored / "kernel" / "rank-1.parquet").num_rows == n
    assert len(run.to_pandas("kernel")) == n
    assert polars.read_parquet(stored / "kernel" / "rank-0.parquet").height == run.sql(
        "select count(*) from kernel where rank = 0").fetchall()[0][0]


def test_analyze_gives_same_answers_live_and_offline(stored):
    """The same tool code on the imported trace and on the stored run."""
    a = pastaprof.analyze(DATA / "ddp_mlp_2ranks", tools=["kernels"])[0]
    b = pastaprof.analyze(stored, tools=["kernels"])[0]
    assert a.summary == b.summary
    assert a.tables["kernels"].equals(b.tables["kernels"])


def test_store_is_much_smaller_than_the_json(tmp_path):
    import gzip

    src = pastaprof.example_path()
    raw_size = len(gzip.decompress(src.read_bytes()))
    out = pastaprof.import_trace(src, tmp_path / "ex")
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    assert size * 10 <= raw_size


def test_existing_output_is_not_clobbered(stored):
    with pytest.raises(pastaprof.UsageError):
        pastaprof.import_trace(DATA / "ddp_mlp_2ranks", stored)


def test_analyze_a_loaded_run_for_some_ranks(stored):
    for run in (pastaprof.load(stored), pastaprof.load(DATA / "ddp_mlp_2ranks")):
        both = pastaprof.analyze(run, tools=["kernels"])[0].summary["kernels"]
        one = pastaprof.analyze(run, tools=["kernels"], ranks=[1])[0].summary["kernels"]
        assert one == run.sql("select count(*) from kernel where rank = 1").fetchall()[0][0]
        assert 0 < one < both
