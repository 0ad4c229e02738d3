"""rocpd rows -> pastaprof events: column-wise (Arrow compute), typeless SQLite values made safe."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc


def _ints(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    """int64 (junk, fractions of huge values, out of range: null)."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if pa.types.is_integer(arr.type):
        return arr.cast(pa.int64())
    if pa.types.is_null(arr.type):
        return pa.nulls(len(arr), pa.int64())
    out = []
    for v in arr.to_pylist():  # rare: a column SQLite gave as REAL or text
        try:
            x = int(float(v)) if not isinstance(v, int) else v
        except (TypeError, ValueError, OverflowError):
            x = None
        out.append(x if x is not None and -(1 << 63) <= x < (1 << 63) else None)
    return pa.array(out, pa.int64())


def _strs(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    return arr if pa.types.is_string(arr.type) else arr.cast(pa.string()) if not pa.types.is_binary(arr.type) \
        else pa.array([None if v is None else v.decode("utf-8", "replace") for v in arr.to_pylist()], pa.string())


def _timed(t: pa.Table, dropped: dict[str, int], kind: str) -> pa.Table:
    """Integer times; rows without a start or end are dropped (counted), end < start is clamped."""
    s, e = _ints(t["start_ns"]), _ints(t["end_ns"])
    ok = pc.and_(pc.is_valid(s), pc.is_valid(e))
    bad = len(s) - pc.sum(ok.cast(pa.int64())).as_py() if len(s) else 0
    if bad:
        dropped[f"{kind} rows without a time"] = dropped.get(f"{kind} rows without a time", 0) + bad
    t = t.set_column(t.schema.get_field_index("start_ns"), "start_ns", s)
    t = t.set_column(t.schema.get_field_index("end_ns"), "end_ns", pc.max_element_wise(e, s))
    return t.filter(ok) if bad else t


def _common(t: pa.Table, rank: int, names: tuple[str, ...] = ("pid", "tid", "correlation")) -> dict[str, pa.Array]:
    n = t.num_rows
    out: dict[str, pa.Array] = {"start_ns": t["start_ns"], "end_ns": t["end_ns"], "rank": pa.array([rank] * n, pa.int32())}
    for k in names:
        out[k] = _ints(t[k])
    return out


def _kernels(t: pa.Table, rank: int) -> pa.Table:
    cols = _common(t, rank)
    cols["device"] = _ints(t["device"])
    cols["stream"] = _ints(t["stream"])
    cols["name"] = pc.fill_null(_strs(t["name"]), "<unnamed kernel>")
    for k in ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "registers"):
        cols[k] = _small(_ints(t[k]))
    cols["shared_bytes"] = _ints(t["shared_bytes"])
    return pa.table(cols)


def _small(a: pa.Array) -> pa.Array:
    """int32 columns: values out of range become null."""
    ok = pc.and_(pc.greater_equal(a, -(1 << 31)), pc.less(a, 1 << 31))
    return pc.if_else(ok, a, pa.scalar(None, pa.int64())).cast(pa.int32())


def _copies(t: pa.Table, rank: int) -> pa.Table:
    cols = _common(t, rank)
    dt, st = pc.fill_null(_strs(t["dst_type"]), ""), pc.fill_null(_strs(t["src_type"]), "")
    dg, sg = pc.equal(dt, "GPU"), pc.equal(st, "GPU")
    same = pc.fill_null(pc.equal(_ints(t["dst_agent"]), _ints(t["src_agent"])), False)
    dc, sc = pc.equal(dt, "CPU"), pc.equal(st, "CPU")
    direction = pc.case_when(pc.make_struct(pc.and_(sc, dg), pc.and_(sg, dc), pc.and_(pc.and_(sg, dg), same),
                                            pc.and_(sg, dg), pc.and_(sc, dc)),
                             "HtoD", "DtoH", "DtoD", "PtoP", "HtoH")
    cols["direction"] = pc.fill_null(direction, "unknown")
    cols["device"] = pc.if_else(dg, _ints(t["dst_index"]), _ints(t["src_index"]))
    cols["stream"] = _ints(t["stream"])
    cols["name"] = pc.fill_null(_strs(t["name"]), "memory copy")
    cols["bytes"] = _ints(t["bytes"])
    for k in ("dst_address", "src_address"):
        a = _ints(t[k])
        cols[k] = pc.if_else(pc.greater_equal(a, 0), a, pa.scalar(None, pa.int64())).cast(pa.uint64())
    return pa.table(cols)


def _regions(t: pa.Table, rank: int, counts: dict[str, int]) -> dict[str, pa.Table]:
    cat = pc.fill_null(_strs(t["category"]), "")
    for c, n in zip(*_value_counts(cat), strict=True):
        counts[c or "(none)"] = counts.get(c or "(none)", 0) + n
    upper = pc.utf8_upper(cat)
    marker = pc.starts_with(upper, "MARKER_CORE")
    other_marker = pc.and_(pc.starts_with(upper, "MARKER"), pc.invert(marker))
    api = pc.invert(pc.starts_with(upper, "MARKER"))
    cols = _common(t, rank)
    cols["name"] = pc.fill_null(_strs(t["name"]), "<unnamed>")
    base = pa.table(cols)
    out = {}
    a = base.filter(api)
    kind = pc.if_else(pc.starts_with(upper.filter(api), "HSA"), "driver", "runtime")
    out["api"] = a.append_column("api_kind", kind)
    r = base.filter(marker).drop_columns(["correlation"])
    out["range"] = r.append_column("domain", pa.array(["user"] * r.num_rows, pa.string()))
    counts["(marker control, not read)"] = pc.sum(other_marker.cast(pa.int64())).as_py() or 0
    return out


def _value_counts(a: pa.Array) -> tuple[list, list]:
    vc = pc.value_counts(a)
    return vc.field("values").to_pylist(), vc.field("counts").to_pylist()


def _allocs(t: pa.Table, rank: int) -> dict[str, pa.Table]:
    cols = _common(t, rank)
    op = pc.utf8_upper(pc.fill_null(_strs(t["op"]), ""))
    level = pc.utf8_upper(pc.fill_null(_strs(t["level"]), "REAL"))
    agent = pc.fill_null(_strs(t["agent_type"]), "")
    kind = pc.case_when(pc.make_struct(pc.equal(level, "SCRATCH"), pc.equal(level, "VIRTUAL"), pc.equal(agent, "CPU")),
                        "scratch", "virtual", "host")
    cols["memory_kind"] = pc.fill_null(kind, "device")
    cols["device"] = _ints(t["device"])
    a = _ints(t["address"])
    cols["address"] = pc.if_else(pc.greater_equal(a, 0), a, pa.scalar(None, pa.int64())).cast(pa.uint64())
    cols["bytes"] = _ints(t["bytes"])
    cols["name"] = pc.fill_null(_strs(t["op"]), "")
    base = pa.table(cols)
    is_alloc = pc.is_in(op, pa.array(["ALLOC", "REALLOC"]))
    is_free = pc.is_in(op, pa.array(["FREE", "RECLAIM"]))
    return {"alloc": base.filter(is_alloc), "free": base.filter(is_free)}


def _lookup(ids: pa.ChunkedArray, table: pa.Table) -> pa.Array:
    """The names of ``ids`` in an (id, value) table, dictionary-encoded; unknown ids: null."""
    idx = pc.index_in(_ints(ids), value_set=_ints(table["id"]))
    return pa.DictionaryArray.from_arrays(idx.cast(pa.int32()), _strs(table["value"]))
