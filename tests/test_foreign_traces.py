"""Every real trace is read right: real traces (tests/data) edited into the shapes other
writers and other devices produce -- Kineto's log array after the events, members in any
order, names full of brackets, no ops, no user frames, MTIA categories, CUDA graphs,
hostile values.  Every expected number is a tally of the edited file with plain json."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pyarrow.compute as pc
import pytest
from conftest import DATA, raw_events

import pastaprof
from pastaprof.cli import cli
from pastaprof.errors import InputError
from pastaprof.importers.kineto import import_file

MLP = DATA / "mlp_train_3steps.pt.trace.json.gz"
GPT2 = DATA / "gpt2_small2l_train_3steps.pt.trace.json.gz"
GRAPHS = DATA / "recorded" / "cuda_graphs_mlp_4replays.pt.trace.json.gz"
COMPILE = DATA / "recorded" / "compile_mlp_train_2steps.pt.trace.json.gz"
KERNEL_CATS = {"kernel", "mtia_ccp_events"}
API_CATS = {"cuda_runtime", "cuda_driver", "mtia_runtime"}


def load_doc(path: Path) -> dict:
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


def kernels_of(events: list) -> list[dict]:
    return [e for e in events if isinstance(e, dict) and e.get("ph") == "X" and str(e.get("cat")).lower() in KERNEL_CATS]


def ns(us: float) -> int:
    return round(us * 1000)  # Kineto prints µs with 3 decimals: exact ns


def kineto_text(doc: dict, after: list[tuple[str, object]] = (), first: bool = False) -> bytes:
    """The file as Kineto lays it out: metadata, ``"traceEvents": [...]``, then the
    members after it (``after``; Kineto ends with ``traceName``)."""
    meta = [(k, v) for k, v in doc.items() if k not in ("traceEvents", "traceName")]
    events = ",".join("\n  " + json.dumps(e) for e in doc["traceEvents"])
    parts = [] if first else [f'  "{k}": {json.dumps(v)}' for k, v in meta]
    parts.append(f'  "traceEvents": [{events}\n  ]')
    if first:
        parts += [f'  "{k}": {json.dumps(v)}' for k, v in meta]
    parts += [f'  "{k}": {json.dumps(v)}' for k, v in after]
    parts.append(f'  "traceName": {json.dumps(doc.get("traceName", "x"))}')
    return ("{\n" + ",\n".join(parts) + "\n}").encode()


def run_cli(*args: str) -> int:
    """The CLI entry in this process; its exit code."""
    try:
        cli.main(list(args), prog_name="pastaprof", standalone_mode=False)
    except SystemExit as e:
        return int(e.code or 0)
    return 0


def write(tmp: Path, name: str, data: bytes) -> Path:
    p = tmp / name
    p.write_bytes(data)
    return p


def kernel_facts(path: Path) -> tuple[int, int, Counter]:
    run = pastaprof.load(path)
    k = run.table("kernel")
    total = pc.sum(pc.subtract(k["end_ns"], k["start_ns"])).as_py() or 0
    return k.num_rows, total, Counter(k["name"].cast("string").to_pylist())


def tally(doc: dict) -> tuple[int, int, Counter]:
    ks = kernels_of(doc["traceEvents"])
    return len(ks), sum(ns(e["dur"]) for e in ks), Counter(e["name"] for e in ks)


# --------------------------------------------------------------------------- file structure


LOG = ["Chrome Trace written to /tmp/x]", "CUPTI [warning] {code 7}: \"retry\"", "path C:\\\\temp ]]"]


def test_log_array_after_events_as_torch_2_4_writes_it(tmp_path):
    """torch >= 2.4: ``"INFO": [...]`` (and WARNING/ERROR) between the events and
    traceName; log lines full of brackets, quotes and backslashes; a kernel name too."""
    doc = load_doc(GPT2)
    doc = {"note": '"traceEvents": [1, 2]', "nested": {"traceEvents": [{"ph": "X"}]}, **doc}  # decoys before it
    ks = kernels_of(doc["traceEvents"])
    ks[-1]["name"] = 'weird]}, "x": [kernel\\" name'
    ks[0]["name"] = "[[{"
    p = write(tmp_path, "t.json", kineto_text(doc, after=[("INFO", LOG), ("ERROR", ["[E] ]"])]))
    assert kernel_facts(p) == tally(doc)
    _, meta = import_file(p, kinds={"kernel"})
    assert meta["INFO"] == LOG and meta["ERROR"] == ["[E] ]"]
    assert meta["traceName"] == doc["traceName"]


def test_members_in_any_order_events_first(tmp_path):
    """traceEvents first, deviceProperties / samples / distributedInfo after it."""
    doc = load_doc(MLP)
    samples = [{"ts": i, "stack": ["a]", "b"]} for i in range(30)]
    doc = {"note": '"traceEvents": [1, 2]', "nested": {"traceEvents": [{"ph": "X"}]}, **doc}  # decoys
    p = write(tmp_path, "t.json", kineto_text(doc, first=True, after=[("samples", samples), ("INFO", LOG)]))
    assert kernel_facts(p) == tally(doc)
    run = pastaprof.load(p)
    assert [d["id"] for d in run.manifest["devices"]] == [d["id"] for d in doc["deviceProperties"]]
    assert run.manifest["devices"][0]["numSms"] == doc["deviceProperties"][0]["numSms"]
    gz = write(tmp_path, "t.json.gz", gzip.compress(p.read_bytes()))
    assert kernel_facts(gz) == tally(doc)


def test_bare_array_and_traceevents_twice(tmp_path):
    doc = load_doc(MLP)
    bare = write(tmp_path, "bare.json", ("[" + ",\n".join(json.dumps(e) for e in doc["traceEvents"]) + "]\n").encode())
    assert kernel_facts(bare) == tally(doc)
    twice = write(tmp_path, "twice.json", kineto_text(doc, after=[("traceEvents", [])]))
    with pytest.raises(InputError, match="traceEvents appears twice"):
        pastaprof.load(twice)


# --------------------------------------------------------------------------- partial inputs


def _op_links(run) -> int:
    return pc.count(run.table("kernel")["op_id"]).as_py()


def test_runtime_calls_without_any_cpu_op(tmp_path):
    doc = load_doc(MLP)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") != "cpu_op"]
    p = write(tmp_path, "t.json", kineto_text(doc))
    run = pastaprof.load(p)
    assert run.table("op").num_rows == 0 and _op_links(run) == 0
    assert run.table("api").num_rows == sum(e.get("cat") in API_CATS for e in doc["traceEvents"])
    assert kernel_facts(p) == tally(doc)
    reports = {r.tool: r for r in pastaprof.analyze(p)}
    assert reports["kernels"].summary["kernels"] == tally(doc)[0]


def test_ops_without_any_user_code_frame(tmp_path):
    """Only torch's own Python frames and nn.Module frames: no call site, modules kept."""
    full = pastaprof.load(MLP).table("op")
    doc = load_doc(MLP)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") != "python_function"
                          or e["name"].startswith(("nn.Module: ", "torch/", "<built-in"))]
    p = write(tmp_path, "t.json", kineto_text(doc))
    op = pastaprof.load(p).table("op")
    assert op.num_rows == sum(e.get("cat") == "cpu_op" for e in doc["traceEvents"]) == full.num_rows
    assert op["call_site"].null_count == op.num_rows
    assert op["module"].to_pylist() == full["module"].to_pylist()
    assert pc.count(full["module"]).as_py() > 0
    assert pastaprof.analyze(p, tools=["ops"])[0].summary


