"""PyTorch execution traces (real: recorded on the H200 with ExecutionTraceObserver beside
their Kineto trace): alone, joined to Kineto ops by record-function id, cut by a crash,
fuzzed.  Numbers are checked against the raw JSON read here."""

from __future__ import annotations

import gzip
import json
import random
import subprocess
import sys
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from pastaprof import api
from pastaprof.errors import PastaprofError
from pastaprof.events.schema import conform
from pastaprof.importers.execution_trace import ExecutionTraceImporter, join_ops, node_table, parse
from pastaprof.importers.registry import importer_for
from pastaprof.processor.link import link_rank

FOLDER = Path(__file__).parent / "data" / "recorded" / "et_beside_kineto"
ET = FOLDER / "rank-0.et.json.gz"
KINETO = FOLDER / "rank-0.pt.trace.json.gz"
CONTAINER = "[pytorch|profiler|execution_trace|"


def _raw_et() -> dict:
    return json.loads(gzip.decompress(ET.read_bytes()))


def _attr(n: dict, name: str):
    return next(a["value"] for a in n["attrs"] if a["name"] == name)


def _ops(path: Path):
    imp = ExecutionTraceImporter()
    ((_rank, tables, meta),) = list(imp.import_ranks(path))
    return link_rank(tables)["op"], meta


def test_alone_every_operator_node_is_an_op_nested_as_in_the_graph():
    raw = _raw_et()["nodes"]
    real = {n["id"]: n for n in raw if not n["name"].startswith(CONTAINER)}
    op, meta = _ops(ET)
    assert op.num_rows == len(real) == 256 and meta["format_version"] == "1.1.1-chakra.0.0.4"
    rows = op.to_pylist()
    by_id = {r["id"]: r for r in rows}
    for r in rows:  # the linker's interval nesting gives back ctrl_deps
        n = real[r["et_id"]]
        parent = by_id.get(r["parent_id"])
        assert (parent["et_id"] if parent else None) == (n["ctrl_deps"] if n["ctrl_deps"] in real else None)
        assert r["name"] == n["name"] and r["rf_id"] == _attr(n, "rf_id")


def _tensors(io: dict) -> list[int]:
    """Tensor ids of an input/output list: a Tensor(...) is [id, ...], a list of them [[id, ...], ...]."""
    out = []
    for v, t in zip(io["values"], io["types"]):
        if t.startswith("Tensor("):
            out.append(v[0])
        elif t.startswith("GenericList[Tensor"):
            out += [x[0] for x in v]
    return out


def test_tensor_ids_shapes_and_data_dependencies_match_the_json():
    raw = sorted((n for n in _raw_et()["nodes"] if not n["name"].startswith(CONTAINER)), key=lambda n: n["id"])
    et = node_table(raw).to_pylist()
    made: dict[int, list[int]] = {}
    for n, r in zip(raw, et, strict=True):
        tensors_in = [v[0] if t.startswith("Tensor(") else v[0][0] if t.startswith("GenericList[Tensor") and v else None
                      for v, t in zip(n["inputs"]["values"], n["inputs"]["types"])]
        assert r["input_tensor_ids"] == tensors_in
        assert json.loads(r["output_shapes"]) == n["outputs"]["shapes"]
        deps = set()
        for tid in _tensors(n["inputs"]):
            if made.get(tid):
                deps.add(max(made[tid]))
        assert r["data_deps"] == sorted(deps), n["name"]
        for tid in _tensors(n["outputs"]):
            made.setdefault(tid, []).append(n["id"])
    assert sum(1 for r in et if r["data_deps"]) > 100


