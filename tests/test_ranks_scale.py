"""The per-rank loops of the default tools cost each rank's rows once (tools/_by_rank.py), and a
rank's numbers in a job are the numbers of that rank analyzed alone.

Why the second check: the loops now take each rank's rows from one sort of the rank column
instead of a scan per rank; a slip there (rows of the wrong rank, rows out of order) shows as a
rank whose steps, memory or ops differ from the same trace read as a job of one.  The job is
built from the real 2-rank DDP trace in tests/data (H200, NCCL): rank r is a copy of rank r % 2
with ``distributedInfo.rank = r`` and its own host pid."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from conftest import DATA

import pastaprof
from pastaprof.tools._by_rank import rank_rows, rows_of_rank, take_rows

DDP = DATA / "ddp_mlp_2ranks"
RANKS = 4


def _shard(rank: int, world: int) -> dict:
    doc = json.load(gzip.open(DDP / f"rank-{rank % 2}.pt.trace.json.gz"))
    doc["distributedInfo"].update(rank=rank, world_size=world)
    host = next(e["pid"] for e in doc["traceEvents"] if e.get("cat") == "cpu_op")
    for e in doc["traceEvents"]:
        if e.get("pid") == host:
            e["pid"] = 100000 + rank
    return doc


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("job")
    (root / "job").mkdir()
    for r in range(RANKS):
        doc = _shard(r, RANKS)
        with gzip.open(root / "job" / f"rank-{r}.pt.trace.json.gz", "wt") as f:
            json.dump(doc, f)
        (root / f"alone-{r}").mkdir()
        with gzip.open(root / f"alone-{r}" / f"rank-{r}.pt.trace.json.gz", "wt") as f:
            json.dump(doc, f)
    return root


def _reports(path: Path) -> dict:
    return {r.tool: r for r in pastaprof.analyze(path, tools=["steps", "memory", "ops", "timeline", "copies"])}


def _rows(t: pa.Table, rank: int, drop: tuple[str, ...] = ()) -> list[dict]:
    mine = t.filter(pc.equal(t["rank"], rank))
    return mine.drop_columns([c for c in drop if c in mine.column_names]).to_pylist()


def test_each_rank_of_a_job_is_that_rank_read_alone(job):
    whole = _reports(job / "job")
    alone = {r: _reports(job / f"alone-{r}") for r in range(RANKS)}
    steps = whole["steps"].tables["steps"]
    assert sorted(set(steps["rank"].to_pylist())) == list(range(RANKS))
    for r in range(RANKS):
        one = alone[r]
        assert one["steps"].tables["steps"].num_rows >= 3  # the trace has steps to compare
        assert _rows(steps, r) == _rows(one["steps"].tables["steps"], r)
        for name in ("devices", "steps"):
            assert _rows(whole["memory"].tables[name], r) == _rows(one["memory"].tables[name], r), name
        assert _rows(whole["timeline"].tables["temporal"], r) == _rows(one["timeline"].tables["temporal"], r)
        per_op = whole["ops"].details["per op"]
        assert _rows(per_op, r) == _rows(one["ops"].details["per op"], r)
    # a rank's findings name it: the job has every rank's, as each rank alone has them
    for tool in ("steps", "memory"):
        titles = sorted(f.title for f in whole[tool].findings)
        assert titles == sorted(f.title for r in range(RANKS) for f in alone[r][tool].findings), tool
    calls = {r["name"]: r["calls"] for r in whole["ops"].tables["ops"].to_pylist()}
    summed: dict[str, int] = {}
    for r in range(RANKS):
        for row in alone[r]["ops"].tables["ops"].to_pylist():
            summed[row["name"]] = summed.get(row["name"], 0) + row["calls"]
    assert calls == summed and sum(calls.values()) > 1000


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rank_rows_are_the_rows_of_each_rank_in_order(seed):
    rng = np.random.default_rng(seed)
    ranks = rng.integers(-3, 40, size=5000).astype(np.int32 if seed % 2 else np.int64)
    if seed == 2:
        ranks.sort()
    by = rank_rows(ranks)
    assert by.ranks() == np.unique(ranks).tolist()
    for r in range(-5, 45):
        assert np.array_equal(by[r], np.flatnonzero(ranks == r))
        assert np.array_equal(by[np.int32(r)], np.flatnonzero(ranks == r))
    assert len(rank_rows(np.zeros(0, np.int32))[0]) == 0


def _chunked(ranks: list[int | None], chunk: int = 7) -> pa.Table:
    t = pa.table({"rank": pa.array(ranks, pa.int32()), "v": pa.array(np.arange(len(ranks)))})
    return pa.Table.from_batches(t.to_batches(max_chunksize=chunk))


@pytest.mark.parametrize("ranks", [
    [0] * 10 + [1] * 3 + [3] * 20 + [7],          # rank-sorted: slices
    [3, 1, 1, 0, 3, 2, 0, 0, 1, 3, 2] * 5,        # interleaved: filtered
    [0, 0, 1, None, 1, 2, 2, 2],                  # a null rank: filtered
])
def test_rows_of_rank_is_the_filter_of_that_rank(ranks):
    t = _chunked(ranks)
    for r in range(-1, 9):
        want = t.filter(pc.equal(t["rank"], r))
        for _ in range(2):  # the second call is served from the index
            assert rows_of_rank(t, r).to_pylist() == want.to_pylist()


def test_take_rows_is_take_and_slices_a_run():
    t = _chunked(list(range(100)), chunk=9)
    for rows in ([5, 6, 7, 8, 9, 10], [3, 5, 6], [9, 8, 7], [], [0, 2, 2, 3]):
        idx = np.array(rows, np.int64)
        assert take_rows(t, idx).to_pylist() == t.take(idx).to_pylist()
    assert take_rows(t, np.arange(20, 60)).num_rows == 40
