"""The cuda_api tool on real traces, checked against independent tallies of the trace JSON
(orjson + plain Python: names, durations, containment by loops), plus one built run for the
rules no recorded trace exercises (blocking cudaMemcpy, .item())."""

from __future__ import annotations

import math
from pathlib import Path

import pyarrow as pa
import pytest
from conftest import exact_ns as ns
from conftest import interval_ns as ival
from conftest import raw_events as load

import pastaprof
from pastaprof.events.schema import conform
from pastaprof.tools.cuda_api import CudaApi

DATA = Path(__file__).parent / "data"
EXAMPLE = Path(pastaprof.__file__).parent / "data" / "example_gpt2_train_3steps.pt.trace.json.gz"
API_CATS = ("cuda_runtime", "cuda_driver")
LIB_PREFIXES = ("torch/", "pastaprof/", "<", "threading.py", "contextlib.py", "functools.py", "runpy.py")


def report(path: Path):
    (rep,) = pastaprof.analyze(path, tools=["cuda_api"])
    return rep


def nearest_rank(values: list[int], q: float) -> int:
    v = sorted(values)
    return v[math.ceil(q * len(v)) - 1]


def api_events(paths: list[Path]) -> list[dict]:
    return [e for p in paths for e in load(p) if e.get("cat") in API_CATS and e.get("ph") == "X"]


@pytest.mark.parametrize("paths", [[DATA / "two_streams_copies.pt.trace.json.gz"], [EXAMPLE],
                                   sorted((DATA / "ddp_mlp_2ranks").glob("*.json.gz"))])
def test_per_api_calls_total_and_p99(paths):
    rep = report(paths[0] if len(paths) == 1 else paths[0].parent)
    by_name: dict[str, list[int]] = {}
    for e in api_events(paths):
        by_name.setdefault(e["name"], []).append(ns(e["dur"]))
    got = {r["name"]: r for r in rep.tables["apis"].to_pylist()}
    assert set(got) == set(by_name)
    for name, ds in by_name.items():
        r = got[name]
        assert (r["calls"], r["total_ns"], r["max_ns"]) == (len(ds), sum(ds), max(ds)), name
        assert r["p99_ns"] == nearest_rank(ds, 0.99), name
    assert rep.summary["api_calls"] == sum(len(d) for d in by_name.values())


def user_site(frames: list[dict], tid, t: int) -> str | None:
    """Innermost python_function around t on the thread whose file is the user's."""
    best = None
    for e in frames:
        s, end = ival(e)
        name = e["name"]
        file = name.split("(")[0]
        if e["tid"] != tid or not (s <= t < end) or name.startswith("nn.Module") or file.startswith(LIB_PREFIXES) \
                or "site-packages/torch/" in file or "/pastaprof/" in file:
            continue
        if best is None or s >= best[0]:
            best = (s, name)
    return best and best[1]


def outermost_op(ops: list[dict], tid, t: int) -> str | None:
    around = [(ival(o)[0], -ival(o)[1], o["name"]) for o in ops if o["tid"] == tid and ival(o)[0] <= t < ival(o)[1]]
    return min(around)[2] if around else None


def test_two_streams_synchronizing_calls_with_op_and_call_site():
    path = DATA / "two_streams_copies.pt.trace.json.gz"
    ev = load(path)
    rep = report(path)
    ops = [e for e in ev if e.get("cat") == "cpu_op"]
    frames = [e for e in ev if e.get("cat") == "python_function"]
    pageable = {e["args"]["correlation"] for e in ev if e.get("cat") == "gpu_memcpy" and "Pageable" in e["name"]}
    want: dict[tuple, list[int]] = {}
    for e in api_events([path]):
        name = e["name"]
        if name in ("cudaStreamSynchronize", "cudaDeviceSynchronize"):
            kind = "sync"
        elif e["args"].get("correlation") in pageable:
            kind = "pageable memcpy"
        else:
            continue
        s, _ = ival(e)
        op = outermost_op(ops, e["tid"], s)
        site = user_site(frames, e["tid"], s)
        want.setdefault((kind, name, op, site), []).append(ns(e["dur"]))
    got = {(r["kind"], r["api"], r["op"], r["call_site"]): r for r in rep.tables["syncs"].to_pylist()}
    assert set(got) == set(want)
    for k, ds in want.items():
        assert (got[k]["calls"], got[k]["blocked_ns"]) == (len(ds), sum(ds)), k
    assert ("sync", "cudaDeviceSynchronize", None, "record.py(39): <module>") in got  # outside any op: frame site
    assert sum(len(d) for d in want.values()) == 13 == rep.summary["sync_calls"]
    # the .cpu() of a pageable buffer: its copy and its synchronize are one finding at one call site
    host = [ival(e) for e in ev if e.get("cat") in ("cpu_op", *API_CATS) and e.get("ph") == "X"]
    span = max(b for _, b in host) - min(a for a, _ in host)
    assert rep.summary["host_span_ns"] == span
    copy_ns = sum(sum(ds) for (kind, _, op, _), ds in want.items() if op == "aten::to")
    first = rep.findings[0]
    assert first.evidence["cause"] == "copy" and first.location == "record.py(39): <module>"
    assert first.evidence["impact_ns"] == copy_ns and first.evidence["calls"] == 8
    assert first.severity == "warning" and first.evidence["share_of_span"] == round(copy_ns / span, 4)
    assert all(f.evidence["impact_ns"] > 0 and f.evidence["suggestion"] for f in rep.findings)