# --------------------------------------------------------------------------- other devices


def test_mtia_categories_are_read_and_the_rest_is_named(tmp_path, capsys):
    doc = load_doc(MLP)
    cuda_links = _op_links(pastaprof.load(MLP))
    rename = {"kernel": "mtia_ccp_events", "cuda_runtime": "mtia_runtime"}
    for e in doc["traceEvents"]:
        e["cat"] = rename.get(e.get("cat"), e.get("cat"))
    ts = doc["traceEvents"][-1]["ts"]
    doc["traceEvents"] += [{"ph": "X", "cat": "mtia_insight", "name": f"i{i}", "pid": 1, "tid": 1, "ts": ts,
                            "dur": 1} for i in range(3)]
    doc["traceEvents"] += [{"ph": "i", "cat": "cuda_event", "name": "ev", "pid": 1, "tid": 1, "ts": ts}]
    p = write(tmp_path, "mtia.json", kineto_text(doc))
    assert kernel_facts(p) == tally(doc) and tally(doc)[0] > 0
    run = pastaprof.load(p)
    assert _op_links(run) == cuda_links
    assert run.table("api").num_rows == sum(e.get("cat") in API_CATS for e in doc["traceEvents"])
    assert run.manifest["unknown_categories"] == {"mtia_insight": 3, "cuda_event": 1}
    capsys.readouterr()
    assert run_cli("analyze", str(p), "-q", "-t", "kernels") == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "does not map" in line]
    assert len(notes) == 1 and "mtia_insight (3)" in notes[0] and "cuda_event (1)" in notes[0]