def test_beside_kineto_every_op_gains_its_node(tmp_path):
    run = api.import_trace(FOLDER, tmp_path / "run")
    op = pq.read_table(next((run / "op").glob("*.parquet")))
    kin = [e for e in json.loads(gzip.decompress(KINETO.read_bytes()))["traceEvents"] if e.get("cat") == "cpu_op"]
    nodes = {_attr(n, "rf_id"): n for n in _raw_et()["nodes"]}
    assert op.num_rows == len(kin) == 252
    rows = op.to_pylist()
    assert all(r["et_id"] is not None for r in rows)
    for r in rows:
        n = nodes[r["rf_id"]]
        assert n["id"] == r["et_id"] and n["name"] == r["name"] and json.loads(r["output_shapes"]) == n["outputs"]["shapes"]
    want = sorted((e["name"], e["args"]["Record function id"]) for e in kin)
    assert sorted((r["name"], r["rf_id"]) for r in rows) == want
    man = json.loads((run / "run.json").read_text())
    assert any("252 of 252 ops matched" in n for n in man["notes"])


def test_join_refuses_an_id_of_another_name():
    op, _ = _ops(ET)
    et = node_table(_raw_et()["nodes"])
    renamed = et.set_column(et.schema.get_field_index("name"), "name", pc.utf8_upper(et["name"]))
    _joined_op, joined, named = join_ops(op.select(["name", "rf_id"]), renamed)
    assert joined == 0 and named == op.num_rows


@pytest.mark.parametrize("fraction", [0.1, 0.5, 0.93])
def test_a_cut_file_reads_the_whole_nodes_before_the_cut(tmp_path, fraction):
    text = gzip.decompress(ET.read_bytes())
    cut = text[: int(len(text) * fraction)]
    p = tmp_path / "cut.et.json"
    p.write_bytes(cut)
    dec, s = json.JSONDecoder(), text.decode()
    pos, whole = s.index("[", s.index('"nodes"')) + 1, 0
    while True:  # count the nodes that end before the cut in the intact file
        while s[pos] in " \t\r\n,":
            pos += 1
        if s[pos] == "]":
            break
        node, pos = dec.raw_decode(s, pos)
        if pos > len(cut):
            break
        whole += not node["name"].startswith(CONTAINER)
    op, meta = _ops(p)
    assert op.num_rows == whole
    assert any("cut" in n and "whole nodes read" in n for n in meta["notes"])


