"""The tables the Kineto importer derives from its DuckDB projections, and their checks.

Kept apart from kineto.py (the parse and the per-kind SQL): what runs on the fetched
Arrow tables -- a frame's fields parsed once per distinct name, collectives taken from
``record_param_comms`` ops and names dictionary-encoded as the schema stores them.
"""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa

from pastaprof.events.schema import SCHEMAS

_DTYPE_BYTES = {"float": 4, "float32": 4, "half": 2, "float16": 2, "bfloat16": 2, "double": 8, "float64": 8,
                "int": 4, "int32": 4, "long": 8, "int64": 8, "long int": 8, "byte": 1, "uint8": 1, "char": 1,
                "int8": 1, "bool": 1, "short": 2, "int16": 2}


def encode_names(kind: str, t: pa.Table) -> pa.Table:
    """Dictionary-encode the columns the schema keeps as dictionaries (names repeat:
    a kernel name is stored once per batch, not once per launch)."""
    schema = SCHEMAS.get(kind)
    if schema is None:
        return t
    for field in schema:
        i = t.schema.get_field_index(field.name)
        if i >= 0 and pa.types.is_dictionary(field.type) and not pa.types.is_dictionary(t.schema.field(i).type):
            t = t.set_column(i, field.name, t.column(i).cast(field.type))
    return t


_FRAME_RE = "'^(.*)\\((\\d+)\\): '"
_FRAME_FIELDS = f"""
    CASE WHEN starts_with(name, 'nn.Module: ') THEN NULL
         ELSE NULLIF(regexp_extract(name, {_FRAME_RE}, 1), '') END AS file,
    TRY_CAST(NULLIF(regexp_extract(name, {_FRAME_RE}, 2), '') AS INTEGER) AS line,
    CASE WHEN starts_with(name, 'nn.Module: ') THEN substr(name, 12)
         WHEN regexp_matches(name, {_FRAME_RE}) THEN regexp_replace(name, {_FRAME_RE}, '')
         ELSE name END AS function,
    starts_with(name, 'nn.Module: ') AS is_module"""


def frame_fields(con: duckdb.DuckDBPyConnection, t: pa.Table) -> pa.Table:
    """Append file, line, function and is_module, parsed from each frame's name.  A trace
    repeats a few thousand distinct Python frames across millions of events, so the
    regular expressions run once per distinct name (in DuckDB, the same SQL as per row
    would be) and their results are gathered onto the rows by the name's position."""
    import pyarrow.compute as pc

    names = t["name"]
    distinct = pc.unique(names)
    codes = pc.index_in(names, value_set=distinct)
    con.register("frame_names", pa.table({"i": np.arange(len(distinct), dtype=np.int64), "name": distinct}))
    try:
        fields = con.sql(f"SELECT i, {_FRAME_FIELDS} FROM frame_names ORDER BY i").to_arrow_table()
    finally:
        con.unregister("frame_names")
    for col in ("file", "line", "function", "is_module"):
        t = t.append_column(col, fields[col].take(codes))
    return t


def collectives(op: pa.Table) -> pa.Table:
    """record_param_comms ops carry collective metadata (name, elements, dtype)."""
    import pyarrow.compute as pc

    mask = pc.is_valid(op["collective"])
    t = op.filter(mask)
    dtypes = t["dtype"].to_pylist()
    size = pa.array([_DTYPE_BYTES.get((d or "").lower().replace("c10::", ""), 0) or None for d in dtypes], pa.int64())
    nbytes = pc.multiply(t["nelems"].cast(pa.int64()), size)
    return pa.table({
        "start_ns": t["start_ns"], "end_ns": t["end_ns"], "rank": t["rank"], "device": t["device"],
        "stream": t["stream"], "pid": t["pid"], "tid": t["tid"], "correlation": t["correlation"],
        "name": t["collective"], "bytes": nbytes, "dtype": t["dtype"], "group_size": t["group_size"],
        "peers": t["peers"], "external_id": t["external_id"],
    })