def test_example_item_calls_that_do_not_synchronize_are_not_reported():
    ev = load(EXAMPLE)
    rep = report(EXAMPLE)
    items = [ival(e) + (e["tid"],) for e in ev if e.get("cat") == "cpu_op" and e["name"] == "aten::item"]
    syncs_in_items = [e for e in api_events([EXAMPLE]) if "Synchronize" in e["name"]
                      and any(a <= ival(e)[0] < b and t == e["tid"] for a, b, t in items)]
    assert len(items) == 888 and syncs_in_items == []
    rows = rep.tables["syncs"].to_pylist()
    dev = [e for e in api_events([EXAMPLE]) if e["name"] == "cudaDeviceSynchronize"]
    assert [(r["api"], r["op"], r["call_site"], r["calls"], r["blocked_ns"]) for r in rows] == \
        [("cudaDeviceSynchronize", None, "record_traces.py(41): gpt2_steps", 2, sum(ns(e["dur"]) for e in dev))]
    assert rep.findings == []  # 27 us of 182 ms: under the 1% share


def test_ddp_event_synchronize_over_both_ranks():
    rep = report(DATA / "ddp_mlp_2ranks")
    files = sorted((DATA / "ddp_mlp_2ranks").glob("*.json.gz"))
    ev = [e for e in api_events(files) if e["name"] == "cudaEventSynchronize"]
    (row,) = [r for r in rep.tables["syncs"].to_pylist() if r["api"] == "cudaEventSynchronize"]
    assert (row["calls"], row["blocked_ns"], row["ranks"]) == (len(ev), sum(ns(e["dur"]) for e in ev), [0, 1])
    assert len(ev) == 48


def _table(kind: str, **cols) -> pa.RecordBatch:
    n = len(cols["start_ns"])
    cols.setdefault("rank", pa.array([0] * n, pa.int32()))
    cols.setdefault("pid", [1] * n)
    cols.setdefault("tid", [1] * n)
    return conform(kind, pa.table(cols)).to_batches()[0]


def test_item_and_blocking_memcpy_rules_on_a_built_run():
    """`.item()` (sync inside aten::_local_scalar_dense inside aten::item), a blocking cudaMemcpy,
    cuCtxSynchronize and hipDeviceSynchronize, and a call that only polls (not synchronizing)."""
    tool = CudaApi()
    tool.on_batch("op", _table("op", start_ns=[0, 10, 1000], end_ns=[500, 400, 1100], id=[0, 1, 2],
                               parent_id=pa.array([None, 0, None], pa.int64()), depth=pa.array([0, 1, 0], pa.int32()),
                               name=["aten::item", "aten::_local_scalar_dense", "aten::mm"],
                               call_site=["train.py(7): loop", None, "train.py(9): loop"]))
    tool.on_batch("api", _table("api", start_ns=[20, 100, 1010, 2000, 3000, 4000],
                                end_ns=[90, 390, 1090, 2600, 3100, 4500], correlation=[1, 2, 3, 4, 5, 6],
                                op_id=pa.array([1, 1, 2, None, None, None], pa.int64()),
                                name=["cudaMemcpyAsync", "cudaStreamSynchronize", "cudaMemcpy", "cuCtxSynchronize",
                                      "cudaEventQuery", "hipDeviceSynchronize"]))
    rep = tool.report()
    rows = {(r["kind"], r["api"], r["op"]): r for r in rep.tables["syncs"].to_pylist()}
    assert set(rows) == {("sync", "cudaStreamSynchronize", "aten::item"), ("blocking memcpy", "cudaMemcpy", "aten::mm"),
                         ("sync", "cuCtxSynchronize", None), ("sync", "hipDeviceSynchronize", None)}
    assert rows[("sync", "cudaStreamSynchronize", "aten::item")]["call_site"] == "train.py(7): loop"  # from the root
    assert rows[("sync", "cudaStreamSynchronize", "aten::item")]["inner_op"] == "aten::_local_scalar_dense"
    by_cause = {f.evidence["cause"]: f for f in rep.findings}
    assert by_cause["item"].evidence["impact_ns"] == 290 and by_cause["item"].location == "train.py(7): loop"
    assert by_cause["blocking memcpy"].evidence["impact_ns"] == 80
    assert by_cause["sync"].evidence["impact_ns"] == 600 + 500 and by_cause["sync"].evidence["calls"] == 2
    apis = {r["name"]: r["synchronizing"] for r in rep.tables["apis"].to_pylist()}
    assert apis["cudaEventQuery"] is False and apis["cudaMemcpy"] is True and apis["cudaMemcpyAsync"] is False


def test_no_api_calls_is_a_note():
    rep = CudaApi().report()
    assert not rep.tables and "no CUDA/HIP API calls" in rep.summary["note"]


def test_negative_durations_and_unnamed_calls():
    """A broken trace's call that ends before it starts blocks nothing; a call without a name
    is kept under '<unknown>' rather than dropped or crashing the name rules."""
    tool = CudaApi()
    tool.on_batch("api", _table("api", start_ns=[100, 200, 300], end_ns=[50, 260, 400], correlation=[1, 2, 3],
                                name=pa.array(["cudaDeviceSynchronize", None, "cudaDeviceSynchronize"], pa.string())))
    rep = tool.report()
    apis = {r["name"]: r for r in rep.tables["apis"].to_pylist()}
    assert apis["cudaDeviceSynchronize"]["total_ns"] == 100 and apis["cudaDeviceSynchronize"]["calls"] == 2
    assert apis[None]["calls"] == 1 and apis[None]["total_ns"] == 60
    assert rep.summary["sync_blocked_ns"] == 100 and rep.summary["api_ns"] == 160
