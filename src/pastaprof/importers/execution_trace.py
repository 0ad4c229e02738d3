"""PyTorch execution traces (``ExecutionTraceObserver``, Chakra host ET JSON) as ops.

An execution trace is the op graph of one process: per node its name, parent
(``ctrl_deps``), RecordFunction id (``rf_id``), thread, schema and its inputs and
outputs (values, shapes, types; a tensor is ``[tensor_id, storage_id, offset, numel,
itemsize, device]``).  It has no timing.

* Beside a Kineto trace (same folder) it is a *companion* (importers/base.py): each
  Kineto op is joined to the node with its ``Record function id`` (and name), and gains
  ``et_id``, ``et_parent``, ``op_schema``, input/output tensor ids, output shapes and
  dtypes, and ``data_deps`` (the ET ids of the ops that produced its input tensors);
  input shapes and dtypes are filled where the Kineto trace lacks them.
* On its own it imports as ops only; their times are an ORDER (each op opens and
  closes one tick, 1 ns, of a walk of the graph), never durations.

The observer writes the file as a stream and the closing bracket last, so a crash
leaves it cut: the nodes before the cut are read and one note says where it ends.
Schemas read: ``1.0.x``/``1.1.x`` (``-chakra.*``); other majors are refused.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from pastaprof.errors import InputError
from pastaprof.importers.base import LIKELY, Claim, Importer, Note, Progress, RankTables

MAX_BYTES = 2 << 30          # decompressed; larger: refused in one line
HEAD_BYTES = 1 << 16
SCHEMA_RE = re.compile(rb'"schema"\s*:\s*"([^"\\]{1,64})"')
CONTAINERS = ("[pytorch|profiler|execution_trace|process]", "[pytorch|profiler|execution_trace|thread]")
MAJORS = ("1.0.", "1.1.")
ET_COLUMNS = ("et_id", "et_parent", "op_schema", "input_tensor_ids", "output_tensor_ids", "output_shapes",
              "output_dtypes", "data_deps")


def _head(path: Path) -> bytes:
    try:
        with open(path, "rb") as f:
            raw = f.read(HEAD_BYTES)
        if raw[:2] == b"\x1f\x8b":
            return zlib.decompressobj(31).decompress(raw, HEAD_BYTES)
        return raw
    except (OSError, zlib.error):
        return b""


def _read_text(path: Path) -> bytes:
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise InputError(path, f"cannot be read ({e.strerror or e})") from None
    if raw[:2] == b"\x1f\x8b":
        d = zlib.decompressobj(31)
        try:
            raw = d.decompress(raw, MAX_BYTES + 1)
        except zlib.error:
            raw = _gunzip_prefix(raw)
    if len(raw) > MAX_BYTES:
        raise InputError(path, f"is over {MAX_BYTES >> 30} GiB of JSON; execution traces that large are not read")
    return raw


def _gunzip_prefix(raw: bytes) -> bytes:
    """What a damaged gzip stream decompresses to before the damage (a cut file)."""
    out = []
    d = zlib.decompressobj(31)
    for i in range(0, len(raw), 1 << 16):
        try:
            out.append(d.decompress(raw[i:i + (1 << 16)]))
        except zlib.error:
            break
    return b"".join(out)


def parse(path: Path) -> tuple[dict[str, Any], list[dict], str | None]:
    """(header, nodes, cut) of an execution trace; ``cut`` says where a damaged file ends."""
    text = _read_text(path)
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError:
        return _salvage(path, text)
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), list):
        raise InputError(path, "is JSON without a nodes list: not a PyTorch execution trace")
    return doc, [n for n in doc["nodes"] if isinstance(n, dict)], None


def _salvage(path: Path, text: bytes) -> tuple[dict[str, Any], list[dict], str | None]:
    """Read a cut file: the header keys before ``nodes`` and every whole node."""
    s = text.decode("utf-8", "replace")
    at = s.find('"nodes"')
    if at < 0 or not s.lstrip().startswith("{"):
        raise InputError(path, "is not valid JSON and has no nodes list: not a PyTorch execution trace")
    header: dict[str, Any] = {}
    try:
        header = json.loads(s[:at].rstrip().rstrip(",") + "}")
    except (ValueError, RecursionError):
        header = {}
    pos = s.find("[", at)
    dec = json.JSONDecoder()
    nodes: list[dict] = []
    if pos < 0:
        return header, nodes, "it ends before the nodes"
    pos += 1
    while True:
        while pos < len(s) and s[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(s) or s[pos] == "]":
            break
        try:
            node, pos = dec.raw_decode(s, pos)
        except (ValueError, RecursionError):
            break
        if isinstance(node, dict):
            nodes.append(node)
    return header, nodes, f"it is cut (not valid JSON): {len(nodes)} whole nodes read, the rest (from byte {pos}) lost"


# ---------------------------------------------------------------- nodes -> columns
def _int(v: Any) -> int | None:
    if isinstance(v, bool) or not isinstance(v, int):
        return None
    return v if -(1 << 63) <= v < (1 << 63) else None


def _tensor_ids(io: Any) -> list[int | None]:
    """One entry per argument: its tensor id, the first of a tensor list, else null."""
    if not isinstance(io, dict):
        return []
    vals, types = io.get("values") or [], io.get("types") or []
    out: list[int | None] = []
    for i, v in enumerate(vals if isinstance(vals, list) else []):
        t = types[i] if isinstance(types, list) and i < len(types) and isinstance(types[i], str) else ""
        if t.startswith("Tensor") and isinstance(v, list) and v:
            out.append(_int(v[0]))
        elif "Tensor" in t and isinstance(v, list) and v and isinstance(v[0], list) and v[0]:
            out.append(_int(v[0][0]))
        else:
            out.append(None)
    return out


def _all_tensor_ids(io: Any) -> list[int]:
    """Every tensor id an input/output list names (tensor lists included)."""
    if not isinstance(io, dict):
        return []
    vals, types = io.get("values") or [], io.get("types") or []
    out = []
    for i, v in enumerate(vals if isinstance(vals, list) else []):
        t = types[i] if isinstance(types, list) and i < len(types) and isinstance(types[i], str) else ""
        if "Tensor" not in t or not isinstance(v, list):
            continue
        items = v if v and isinstance(v[0], list) else [v]
        out += [x for x in (_int(it[0]) for it in items if isinstance(it, list) and it) if x is not None]
    return out


def _json(io: Any, key: str) -> str | None:
    if not isinstance(io, dict) or key not in io:
        return None
    try:
        return orjson.dumps(io[key]).decode()[:4000]
    except (TypeError, orjson.JSONEncodeError):
        return None


def _clean(n: Any) -> dict | None:
    """A node with the types the mapping reads (None: not a node): a damaged or hostile
    file's wrong types become nulls, never an exception."""
    if not isinstance(n, dict) or _int(n.get("id")) is None:
        return None
    attrs = {a["name"]: a.get("value") for a in n.get("attrs") or () if isinstance(a, dict)
             and isinstance(a.get("name"), str)} if isinstance(n.get("attrs"), list) else {}

    def io(v: Any) -> dict:
        if not isinstance(v, dict):
            return {}
        return {k: v[k] for k in ("values", "shapes", "types") if isinstance(v.get(k), list)}

    return {"id": n["id"], "name": str(n.get("name", ""))[:1000], "ctrl_deps": _int(n.get("ctrl_deps")),
            "attrs": attrs, "inputs": io(n.get("inputs")), "outputs": io(n.get("outputs"))}