def test_compiled_triton_kernels_link_through_driver_calls():
    doc = load_doc(COMPILE)
    run = pastaprof.load(COMPILE)
    assert kernel_facts(COMPILE) == tally(doc)
    k = run.table("kernel")
    triton = pc.starts_with(k["name"].cast("string"), "triton_")
    assert pc.sum(triton).as_py() == sum(e["name"].startswith("triton_") for e in kernels_of(doc["traceEvents"]))
    assert pc.count(k.filter(triton)["op_id"]).as_py() == pc.sum(triton).as_py()  # every one has its op


# --------------------------------------------------------------------------- CUDA graphs


def _launch_tally(doc: dict) -> dict[str, int]:
    """Per launch call (correlation): its kernels' summed duration against the call's."""
    calls = {e["args"]["correlation"]: ns(e["dur"]) for e in doc["traceEvents"]
             if e.get("cat") in API_CATS and e.get("ph") == "X" and "correlation" in e.get("args", {})}
    gpu, count = Counter(), Counter()
    for k in kernels_of(doc["traceEvents"]):
        c = k["args"]["correlation"]
        if c in calls:
            gpu[c] += ns(k["dur"])
            count[c] += 1
    bound = {c for c in gpu if gpu[c] < calls[c]}
    return {"launches": len(gpu), "graph_launches": sum(n > 1 for n in count.values()),
            "launch_bound_launches": len(bound), "launch_bound_graph_launches": sum(count[c] > 1 for c in bound),
            "launch_bound_kernels": sum(count[c] for c in bound)}


def test_cuda_graph_launches_judged_per_launch_on_the_recorded_trace():
    doc = load_doc(GRAPHS)
    s = pastaprof.analyze(GRAPHS, tools=["timeline"])[0].summary
    want = _launch_tally(doc)
    assert want["graph_launches"] == 4 and want["launches"] == 12
    assert {k: s[k] for k in want} == want
    assert s["launch_bound_share"] == round(want["launch_bound_launches"] / want["launches"], 4)


def test_cuda_graph_kernels_do_not_make_a_launch_bound_finding(tmp_path):
    """The real GPT-2 trace with every 20 kernels of a stream replayed from one graph
    launch (one cudaGraphLaunch call, its correlation on all of them): the launches are
    not launch-bound, though nearly every kernel is shorter than the call."""
    doc = load_doc(GPT2)
    ev = doc["traceEvents"]
    calls = {e["args"]["correlation"]: e for e in ev if e.get("cat") in API_CATS and "correlation" in e.get("args", {})}
    by_stream: dict = {}
    for k in sorted(kernels_of(ev), key=lambda e: e["ts"]):
        by_stream.setdefault(k["args"]["stream"], []).append(k)
    drop = set()
    for ks in by_stream.values():
        for i in range(0, len(ks), 20):
            group = ks[i : i + 20]
            head = group[0]["args"]["correlation"]
            calls[head]["name"] = "cudaGraphLaunch"
            for k in group[1:]:
                drop.add(k["args"]["correlation"])
                k["args"]["correlation"] = head
    doc["traceEvents"] = [e for e in ev if not (e.get("cat") in API_CATS and e.get("args", {}).get("correlation") in drop)]
    p = write(tmp_path, "graphs.json", kineto_text(doc))
    rep = pastaprof.analyze(p, tools=["timeline"])[0]
    want = _launch_tally(doc)
    assert {k: rep.summary[k] for k in want} == want
    assert want["graph_launches"] >= 30 and want["launch_bound_launches"] < 100
    assert not [f for f in rep.findings if "launch call" in f.title]
    # per kernel against the whole call (the old judgement) nearly all are "launch-bound"
    per_kernel = sum(ns(k["dur"]) < ns(calls[k["args"]["correlation"]]["dur"]) for k in kernels_of(doc["traceEvents"]))
    assert per_kernel >= 100 and per_kernel / tally(doc)[0] >= 0.5


