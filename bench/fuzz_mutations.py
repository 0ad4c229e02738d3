"""More mutation classes for bench/fuzz_traces.py: what a fuzzer other than ours throws at a
Kineto trace.  Document-level ones take ``(rng, doc)`` like fuzz_traces' own; byte-level ones
append a step to ``doc["post"]`` that :func:`post_step` applies to the serialized bytes.

* wrong JSON types at every level: ids/ts/dur/args as strings, floats, bools, null, objects,
  arrays, integers past int64, negative, exponent floats (1e300), raw NaN/Infinity tokens;
* duplicate keys in one object, missing and extra keys, ``traceEvents`` of another type;
* times: zero and negative durations, overlapping events on one thread, events in reverse or
  shuffled order, all at one timestamp;
* ids: duplicated correlation ids, flows (``s``/``f``) pointing nowhere, thousands of pids/tids;
* names: control, RTL, NUL characters, 100 KB names;
* bytes: UTF-16 and latin-1 encodings, a BOM, two JSON documents back to back, trailing
  garbage, truncation at a structural point (after a ``{``, ``,``, ``:``, inside a string);
* gzip: of garbage, empty, multi-member, gzip of gzip, trailing garbage after the member.
"""

from __future__ import annotations

import gzip
import json
import random
from typing import Any

I64 = 2**63 - 1
HOSTILE = [None, True, False, "", "7", "1e3", "-5", "NaN", 1.5, -1.5, 1e300, -1e300, 5e-324, I64 + 1, -(I64 + 2),
           2**64, -1, 0, [], [7], {}, {"ts": 1}, "\u202e\u0000x"]
NAMES = ["\u202eevil\u202c", "a\u0000b", "\x1b[31mred\x1b[0m", "\u2028line", "x" * 100_000, "\t\r\n", "\ufeffbom",
         "\U0010ffff", "\u0085next"]


def _objs(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in doc["events"] if isinstance(e, dict)]


def _pick(rng: random.Random, doc: dict[str, Any], k: int = 30) -> list[dict[str, Any]]:
    objs = _objs(doc)
    return rng.sample(objs, min(len(objs), rng.randint(1, k))) if objs else []


def m_hostile_values(rng, doc):
    """Every level: top-level fields, event fields and args get a value of another JSON type."""
    for e in _pick(rng, doc):
        key = rng.choice(["ts", "dur", "id", "pid", "tid", "args", "ph", "cat", "name", "s", "bp"])
        e[key] = rng.choice(HOSTILE)
        if isinstance(e.get("args"), dict):
            arg = rng.choice(["correlation", "External id", "device", "stream", "Addr", "Bytes", "grid", "block",
                              "Total Allocated", "Python id", "Ev Idx", "rank", "Input Dims", "Sequence number"])
            e["args"][arg] = rng.choice(HOSTILE)
    if rng.random() < 0.3:
        doc["meta"][rng.choice(["deviceProperties", "distributedInfo", "baseTimeNanoseconds", "schemaVersion",
                                "traceName", "displayTimeUnit"])] = rng.choice(HOSTILE)


def m_times(rng, doc):
    """Zero or negative durations, overlaps on one thread, reversed or shuffled order, one timestamp."""
    objs = _objs(doc)
    how = rng.choice(["zero", "negative", "overlap", "reverse", "shuffle", "same_ts"])
    if how == "reverse":
        doc["events"].reverse()
    elif how == "shuffle":
        rng.shuffle(doc["events"])
    for e in objs:
        if how == "zero" and "dur" in e:
            e["dur"] = 0
        elif how == "negative" and isinstance(e.get("dur"), (int, float)):
            e["dur"] = -e["dur"] - rng.choice([0, 1, 1000])
        elif how == "overlap" and isinstance(e.get("ts"), (int, float)):
            e["ts"] = objs[0].get("ts", 0) if isinstance(objs[0].get("ts"), (int, float)) else 0
            e["tid"] = objs[0].get("tid", 1)
        elif how == "same_ts" and "ts" in e:
            e["ts"] = 1


def m_ids(rng, doc):
    """Duplicated correlation ids, flows pointing nowhere, thousands of pids and tids."""
    how = rng.choice(["corr", "flows", "pids", "tids"])
    for i, e in enumerate(_objs(doc)):
        args = e.get("args")
        if how == "corr" and isinstance(args, dict) and "correlation" in args:
            args["correlation"] = 1
        elif how == "flows" and e.get("ph") in ("s", "f", "t"):
            e["id"] = rng.randrange(10**12, 10**13)
        elif how == "pids":
            e["pid"] = i
        elif how == "tids":
            e["tid"] = i * 7919
            if isinstance(args, dict) and "stream" in args:
                args["stream"] = i


def m_names(rng, doc):
    for e in _pick(rng, doc, 10):
        e[rng.choice(["name", "name", "cat"])] = rng.choice(NAMES)


