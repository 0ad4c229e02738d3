"""The Kineto importer against the raw JSON of real traces: totals, links, ranks."""

from __future__ import annotations

import collections

import pyarrow.compute as pc
import pytest
from conftest import DATA, FOREIGN, dur_ns, raw_events

import pastaprof


def _sum_dur(t) -> int:
    return int(pc.sum(pc.subtract(t["end_ns"], t["start_ns"])).as_py() or 0)


def test_kernel_memcpy_memset_totals_equal_the_trace(trace):
    raw = raw_events(trace)
    run = pastaprof.load(trace)
    for cat, kind in (("kernel", "kernel"), ("gpu_memcpy", "memcpy"), ("gpu_memset", "memset")):
        evs = [e for e in raw if e.get("cat") == cat and e.get("ph") == "X"]
        t = run.table(kind)
        assert t.num_rows == len(evs), kind
        assert _sum_dur(t) == sum(dur_ns(e) for e in evs), kind
    ops = [e for e in raw if e.get("cat") == "cpu_op"]
    assert run.table("op").num_rows == len(ops)
    mem = [e for e in raw if e.get("name") == "[memory]"]
    assert run.table("tensor").num_rows == len(mem)
    assert int(pc.sum(run.table("tensor")["bytes"]).as_py() or 0) == sum(e["args"]["Bytes"] for e in mem)


def test_start_times_are_unix_epoch_ns_exactly(example_run):
    raw = [e for e in raw_events(pastaprof.example_path()) if e.get("cat") == "kernel"]
    base = 1790857026000000000  # the trace's baseTimeNanoseconds
    first = min(raw, key=lambda e: float(e["ts"]))
    # decimal string arithmetic, no float rounding
    whole, frac = repr(first["ts"]).split(".")
    expect = base + int(whole) * 1000 + int(frac.ljust(3, "0")[:3])
    assert pc.min(example_run.table("kernel")["start_ns"]).as_py() == expect


def test_every_kernel_links_to_the_op_kineto_recorded(trace):
    """Kineto stamps each kernel with the External id of the op that launched it:
    our op_id must point at exactly that op, for every kernel that has one."""
    raw = raw_events(trace)
    ext_of_kernel = {e["args"]["correlation"]: e["args"].get("External id") for e in raw
                     if e.get("cat") == "kernel"}
    run = pastaprof.load(trace)
    k = run.table("kernel").to_pydict()
    op = run.table("op")
    ext_by_id = dict(zip(op["id"].to_pylist(), op["external_id"].to_pylist()))
    op_exts = set(ext_by_id.values())
    checked = 0
    for corr, op_id in zip(k["correlation"], k["op_id"]):
        want = ext_of_kernel[corr]
        if want in op_exts:
            assert op_id is not None and ext_by_id[op_id] == want
            checked += 1
    assert checked >= 0.9 * len(k["correlation"])


def test_op_gpu_time_equals_sum_of_its_linked_kernels(example_run):
    rep = pastaprof.analyze(example_run, tools=["ops"])[0]
    per_op = rep.details["per op"].to_pydict()
    by_op = collections.Counter()
    for kind in ("kernel", "memcpy", "memset"):
        t = example_run.table(kind).to_pydict()
        for s, e, oid in zip(t["start_ns"], t["end_ns"], t["op_id"]):
            if oid is not None:
                by_op[oid] += e - s
    for oid, gpu in zip(per_op["id"], per_op["self_gpu_ns"]):
        assert gpu == by_op.get(oid, 0)
    assert rep.summary["attributed_gpu_ns"] == sum(by_op.values())
    # inclusive time of a root op = own + all descendants
    op = example_run.table("op").to_pydict()
    children = collections.defaultdict(list)
    for i, p in zip(op["id"], op["parent_id"]):
        if p is not None:
            children[p].append(i)

    def subtree(i):
        return by_op.get(i, 0) + sum(subtree(c) for c in children[i])

    incl = dict(zip(per_op["id"], per_op["gpu_ns"]))
    roots = [i for i, p in zip(op["id"], op["parent_id"]) if p is None][:200]
    for r in roots:
        assert incl[r] == subtree(r)


def test_op_nesting_modules_and_call_sites(example_run):
    op = example_run.table("op")
    d = op.to_pydict()
    start = dict(zip(d["id"], d["start_ns"]))
    end = dict(zip(d["id"], d["end_ns"]))
    for i, p in zip(d["id"], d["parent_id"]):
        if p is not None:
            assert start[p] <= start[i] and end[i] <= end[p]
    mods = [m for m in d["module"] if m]
    assert any(m.startswith("GPT2LMHeadModel_0/GPT2Model_0/GPT2Block_") for m in mods)
    # backward ops inherit the module of their forward op (via sequence number)
    bwd = [(n, m) for n, m, b in zip(d["name"], d["module"], d["is_backward"]) if b and m]
    assert len(bwd) > 1000
    assert any("GPT2Attention" in m for _, m in bwd)
    sites = [s for s in d["call_site"] if s]
    assert all(not s.startswith("torch/") for s in sites)
    assert any(s.startswith("transformers/models/gpt2/modeling_gpt2.py(") for s in sites)


