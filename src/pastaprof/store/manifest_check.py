"""Checking a run's manifest (run.json): read by safe_read's bounded JSON reader, then each
field pastaprof reads checked for its type, so that no reader meets a field of a type it does
not expect -- one InputError line naming the field instead of a TypeError deep in a tool."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from pastaprof.errors import InputError
from pastaprof.store.safe_read import MAX_MANIFEST_BYTES, load_json
from pastaprof.store.safe_read import printable as _key

# A field's expected type: "int" (int64, not bool), "count" (int64 >= 0), "rank" (0 <= int < 2**31), "num"
# (int64, or a float within its range),
# "str", "any"; ("?", t): t or null; ("list", t); ("map", t): an object whose values are t; a dict:
# an object whose listed keys are of those types (others are free).
_DEVICE = {"id": "int", "name": ("?", "str"), "numSms": ("?", "num"), "totalGlobalMem": ("?", "num")}
_PROCESS = {"rank": "int", "pid": ("?", "int"), "events": ("?", ("map", ("?", "num"))),
            "handlers": ("?", ("map", ("?", {"dropped": ("?", "num")}))),
            "filtered_by_kind": ("?", ("map", ("?", "num"))), "status": ("?", ("map", "any"))}
MANIFEST_FIELDS: dict[str, Any] = {
    "format": ("?", "str"), "source": ("?", "str"), "host": ("?", "str"),
    "command": ("?", ("list", "any")), "exit_code": ("?", "int"),
    "devices": ("list", _DEVICE), "versions": ("?", ("map", "any")),
    "ranks": ("list", "rank"), "rows": ("map", "count"),
    "clock": ("?", {"domain": ("?", "str"), "anchors": ("?", ("map", "any"))}),
    "capture_overhead": ("?", ("map", "any")), "dropped_events": ("?", "num"),
    "category_counts": ("?", ("map", ("map", "num"))), "unknown_categories": ("?", ("map", "num")),
    "trace_bytes": ("?", "num"), "processes": ("?", ("list", _PROCESS)), "status": ("?", ("map", "any")),
    "finished_ns": ("?", "int"), "notes": ("?", ("list", "str")), "skipped": ("?", ("map", "any")),
    "rank_source": ("?", ("map", "any")),
    "program": ("?", {"exit_code": ("?", "int"), "unflushed_pids": ("?", ("list", "any")),
                      "lost_at_most_ms": ("?", "num")}),
}
_I64 = 2**63  # numbers are int64 (or floats within its range): what Arrow, DuckDB and orjson take
_WANT = {"int": "a 64-bit integer", "count": "a non-negative 64-bit integer", "rank": "a rank (an integer from 0 to 2^31-1)",
         "num": "a finite number under 2^63 in size", "str": "a string", "list": "a list", "map": "an object"}


def _kind_of(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true/false"
    if isinstance(v, int):
        return f"the integer {v}" if abs(v) < 10**12 else "an integer"
    if isinstance(v, float):
        return f"the number {v!r}"
    return {str: "a string", list: "a list", dict: "an object"}.get(type(v), type(v).__name__)


def _type_error(spec: Any, v: Any) -> str | None:
    """Why ``v`` is not of ``spec`` at this level (None: it is)."""
    if isinstance(spec, tuple) and spec[0] == "?":
        return None if v is None else _type_error(spec[1], v)
    if isinstance(spec, dict):
        return None if isinstance(v, dict) else f"is {_kind_of(v)}, expected an object"
    if isinstance(spec, tuple):
        want = list if spec[0] == "list" else dict
        return None if isinstance(v, want) else f"is {_kind_of(v)}, expected {_WANT[spec[0]]}"
    is_int = isinstance(v, int) and not isinstance(v, bool) and -_I64 <= v < _I64
    ok = {"any": True, "str": isinstance(v, str), "int": is_int, "count": is_int and v >= 0,
          "rank": is_int and 0 <= v < 2**31,
          "num": (is_int or isinstance(v, float)) and -_I64 < v < _I64}[spec]  # NaN compares False
    return None if ok else f"is {_kind_of(v)}, expected {_WANT[spec]}"


_LEAF_TYPES = {"int": {int}, "count": {int}, "rank": {int}, "num": {int, float}, "str": {str}}


def _leaves_ok(spec: Any, values: list[Any]) -> bool:
    """Whether all ``values`` are of the leaf type ``spec``, checked in C-level loops (a
    manifest listing millions of ranks).  False also means "check one by one" (not a leaf)."""
    nullable = isinstance(spec, tuple) and spec[0] == "?"
    leaf = spec[1] if nullable else spec
    if not isinstance(leaf, str):
        return False
    if leaf == "any":
        return True
    types = set(map(type, values))
    if nullable and type(None) in types:
        types.discard(type(None))
        values = [x for x in values if x is not None]
    if not types <= _LEAF_TYPES[leaf]:
        return False
    if leaf == "str" or not values:
        return True
    if leaf == "num" and not all(map(math.isfinite, values)):
        return False
    low = {"count": 0, "rank": 0}.get(leaf, -_I64)
    return min(values) >= low and max(values) < (2**31 if leaf == "rank" else _I64)


def _check_field(path: Path, name: str, spec: Any, v: Any) -> None:
    problem = _type_error(spec, v)
    if problem:
        raise InputError(path, f"corrupt manifest: field '{name}' {problem}")
    if isinstance(spec, tuple) and spec[0] == "?":
        if v is not None:
            _check_field(path, name, spec[1], v)
    elif isinstance(spec, dict):
        for key, sub in spec.items():
            if key in v:
                _check_field(path, f"{name}.{key}", sub, v[key])
    elif isinstance(spec, tuple) and spec[0] == "list":
        if not _leaves_ok(spec[1], v):
            for i, x in enumerate(v):
                _check_field(path, f"{name}[{i}]", spec[1], x)
    elif isinstance(spec, tuple) and spec[0] == "map" and not _leaves_ok(spec[1], list(v.values())):
        for key, x in v.items():
            _check_field(path, f"{name}.{_key(key)}", spec[1], x)


def read_manifest(run_dir: Path, manifest_name: str = "run.json") -> dict[str, Any]:
    """A run directory's manifest, read safely and checked: a JSON object whose
    ``schema_version`` this pastaprof reads and whose known fields have their types."""
    from pastaprof.events.schema import SCHEMA_VERSION

    path = run_dir / manifest_name
    if not os.path.lexists(path):
        raise InputError(run_dir, f"not a pastaprof run (no {manifest_name})")
    m = load_json(path, MAX_MANIFEST_BYTES, root=run_dir, label="corrupt manifest: ")
    if not isinstance(m, dict):
        raise InputError(path, f"corrupt manifest: {_kind_of(m)}, expected a JSON object")
    v = m.get("schema_version")
    if not (isinstance(v, int) and not isinstance(v, bool)):
        raise InputError(path, f"corrupt manifest: field 'schema_version' is {_kind_of(v)}, expected an integer")
    if v != SCHEMA_VERSION:
        raise InputError(path, f"schema version {v} is not supported (this pastaprof reads {SCHEMA_VERSION})")
    for name, spec in MANIFEST_FIELDS.items():
        if name in m:
            _check_field(path, name, spec, m[name])
    ranks = m.get("ranks")
    if ranks is not None and len(set(ranks)) != len(ranks):
        raise InputError(path, "corrupt manifest: field 'ranks' lists a rank twice")
    return m