def node_table(nodes: list[dict]) -> pa.Table:
    """One row per operator node (container nodes left out), in ET id order, with
    ``data_deps``: the ET ids of the latest earlier nodes that output each input tensor."""
    clean = (_clean(n) for n in nodes)
    rows = sorted((n for n in clean if n is not None and n["name"] not in CONTAINERS), key=lambda n: n["id"])
    producer: dict[int, int] = {}
    cols: dict[str, list] = {k: [] for k in ("et_id", "et_parent", "name", "rf_id", "tid", "sequence_id", "op_schema",
                                              "input_shapes", "input_dtypes", "output_shapes", "output_dtypes",
                                              "input_tensor_ids", "output_tensor_ids", "data_deps")}
    for n in rows:
        ins, outs, attrs = n["inputs"], n["outputs"], n["attrs"]
        deps = sorted({producer[t] for t in _all_tensor_ids(ins) if t in producer})
        for t in _all_tensor_ids(outs):
            producer[t] = n["id"]
        seq = _int(attrs.get("seq_id"))
        schema = attrs.get("op_schema")
        cols["et_id"].append(n["id"])
        cols["et_parent"].append(n["ctrl_deps"])
        cols["name"].append(n["name"])
        cols["rf_id"].append(_int(attrs.get("rf_id")))
        cols["tid"].append(_int(attrs.get("tid")))
        cols["sequence_id"].append(seq if seq is not None and seq >= 0 else None)
        cols["op_schema"].append(schema[:2000] if isinstance(schema, str) and schema else None)
        cols["input_shapes"].append(_json(ins, "shapes"))
        cols["input_dtypes"].append(_json(ins, "types"))
        cols["output_shapes"].append(_json(outs, "shapes"))
        cols["output_dtypes"].append(_json(outs, "types"))
        cols["input_tensor_ids"].append(_tensor_ids(ins))
        cols["output_tensor_ids"].append(_tensor_ids(outs))
        cols["data_deps"].append(deps)
    types = {"name": pa.string(), "op_schema": pa.string(), "input_shapes": pa.string(), "input_dtypes": pa.string(),
             "output_shapes": pa.string(), "output_dtypes": pa.string(), "input_tensor_ids": pa.list_(pa.int64()),
             "output_tensor_ids": pa.list_(pa.int64()), "data_deps": pa.list_(pa.int64())}
    try:
        return pa.table({k: pa.array(v, types.get(k, pa.int64())) for k, v in cols.items()})
    except UnicodeEncodeError:  # a lone surrogate ("\\ud800", which JSON may escape): Arrow takes UTF-8 only
        for k, t in types.items():
            if t == pa.string():
                cols[k] = [x.encode("utf-8", "replace").decode("utf-8") if isinstance(x, str) else x for x in cols[k]]
        return pa.table({k: pa.array(v, types.get(k, pa.int64())) for k, v in cols.items()})