def test_multi_rank_folder_uses_distributed_info_and_collectives():
    run = pastaprof.load(DATA / "ddp_mlp_2ranks")
    assert run.ranks == [0, 1]
    for r in (0, 1):
        raw = raw_events(DATA / "ddp_mlp_2ranks" / f"rank-{r}.pt.trace.json.gz")
        nk = sum(1 for e in raw if e.get("cat") == "kernel")
        assert run.sql(f"select count(*) from kernel where rank = {r}").fetchall()[0][0] == nk
        nccl = sum(1 for e in raw if e.get("cat") == "kernel" and e["name"].startswith("ncclDevKernel"))
        assert nccl > 0
        colls = [e for e in raw if e.get("name") == "record_param_comms" and e["args"].get("Collective name") == "allreduce"]
        got = run.sql(f"select sum(bytes) from collective where rank = {r} and name = 'allreduce'").fetchall()[0][0]
        assert got == sum(4 * e["args"]["In msg nelems"] for e in colls)  # Float = 4 bytes
    only1 = pastaprof.load(DATA / "ddp_mlp_2ranks", ranks=[1])
    assert only1.ranks == [1] and set(only1.table("kernel")["rank"].to_pylist()) == {1}


def test_rank_from_file_name_when_no_distributed_info(tmp_path):
    src = DATA / "mlp_train_3steps.pt.trace.json.gz"
    (tmp_path / "trace_rank_3.json.gz").write_bytes(src.read_bytes())
    (tmp_path / "trace_rank_5.json.gz").write_bytes(src.read_bytes())
    run = pastaprof.load(tmp_path)
    assert run.ranks == [3, 5]
    assert sorted(set(run.table("kernel")["rank"].to_pylist())) == [3, 5]


@pytest.mark.parametrize("path", FOREIGN, ids=lambda p: p.stem)
def test_foreign_traces_older_torch_and_rocm(path):
    raw = raw_events(path)
    kern = [e for e in raw if str(e.get("cat", "")).lower() == "kernel" and e.get("ph") == "X"]
    run = pastaprof.load(path)
    k = run.table("kernel")
    assert k.num_rows == len(kern) > 0
    assert _sum_dur(k) == sum(dur_ns(e) for e in kern)
    # every kernel is linked to its launching API call and to the op around it
    assert pc.sum(pc.is_valid(k["correlation"])).as_py() == k.num_rows
    assert pc.sum(pc.is_valid(k["op_id"])).as_py() == k.num_rows
    streams = set(k["stream"].to_pylist())
    assert None not in streams


def test_unknown_categories_are_counted_not_fatal(tmp_path):
    import json

    doc = {"traceEvents": [
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 10.5, "dur": 2.25,
         "args": {"device": 0, "stream": 7, "correlation": 1}},
        {"ph": "X", "cat": "my_custom_cat", "name": "x", "pid": 1, "tid": 1, "ts": 11, "dur": 1},
        {"ph": "X", "cat": "my_custom_cat", "name": "y", "pid": 1, "tid": 1, "ts": 12, "dur": 1},
    ]}
    p = tmp_path / "t.json"
    p.write_text(json.dumps(doc))
    run = pastaprof.load(p)
    assert run.manifest["unknown_categories"] == {"my_custom_cat": 2}
    k = run.table("kernel").to_pylist()[0]
    assert (k["start_ns"], k["end_ns"], k["stream"], k["device"]) == (10500, 12750, 7, 0)


def test_bare_array_chrome_trace(tmp_path):
    import json

    p = tmp_path / "bare.json"
    p.write_text(json.dumps([{"ph": "X", "cat": "Kernel", "name": "k", "pid": 0, "tid": "stream 3",
                              "ts": 1, "dur": 1, "args": {"correlation": 4}}]))
    k = pastaprof.load(p).table("kernel").to_pylist()
    assert len(k) == 1 and k[0]["stream"] == 3 and k[0]["correlation"] == 4


def test_parallel_parse_of_a_cut_event_array_gives_identical_events(monkeypatch):
    """Big traces are cut at event boundaries and parsed by two DuckDB threads: the
    events must be exactly those of the uncut parse."""
    from pastaprof.importers import kineto, staging

    whole = pastaprof.load(pastaprof.example_path())
    seen = []
    real = staging.split_staged

    def spy(path, parts):
        files = real(path, parts)
        seen.append(len(files))
        return files

    monkeypatch.setattr(staging, "SPLIT_MIN_BYTES", 0)
    monkeypatch.setattr(kineto, "split_staged", spy)
    monkeypatch.setattr(kineto, "THREADS", 3)
    cut = pastaprof.load(pastaprof.example_path())
    assert seen == [3]
    for kind in ("kernel", "op", "api", "frame", "tensor", "memset", "range"):
        assert cut.table(kind).equals(whole.table(kind)), kind


def test_cut_falls_back_to_one_file_without_kineto_layout(tmp_path, monkeypatch):
    import json

    from pastaprof.importers import staging

    monkeypatch.setattr(staging, "SPLIT_MIN_BYTES", 0)
    p = tmp_path / "compact.json"
    p.write_text(json.dumps([{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 1, "ts": i, "dur": 1}
                             for i in range(1000)]))
    assert staging.split_staged(p, 2) == [p]


def test_ops_module_types_roll_up_instances(example_run):
    rep = pastaprof.analyze(example_run, tools=["ops"])[0]
    types = {r["module_type"]: r for r in rep.tables["module types"].to_pylist()}
    per_module = rep.tables["modules"].to_pylist()
    # GPT-2 small has 12 blocks: their attention modules are one row with 12 instances
    # and the summed GPU time of the ops directly inside them
    attn = [m for m in per_module if m["module"].rsplit("/", 1)[-1].startswith("GPT2Attention_")]
    assert types["GPT2Attention"]["instances"] == len(attn) == 12
    assert types["GPT2Attention"]["gpu_ns"] == sum(m["gpu_ns"] for m in attn) > 0
    assert types["Conv1D"]["instances"] == 48  # 4 per block
    assert sum(t["gpu_ns"] for t in types.values()) == rep.summary["attributed_gpu_ns"]