def m_keys(rng, doc):
    """Missing keys, extra keys, or (at the byte level) a key twice in one object."""
    how = rng.choice(["missing", "extra", "dup"])
    if how == "dup":
        doc["post"].append(rng.choice(["dup_ts", "dup_args", "dup_ph", "dup_events"]))
        return
    for e in _pick(rng, doc, 60):
        if how == "missing":
            for k in rng.sample(["ph", "ts", "dur", "pid", "tid", "name", "cat", "args", "id"], rng.randint(1, 4)):
                e.pop(k, None)
        else:
            e[rng.choice(["TS", "Dur", "args2", "\u00fcber", ""])] = rng.choice(HOSTILE)


def m_events_type(rng, doc):
    """``traceEvents`` of another JSON type, or deeply nested."""
    doc["shape"] = "object"
    doc["post"].append(rng.choice(["events_string", "events_number", "events_null", "events_object",
                                   "events_deep", "events_true"]))


def m_bytes(rng, doc):
    doc["post"].append(rng.choice(["utf16", "utf16le", "latin1", "bom", "concat", "trailing", "cut_structural",
                                   "cut_structural", "cut_string"]))


def m_gzip(rng, doc):
    doc["post"].append(rng.choice(["gz_garbage", "gz_empty", "gz_multi", "gz_double", "gz_trailing"]))


MUTATIONS = [m_hostile_values, m_hostile_values, m_times, m_ids, m_names, m_keys, m_events_type, m_bytes, m_gzip]
STEPS = {"dup_ts", "dup_args", "dup_ph", "dup_events", "events_string", "events_number", "events_null",
         "events_object", "events_deep", "events_true", "utf16", "utf16le", "latin1", "bom", "concat", "trailing",
         "cut_structural", "cut_string", "gz_garbage", "gz_empty", "gz_multi", "gz_double", "gz_trailing"}


def _events_value(data: bytes, value: bytes) -> bytes:
    i = data.find(b'"traceEvents"')
    return data if i < 0 else data[:i] + b'"traceEvents": ' + value + b', "zz_was": ' + data[i + 14:]


def post_step(rng: random.Random, data: bytes, step: str) -> tuple[bytes, bool]:
    """Apply byte-level ``step``; (bytes, whether they are gzip)."""
    gz = False
    if step.startswith("dup_"):
        key = {"dup_ts": b'"ts": ', "dup_args": b'"args": ', "dup_ph": b'"ph": ', "dup_events": b'"traceEvents": '}[step]
        extra = rng.choice([b'"x", ', b"1, ", b"null, ", b"[], ", b"{}, "])
        data = data.replace(key, key + extra + key, rng.randint(1, 20))
    elif step.startswith("events_"):
        value = {"events_string": b'"events"', "events_number": b"42", "events_null": b"null",
                 "events_object": b'{"0": {"ph": "X"}}', "events_true": b"true",
                 "events_deep": b"[" * 5000 + b"]" * 5000}[step]
        data = _events_value(data, value)
    elif step in ("utf16", "utf16le", "latin1"):
        text = data.decode("utf-8", "surrogatepass")
        data = text.encode({"utf16": "utf-16", "utf16le": "utf-16-le", "latin1": "latin-1"}[step], "replace")
    elif step == "bom":
        data = rng.choice([b"\xef\xbb\xbf\xef\xbb\xbf", b"\xff\xfe", b"\xfe\xff", b"\x00\x00\xfe\xff"]) + data
    elif step == "concat":
        data = data + rng.choice([b"", b"\n", b" "]) + data
    elif step == "trailing":
        data = data + rng.choice([b"garbage", b"}", b"]", b",", b"\x00" * 8, b"\n{}", json.dumps([1]).encode()])
    elif step in ("cut_structural", "cut_string") and data:
        marks = b'"' if step == "cut_string" else rng.choice([b"{", b",", b":", b"[", b"}"])
        spots = [i for i in range(len(data)) if data[i:i + 1] == marks][:5000]
        if spots:
            data = data[: rng.choice(spots) + rng.choice([0, 1])]
    elif step.startswith("gz_"):
        gz = True
        if step == "gz_garbage":
            data = gzip.compress(rng.randbytes(rng.randint(0, 5000)), mtime=0)
        elif step == "gz_empty":
            data = gzip.compress(b"", mtime=0)
        elif step == "gz_multi":
            cut = rng.randrange(len(data) + 1)
            data = gzip.compress(data[:cut], mtime=0) + gzip.compress(data[cut:], mtime=0)
        elif step == "gz_double":
            data = gzip.compress(gzip.compress(data, mtime=0), mtime=0)
        else:
            data = gzip.compress(data, mtime=0) + rng.choice([b"garbage", b"\x00" * 16, b"\x1f\x8b"])
    return data, gz