# --------------------------------------------------------------------------- hostile values


def test_device_properties_with_non_integer_ids(tmp_path):
    doc = load_doc(DATA / "leak_5steps.pt.trace.json.gz")
    good = dict(doc["deviceProperties"][0])
    doc["deviceProperties"] = [{"id": "zero", "name": 5}, {"id": 1.5}, ["x"], None, {"id": None},
                               dict(good, id="0", totalGlobalMem=1e300)]
    p = write(tmp_path, "t.json", kineto_text(doc))
    reports = {r.tool: r for r in pastaprof.analyze(p)}
    assert set(reports) >= {"kernels", "memory", "timeline"}
    run = pastaprof.load(p)
    assert [(d["id"], d["name"]) for d in run.manifest["devices"]] == [(0, good["name"])]
    assert "totalGlobalMem" not in run.manifest["devices"][0]


def test_ids_at_int64_extremes_link_like_the_original(tmp_path):
    doc = load_doc(MLP)
    top = 2**63 - 1
    for e in doc["traceEvents"]:
        a = e.get("args", {})
        for key in ("correlation", "External id", "external id"):
            if isinstance(a.get(key), int):
                a[key] = top - a[key]
    p = write(tmp_path, "t.json", kineto_text(doc))
    orig, edited = pastaprof.load(MLP), pastaprof.load(p)
    for kind in ("kernel", "memset", "api"):
        assert edited.table(kind)["op_id"].to_pylist() == orig.table(kind)["op_id"].to_pylist()
    assert pc.max(edited.table("kernel")["correlation"]).as_py() <= top


def test_skipped_phases_and_missing_timestamps_are_counted(tmp_path, capsys):
    doc = load_doc(MLP)
    ks = kernels_of(doc["traceEvents"])
    ks[0].pop("ts")
    for k in ks[1:4]:
        k["ph"] = "B"
    ks[4]["ph"] = "Q"
    ks[5]["dur"] = -3.5
    p = write(tmp_path, "t.json", kineto_text(doc))
    capsys.readouterr()
    run = pastaprof.load(p)
    k = run.table("kernel")
    assert k.num_rows == len(ks) - 5
    assert pc.min(pc.subtract(k["end_ns"], k["start_ns"])).as_py() == 0
    (note,) = [line for line in capsys.readouterr().err.splitlines() if "phase" in line]
    assert note.startswith("pastaprof: note: t.json: 5 events skipped")
    assert 'kernel (ph="B") 3' in note and "kernel (no ts) 1" in note and 'kernel (ph="Q") 1' in note
    assert note.endswith("; 1 events with a negative duration read as zero-length")


def test_duplicated_events_and_hostile_names_are_read_as_written(tmp_path):
    doc = load_doc(MLP)
    ks = kernels_of(doc["traceEvents"])
    ks[0]["name"] = "\x00\x1b[2J\x07ctrl"
    ks[1]["name"] = "n" * (1 << 20)
    ks[2]["name"] = "\U0001f600 ]} {["
    doc["traceEvents"] += [dict(k) for k in ks[:10]]  # the same events (same correlation ids) twice
    p = write(tmp_path, "t.json", kineto_text(doc))
    assert kernel_facts(p) == tally(doc)


def _cli_error(p: Path, capsys) -> str:
    capsys.readouterr()
    code = run_cli("analyze", str(p), "-q")
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("pastaprof: error:")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err[-500:]
    return lines[0]


@pytest.mark.parametrize("case", ["nan_ts", "inf_ts", "ts_int64", "lone_surrogate", "bad_utf8", "deep_header",
                                  "log_unclosed", "garbage_after", "not_array", "truncated_trailer",
                                  "times_spread", "ts_ns"])