def _ticks(et: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """(enter, exit) tick of each node in a depth-first walk by id: children nest in parents."""
    ids = et["et_id"].to_numpy(zero_copy_only=False)
    parent = pc.fill_null(et["et_parent"], -1).to_numpy(zero_copy_only=False)
    index = {int(i): k for k, i in enumerate(ids)}
    children: dict[int, list[int]] = {}
    roots = []
    for k, p in enumerate(parent):
        pk = index.get(int(p), -1)
        (children.setdefault(pk, []) if pk >= 0 and pk != k else roots).append(k)
    enter, leave = np.zeros(len(ids), np.int64), np.zeros(len(ids), np.int64)
    tick, seen = 0, np.zeros(len(ids), bool)
    for r in roots:
        stack = [(r, False)]
        while stack:
            k, done = stack.pop()
            if done:
                leave[k] = tick
                tick += 1
                continue
            if seen[k]:
                continue
            seen[k] = True
            enter[k] = tick
            tick += 1
            stack.append((k, True))
            stack.extend((c, False) for c in reversed(children.get(k, [])))
    return enter, leave


# ---------------------------------------------------------------- the importer
class ExecutionTraceImporter(Importer):
    """PyTorch execution traces: on their own (ops, no timing) or beside a Kineto trace (joined)."""

    name = "execution_trace"
    description = "PyTorch execution traces (ExecutionTraceObserver / Chakra host ET JSON), alone or beside Kineto"
    formats = ("pytorch_et",)
    looks_for = ".json execution traces (PyTorch ExecutionTraceObserver)"
    accompanies = ("kineto",)

    def sniff(self, path: Path) -> Claim | None:
        if path.is_dir():  # a folder of execution traces and no Kineto trace (else they are its companions)
            files = _folder(path)
            return Claim(self.name, "pytorch_et", LIKELY, None, f"a folder of {len(files)} execution traces") \
                if files else None
        head = _head(path)
        m = SCHEMA_RE.search(head)
        if not head.lstrip().startswith(b"{") or m is None or b'"nodes"' not in head and b'"start_ts"' not in head:
            return None
        version = m.group(1).decode("ascii", "replace")
        return Claim(self.name, "pytorch_et", LIKELY, version, f"a PyTorch execution trace (schema {version})")

    def import_ranks(self, path: Path, ranks: list[int] | None = None, *, progress: Progress | None = None,
                     kinds: set[str] | None = None, note: Note | None = None) -> Iterator[RankTables]:
        files = _folder(path) if path.is_dir() else [path]
        if not files:
            raise InputError(path, "folder holds no execution trace")
        named = [_rank_in_name(f) for f in files]
        if None in named or len(set(named)) != len(named):
            named = list(range(len(files)))  # rank-N in every name, else file order
        notes: list[str] = []
        for rank, f in sorted(zip(named, files, strict=True)):
            if ranks is not None and rank not in ranks:
                continue
            op, meta = _alone(f, rank)
            notes += meta["notes"]
            if progress is not None:
                progress(meta["bytes"])
            yield rank, {"op": op}, meta
        if note is not None:
            for line in notes:
                note(line)

    def manifest_fields(self, path: Path, metas: list[dict[str, Any]]) -> dict[str, Any]:
        m = metas[0] if metas else {}
        return {"source": str(path), "format": "pytorch_et", "format_version": m.get("format_version"),
                "command": None, "host": None, "devices": [], "versions": {"execution_trace": m.get("format_version")},
                "ranks": sorted({x["rank"] for x in metas}),
                "rank_source": {x["file"]: {"rank": x["rank"], "pid": x["pid"]} for x in metas},
                "notes": [n for x in metas for n in x.get("notes", [])], "skipped": {}, "clock": {"domain": "order_ticks", "anchors": {}},
                "capture_overhead": None, "dropped_events": None, "category_counts": {},
                "unknown_categories": {}, "trace_bytes": m.get("bytes", 0),
                "execution_trace": {"nodes": m.get("nodes"), "ops": m.get("ops")}}

    def attach(self, rank: int, tables: dict[str, pa.Table], files: list[Path],
               meta: dict[str, Any]) -> dict[str, pa.Table]:
        """Join the execution trace of this rank's process to its Kineto ops (see module docstring)."""
        f = _pick(rank, files, meta)
        if f is None or "op" not in tables:
            return tables
        header, nodes, cut = parse(f)
        _check_version(f, header)
        et = node_table(nodes)
        op, joined, named = join_ops(tables["op"], et)
        notes = meta.setdefault("plan", {}).setdefault("notes", [])
        notes.append(f"{f.name}: execution trace joined to rank {rank}: {joined} of {op.num_rows} ops matched by "
                     f"record function id" + (f" ({named} more had the id of an op of another name)" if named else ""))
        if cut:
            notes.append(f"{f.name}: {cut}")
        return {**tables, "op": op}


def _alone(path: Path, rank: int) -> tuple[pa.Table, dict[str, Any]]:
    """One execution trace as ops (times: their order, see the module docstring)."""
    header, nodes, cut = parse(path)
    version = _check_version(path, header)
    et = node_table(nodes)
    enter, leave = _ticks(et)
    n = et.num_rows
    op = et.append_column("start_ns", pa.array(enter)).append_column("end_ns", pa.array(leave))
    op = op.append_column("rank", pa.array([rank] * n, pa.int32()))
    op = op.append_column("pid", pa.array([_int(header.get("pid"))] * n, pa.int64()))
    notes = [f"{path.name}: an execution trace has no timing: op times are their order (one tick, 1 ns, per "
             "op entered or left), not durations"]
    if cut:
        notes.append(f"{path.name}: {cut}")
    return op, {"rank": rank, "file": path.name, "format_version": version, "nodes": len(nodes), "ops": n,
                "notes": notes, "pid": _int(header.get("pid")), "bytes": _size(path)}


def _folder(path: Path) -> list[Path]:
    """The execution traces of a folder that holds no Kineto trace (ETs beside one are its companions)."""
    from pastaprof.importers.sniff import sniff

    try:
        files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith(".")
                       and p.name.endswith((".json", ".json.gz")))
    except OSError:
        return []
    if any(sniff(p).kind == "trace" and ExecutionTraceImporter().sniff(p) is None for p in files):
        return []
    return [p for p in files if ExecutionTraceImporter().sniff(p) is not None]