def test_a_cut_gzip_file_too(tmp_path):
    p = tmp_path / "cut.et.json.gz"
    p.write_bytes(ET.read_bytes()[: len(ET.read_bytes()) // 2])
    _header, nodes, cut = parse(p)
    assert 0 < len(nodes) < 259 and cut


def test_info_and_default_tools(tmp_path):
    run = api.import_trace(ET, tmp_path / "run")
    r = subprocess.run([sys.executable, "-m", "pastaprof.cli", "info", str(run)], capture_output=True, text=True)
    assert r.returncode == 0 and "format=pytorch_et" in r.stdout
    tools = {rep.tool for rep in api.analyze(ET)}
    assert {"steps", "kernels", "ops", "timeline", "cuda_api", "copies", "memory"} <= tools


def test_claims():
    assert importer_for(ET)[0].name == "execution_trace"
    assert importer_for(FOLDER)[0].name == "kineto"
    assert ExecutionTraceImporter().sniff(KINETO) is None


def test_an_unknown_schema_is_one_line(tmp_path):
    doc = _raw_et()
    doc["schema"] = "2.0.0-chakra.9"
    p = tmp_path / "v2.json"
    p.write_text(json.dumps(doc))
    r = subprocess.run([sys.executable, "-m", "pastaprof.cli", "analyze", str(p)], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "schema 2.0.0-chakra.9" in r.stderr


JUNK = [None, "x", -1, 2 ** 80, 1.5e308, [], {}, [[None]], "\x1b]0;evil\x07", True, [1, 2, "cuda:0"]]


def _case(rng: random.Random, doc: dict, text: bytes) -> bytes:
    k = rng.randrange(6)
    if k == 0:
        return text[: rng.randrange(1, len(text))]
    if k == 1:
        b = bytearray(text)
        for _ in range(rng.randrange(1, 10)):
            b[rng.randrange(len(b))] = rng.choice(b'{}[],:"0a\\')
        return bytes(b)
    d = json.loads(json.dumps(doc))
    n = rng.choice(d["nodes"])
    if k == 2:
        n[rng.choice(["id", "name", "ctrl_deps", "inputs", "outputs", "attrs"])] = rng.choice(JUNK)
    elif k == 3:
        io = n[rng.choice(["inputs", "outputs"])]
        io[rng.choice(["values", "shapes", "types"])] = rng.choice(JUNK)
    elif k == 4:
        n["attrs"] = [{"name": "rf_id", "value": rng.choice(JUNK)}, rng.choice(JUNK)]
    else:
        d[rng.choice(["nodes", "schema", "pid"])] = rng.choice(JUNK)
    return json.dumps(d).encode()


def test_fuzz_fixed_seed_one_line_or_ops(tmp_path):
    rng = random.Random(20261201)
    doc, text = _raw_et(), gzip.decompress(ET.read_bytes())
    imp = ExecutionTraceImporter()
    kin_op = None
    ok = refused = 0
    for i in range(200):
        p = tmp_path / f"c{i}.json"
        p.write_bytes(_case(rng, doc, text))
        try:
            for _r, tables, _m in imp.import_ranks(p):
                for kind, t in link_rank(tables).items():
                    conform(kind, t)
            if kin_op is None:
                kin_op = conform("op", _ops(ET)[0])
            conform("op", join_ops(kin_op, node_table(parse(p)[1]))[0])
            ok += 1
        except PastaprofError as e:
            assert "\n" not in str(e), (i, str(e))
            refused += 1
        p.unlink()
    assert ok + refused == 200 and ok > 50 and refused > 10


def test_deeply_nested_or_huge_values_are_one_line_or_read(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text('{"schema": "1.1.1-chakra.0.0.4", "nodes": [' + "[" * 100000 + "]" * 100000 + "]}")
    huge = tmp_path / "huge.json"
    doc = _raw_et()
    doc["nodes"][5]["id"] = 10 ** 30
    doc["nodes"][6]["ctrl_deps"] = -(10 ** 25)
    huge.write_text(json.dumps(doc))
    for p in (deep, huge):
        try:
            op, _ = _ops(p)
            conform("op", op)
        except PastaprofError as e:
            assert "\n" not in str(e)


def test_a_cut_companion_still_joins_what_it_holds(tmp_path):
    import shutil

    shutil.copy(KINETO, tmp_path / KINETO.name)
    text = gzip.decompress(ET.read_bytes())
    (tmp_path / "rank-0.et.json").write_bytes(text[: len(text) // 2])
    run = api.import_trace(tmp_path, tmp_path / "run")
    op = pq.read_table(next((run / "op").glob("*.parquet")))
    joined = pc.sum(pc.is_valid(op["et_id"]).cast("int64")).as_py()
    assert 0 < joined < op.num_rows
    notes = json.loads((run / "run.json").read_text())["notes"]
    assert any(f"{joined} of {op.num_rows} ops matched" in n for n in notes) and any("is cut" in n for n in notes)


def test_a_folder_of_execution_traces_alone_is_one_rank_each(tmp_path):
    import shutil

    for r in (1, 0):
        shutil.copy(ET, tmp_path / f"rank-{r}.et.json.gz")
    assert importer_for(tmp_path)[0].name == "execution_trace"
    got = [(rank, t["op"].num_rows) for rank, t, _m in ExecutionTraceImporter().import_ranks(tmp_path)]
    assert got == [(0, 256), (1, 256)]
    shutil.copy(KINETO, tmp_path / KINETO.name)  # with a Kineto trace beside them they are its companions
    assert ExecutionTraceImporter().sniff(tmp_path) is None and importer_for(tmp_path)[0].name == "kineto"