def test_hostile_values_give_one_clear_line(tmp_path, capsys, case):
    doc = load_doc(DATA / "leak_5steps.pt.trace.json.gz")
    k = kernels_of(doc["traceEvents"])[0]
    k["name"] = "MARK"
    if case == "times_spread":  # 5e18 ns before the others: no span or gap of the trace fits int64
        k["ts"] = -5e15
    if case == "ts_ns":  # nanoseconds since the epoch where the format says µs
        k["ts"] = 1_700_000_000_000_000_000
    text = kineto_text(doc, after=[("INFO", LOG)])
    data = {
        "nan_ts": text.replace(b'"name": "MARK"', b'"name": "MARK", "ts": NaN'),
        "inf_ts": text.replace(b'"name": "MARK"', b'"name": "MARK", "dur": -Infinity'),
        "ts_int64": text.replace(b'"name": "MARK"', b'"name": "MARK", "ts": 9223372036854775807'),
        "lone_surrogate": text.replace(b'"MARK"', b'"\\ud800"'),
        "bad_utf8": text.replace(b'"MARK"', b'"\xff\xfe\xc3"'),
        "deep_header": text.replace(b'"schemaVersion": 1', b'"schemaVersion": ' + b"[" * 5000 + b"]" * 5000),
        "log_unclosed": text.replace(b'"INFO": [', b'"INFO": [[', 1),
        "garbage_after": text + b" trailing",
        "not_array": text.replace(b'"traceEvents": [', b'"traceEvents": {"a": [', 1),
        "truncated_trailer": text[: text.rfind(b'"traceName"') + 5],
        "times_spread": text,
        "ts_ns": text,
    }[case]
    line = _cli_error(write(tmp_path, "t.json", data), capsys)
    assert str(tmp_path / "t.json") in line and "pastaprof-import" not in line
    if case == "times_spread":
        assert "event times span" in line
    if case == "ts_ns":
        assert "are these ns?" in line


# --------------------------------------------------------------------------- traces of other projects
# Real files from other repositories (tests/data/foreign/README.md says where each is from).

CORPUS = DATA / "foreign" / "corpus"
READABLE = ["hta_call_stack_backward_thread", "kineto_docs_before_fix_trace", "pytorch_inductor_test_analysis_example_profile"]
CPU_CATS = {"cpu_op", "operator"}


def _of(events: list, cats: set[str]) -> list[dict]:
    return [e for e in events if e.get("ph") == "X" and str(e.get("cat")).lower() in cats]