def _rank_in_name(path: Path) -> int | None:
    from pastaprof.importers.ranks import rank_from_name

    try:
        return rank_from_name(path)
    except InputError:
        return None


def join_ops(op: pa.Table, et: pa.Table) -> tuple[pa.Table, int, int]:
    """Kineto ops + ET columns, joined on rf_id (and the same name).  Returns (ops, joined,
    id matches refused for another name)."""
    if "rf_id" not in op.column_names or not et.num_rows:
        return op, 0, 0
    et = et.filter(pc.is_valid(et["rf_id"]))
    idx = pc.index_in(op["rf_id"], value_set=et["rf_id"].combine_chunks())
    same = pc.equal(op["name"].cast(pa.string()), et["name"].take(pc.fill_null(idx, 0)) if et.num_rows else op["name"])
    ok = pc.and_(pc.is_valid(idx), pc.fill_null(same, False))
    named = pc.sum(pc.and_(pc.is_valid(idx), pc.invert(pc.fill_null(same, False))).cast(pa.int64())).as_py() or 0
    take = pc.if_else(ok, idx, pa.scalar(None, pa.int32()))
    for col in ET_COLUMNS:
        vals = et[col].take(take)
        i = op.schema.get_field_index(col)
        op = op.set_column(i, col, vals) if i >= 0 else op.append_column(col, vals)
    for col in ("input_shapes", "input_dtypes"):  # where the Kineto trace did not record shapes
        vals = et[col].take(take)
        if col in op.column_names:
            vals = pc.coalesce(op[col].cast(pa.string()), vals)
        i = op.schema.get_field_index(col)
        op = op.set_column(i, col, vals) if i >= 0 else op.append_column(col, vals)
    return op, int(pc.sum(ok.cast(pa.int64())).as_py() or 0), int(named)


def _pick(rank: int, files: list[Path], meta: dict[str, Any]) -> Path | None:
    """The ET file of this rank: same pid, else ``rank-N`` in its name, else the only one."""
    pid = (meta.get("rank_source") or {}).get("pid", meta.get("pid"))
    by_pid, by_name = [], []
    from pastaprof.importers.ranks import rank_from_name

    for f in files:
        head = _head(f)
        m = SCHEMA_RE.search(head)
        p = re.search(rb'"pid"\s*:\s*(\d{1,12})', head)
        if m and p and pid is not None and int(p.group(1)) == pid:
            by_pid.append(f)
        try:
            if rank_from_name(f) == rank:
                by_name.append(f)
        except InputError:
            pass
    for group in (by_pid, by_name):
        if len(group) == 1:
            return group[0]
    return files[0] if len(files) == 1 else None


def _check_version(path: Path, header: dict[str, Any]) -> str | None:
    v = header.get("schema")
    if v is None:
        return None
    v = str(v)[:64]
    if not v.startswith(MAJORS):
        raise InputError(path, f"is an execution trace of schema {v}; this importer reads schemas 1.0.x and 1.1.x")
    return v


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


__all__ = ["ExecutionTraceImporter", "join_ops", "node_table", "parse"]
