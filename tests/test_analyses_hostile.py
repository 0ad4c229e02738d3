"""The ops, ranges, sequences, gemm and critical_path tools on damaged event tables (as a corrupted
store or a foreign trace can give): cycles in op parents, ids far outside any array, duplicate
and missing correlations, negative durations, null names and streams.  Each tool must return a
Report (numbers may be partial), never raise or allocate by an id's value."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import pastaprof

TOOLS = ["ops", "ranges", "sequences", "gemm", "critical_path"]


@pytest.fixture(scope="module")
def run():
    return pastaprof.load(pastaprof.example_path())


def _damage(t: pa.Table, rng: np.random.Generator) -> pa.Table:
    n = t.num_rows
    if n == 0:
        return t
    cols = dict(zip(t.column_names, t.columns))
    for name in ("id", "parent_id", "op_id", "correlation"):
        if name in cols:
            v = pc.fill_null(cols[name], -1).to_numpy(zero_copy_only=False).astype(np.int64).copy()
            pick = rng.random(n) < 0.2
            v[pick] = rng.choice([-1, 0, 1, 3 * 10**17, int(v.max(initial=0))], pick.sum())
            if name == "parent_id":
                v[:5] = np.arange(5)  # self-parent cycles
            cols[name] = pa.array(v, t.schema.field(name).type, mask=v == -1)
    s = cols["start_ns"].to_numpy().copy()
    e = cols["end_ns"].to_numpy().copy()
    flip = rng.random(n) < 0.05
    e[flip] = s[flip] - 1000  # negative durations
    cols["end_ns"] = pa.array(e, pa.int64())
    if "stream" in cols:
        st = cols["stream"].to_numpy(zero_copy_only=False).astype(np.float64)
        cols["stream"] = pa.array(np.nan_to_num(st, nan=-1).astype(np.int64), pa.int64(), mask=rng.random(n) < 0.1)
    if "name" in cols:
        mask = rng.random(n) < 0.05
        cols["name"] = pc.if_else(pa.array(mask), pa.scalar(None, pa.string()), cols["name"].cast(pa.string()))
    if "input_shapes" in cols:
        junk = pa.array(rng.choice(["[[1e999,2],[2,3]]", "[[-4,8],[8,2]]", "{", "[[8,8],[8]]"], n))
        cols["input_shapes"] = pc.if_else(pa.array(rng.random(n) < 0.3), junk, cols["input_shapes"].cast(pa.string()))
    return pa.table(cols)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_damaged_tables_give_reports(run, seed):
    from pastaprof.store.run import Run

    rng = np.random.default_rng(seed)
    tables = {k: _damage(run.table(k), rng) for k in ("op", "api", "kernel", "memcpy", "memset", "range")}
    damaged = Run(run.manifest, tables=tables)
    reps = pastaprof.analyze(damaged, tools=TOOLS)
    assert [r.tool for r in reps] == TOOLS
    for r in reps:
        for f in r.findings:
            assert f.impact_ns is None or f.impact_ns >= 0


def test_empty_run_gives_one_line_notes():
    from pastaprof.store.run import Run

    reps = pastaprof.analyze(Run({}, tables={}), tools=TOOLS)
    for r in reps:
        assert not r.findings
    notes = {r.tool: r.summary.get("note") for r in reps}
    for tool in ("ranges", "sequences", "gemm", "critical_path"):
        assert notes[tool] and "\n" not in notes[tool], (tool, notes[tool])


def test_a_window_holding_only_the_free_of_an_earlier_block(tmp_path):
    """A trace whose only allocator event frees a block allocated before the trace began (the
    fuzzer's case 202612:1095): no device has a peak, and the memory report still has every
    table, its category table with its columns and no rows (was a KeyError on device_type)."""
    import gzip
    import json

    from conftest import DATA

    doc = json.loads(gzip.decompress((DATA / "mlp_train_3steps.pt.trace.json.gz").read_bytes()))
    mem = [e for e in doc["traceEvents"] if e.get("name") == "[memory]"]
    free = next(e for e in mem if e["args"]["Bytes"] < 0)
    free["args"]["Total Allocated"] = 0  # the program's only block before the trace: nothing left after it
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("name") != "[memory]"] + [free]
    path = tmp_path / "free_only.json"
    path.write_text(json.dumps(doc))
    (rep,) = pastaprof.analyze(path, ["memory"])
    (dev,) = rep.tables["devices"].to_pylist()
    assert (dev["alloc_events"], dev["free_events"], dev["peak_bytes"], dev["end_bytes"]) == (0, 1, 0, 0)
    assert dev["pretrace_freed_bytes"] == -free["args"]["Bytes"]
    cat = rep.tables["peak_by_category"]
    assert cat.num_rows == 0 and {"rank", "device", "device_type", "category", "bytes"} <= set(cat.column_names)
    assert rep.summary["peak_by_category"] == {}