@pytest.mark.parametrize("stem", READABLE)
def test_other_projects_traces_are_read_right(stem):
    path = CORPUS / f"{stem}.json"
    doc = load_doc(path)
    run = pastaprof.load(path)
    assert kernel_facts(path) == tally(doc)
    assert run.table("op").num_rows == len(_of(doc["traceEvents"], CPU_CATS))
    assert run.table("api").num_rows == len(_of(doc["traceEvents"], {"cuda_runtime"}))
    assert run.table("sync").num_rows == len(_of(doc["traceEvents"], {"cuda_sync"}))
    assert run.ranks == [doc.get("distributedInfo", {}).get("rank", 0)]
    steps = [e for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")]
    report = {r.tool: r for r in pastaprof.analyze(path, tools=["steps"])}["steps"]
    assert report.summary["steps"] == len(steps)
    if steps:
        assert report.summary["median_wall_ns"] == ns(steps[0]["dur"])


def _op_of_kernels(run) -> list[str | None]:
    ops = run.table("op")
    names = dict(zip(ops["id"].to_pylist(), ops["name"].to_pylist()))
    return [names.get(i) for i in run.table("kernel").sort_by("start_ns")["op_id"].to_pylist()]


def test_kernel_op_found_by_nesting_when_external_ids_differ():
    """HTA's trace: the launch's External id is no op's; the op is the innermost cpu_op
    around the launch on its thread."""
    path = CORPUS / "hta_call_stack_backward_thread.json"
    events = load_doc(path)["traceEvents"]
    expect = []
    for k in sorted(kernels_of(events), key=lambda e: e["ts"]):
        api = next(a for a in _of(events, {"cuda_runtime"}) if a["args"]["correlation"] == k["args"]["correlation"])
        around = [o for o in _of(events, CPU_CATS)
                  if o["tid"] == api["tid"] and o["ts"] <= api["ts"] <= o["ts"] + o["dur"]]
        expect.append(min(around, key=lambda o: o["dur"])["name"])
    assert _op_of_kernels(pastaprof.load(path)) == expect == ["aten::mm"]


@pytest.mark.parametrize("shift", [459, 489])
def test_call_external_ids_that_meet_the_ops_do_not_move_the_links(tmp_path, shift):
    """The ROCm trace numbers its runtime calls' and kernels' External ids (their correlation,
    24-55) apart from its ops' (513-522).  Later in a run the two counters meet: shifted so
    that calls carry op ids, every kernel still takes the op its launch lies in, and the
    synchronizes, outside every op, take none."""
    path = DATA / "foreign" / "amd_gfx942_gemm_bf16_extid_flows.json"
    doc = load_doc(path)
    for e in doc["traceEvents"]:
        args = e.get("args") or {}
        if e.get("cat") in ("cuda_runtime", "kernel", "ac2g") and isinstance(args.get("External id"), int):
            args["External id"] += shift
        if e.get("cat") == "ac2g" and isinstance(e.get("id"), int):
            e["id"] += shift
    moved = write(tmp_path, "shifted.json", json.dumps(doc).encode())
    base, shifted = pastaprof.load(path), pastaprof.load(moved)
    assert _op_of_kernels(shifted) == _op_of_kernels(base) and None not in _op_of_kernels(base)
    api = shifted.table("api").to_pylist()
    syncs = [a for a in api if "Synchronize" in str(a["name"])]
    assert len(syncs) == 2 and all(a["op_id"] is None for a in syncs)
    assert [a["op_id"] for a in api] == [a["op_id"] for a in base.table("api").to_pylist()]


def test_launches_in_one_microsecond_keep_their_own_flows(tmp_path):
    """The ROCm trace has no ``correlation``: calls and kernels are tied by ac2g flows that start
    (end) at their thread and microsecond.  Two launches in one microsecond (the first of under
    a microsecond, rounded to 0) each keep the flow numbered like their own External id, so
    every kernel still joins its own launch."""
    doc = load_doc(DATA / "foreign" / "amd_gfx942_gemm_bf16_extid_flows.json")
    events = doc["traceEvents"]
    calls = {e["args"]["External id"]: e for e in _of(events, {"cuda_runtime"}) if "Launch" in e["name"]}
    first, second = calls[25], calls[26]
    first["dur"] = 0
    for e in events:
        if e.get("cat") == "ac2g" and e.get("ph") == "s" and e.get("id") == 26:
            e["ts"] = first["ts"]
    second["ts"] = first["ts"]
    run = pastaprof.load(write(tmp_path, "tie.json", json.dumps(doc).encode()))
    launches = [r for r in run.table("api").to_pylist() if "Launch" in str(r["name"])]
    assert sorted(r["correlation"] for r in launches) == sorted(calls)
    tied = sorted((r for r in launches if r["start_ns"] == ns(first["ts"])), key=lambda r: r["end_ns"])
    assert [r["correlation"] for r in tied] == [25, 26]
    kernels = {e["args"]["External id"]: ns(e["ts"]) for e in kernels_of(events)}
    got = {r["correlation"]: r["start_ns"] for r in run.table("kernel").to_pylist()}
    assert got == kernels


def test_a_launch_and_kernel_tied_only_by_their_external_id(tmp_path):
    """The layout of TraceLens' MoE test traces (AMD-AGI/TraceLens, evals/unit_tests/moe): no
    ``correlation``; the ac2g flow starts and ends on the GPU, so no flow reaches the call; the
    call and the kernel share an External id no other event has.  The id ties them: the kernel
    has its launch, and its op is the one around the call."""
    gpu, host = {"pid": 0, "tid": 7}, {"pid": 470, "tid": 711}
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "vllm::fused_moe", **host, "ts": 1000000.0, "dur": 380.0, "args": {}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", **host, "ts": 1000010.0, "dur": 5.0,
         "args": {"External id": 100}},
        {"ph": "X", "cat": "kernel", "name": "fused_moe_kernel", **gpu, "ts": 1000050.0, "dur": 180.0,
         "args": {"device": 0, "stream": 7, "External id": 100}},
        {"ph": "s", "id": 100, **gpu, "ts": 1000050.0, "cat": "ac2g", "name": "ac2g"},
        {"ph": "f", "id": 100, **gpu, "ts": 1000050.0, "cat": "ac2g", "name": "ac2g", "bp": "e"},
    ]
    run = pastaprof.load(write(tmp_path, "moe.json", json.dumps({"traceEvents": events}).encode()))
    (kernel,), (call,) = run.table("kernel").to_pylist(), run.table("api").to_pylist()
    assert kernel["correlation"] == call["correlation"] is not None
    assert _op_of_kernels(run) == ["vllm::fused_moe"]


def test_kernels_without_launches_take_their_op_by_external_id():
    """The trace in torch's inductor tests: kernels on the host's pid and tid, no runtime
    call, no correlation; the op is the cpu_op with the kernel's External id."""
    path = CORPUS / "pytorch_inductor_test_analysis_example_profile.json"
    events = load_doc(path)["traceEvents"]
    by_ext = {o["args"]["External id"]: o["name"] for o in _of(events, CPU_CATS)}
    expect = [by_ext[k["args"]["External id"]] for k in sorted(kernels_of(events), key=lambda e: (e["ts"], e["dur"]))]
    assert sorted(_op_of_kernels(pastaprof.load(path))) == sorted(expect)


@pytest.mark.parametrize("stem", ["catapult_flow_simple", "catapult_async_begin_end"])
def test_chrome_traces_of_other_tools_are_one_line_naming_what_they_hold(tmp_path, capsys, stem):
    path = CORPUS / f"{stem}.json"
    events = raw_events(path)
    cats = Counter(e["cat"] for e in events)
    out = tmp_path / "out.json"
    for args in (["analyze", str(path), "--json", str(out)], ["import", str(path), "-o", str(tmp_path / "RUN")],
                 ["info", str(path)]):
        capsys.readouterr()
        assert run_cli(*args) == 2
        err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("pastaprof: error:")]
        assert len(err) == 1 and f"of {len(events)} events" in err[0]
        assert all(f"{c} ({n})" in err[0] for c, n in cats.items()) and "Chrome trace" in err[0]
    assert not out.exists() and not (tmp_path / "RUN").exists()


@pytest.mark.parametrize(("events", "said"), [
    ([], "event array is empty"),
    # the layout torch.autograd.profiler's export_chrome_trace wrote before Kineto (torch < 1.8)
    ([{"name": "aten::add", "ph": "X", "ts": 1.5, "dur": 3, "tid": 0, "pid": "CPU functions", "args": {}},
      {"name": "aten::add", "ph": "X", "ts": 9.0, "dur": 2, "tid": 0, "pid": "CUDA functions", "args": {}}],
     "torch.autograd.profiler trace (torch < 1.8"),
    # TensorFlow's and JAX's trace viewer JSON: XLA device processes, no categories
    ([{"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/device:GPU:0"}},
      {"ph": "X", "pid": 1, "tid": 2, "ts": 1.0, "dur": 2.0, "name": "fusion"}], "TensorFlow/JAX (XLA)"),
])
def test_traces_of_other_profilers_are_named(tmp_path, capsys, events, said):
    p = write(tmp_path, "t.json", json.dumps({"displayTimeUnit": "ns", "traceEvents": events}).encode())
    assert run_cli("analyze", str(p), "-q") == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("pastaprof: error:")]
    assert len(err) == 1 and said in err[0]


@pytest.mark.parametrize("end", ["", ",", ",\n  "])
def test_json_array_format_without_its_closing_bracket(tmp_path, end):
    """Chrome's JSON Array Format may stop after any event, with or without a comma."""
    src = sorted((DATA / "foreign").glob("torch1x_*.json"))[0]
    doc = load_doc(src)
    text = "[\n" + ",\n".join(json.dumps(e) for e in doc["traceEvents"]) + end
    p = write(tmp_path, "t.json", text.encode())
    assert kernel_facts(p) == tally(doc) and tally(doc)[0] > 0
    cut = write(tmp_path, "cut.json", text.rstrip(",\n ")[:-5].encode())  # inside the last event
    with pytest.raises(InputError, match="truncated"):
        pastaprof.load(cut)
