"""A cheap look at the first bytes of a JSON file: what it is, before importing it.

A folder of traces often holds other JSON too: a PyTorch execution trace (Chakra
ET) written next to the Kineto trace, a config file.  Reading the first bytes
(at most ``SNIFF_BYTES``, decompressed) tells them apart from Kineto traces by
their top-level keys, and yields the trace's header (``distributedInfo``,
``host_name``) and the process id of its first events -- what rank assignment
needs -- without staging the whole file.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

SNIFF_BYTES = 1 << 20   # decompressed bytes read from the start of a file
EVENTS_SEEN = 200       # first events parsed for the process id and start time

# Event categories recorded on the host process (their pid is the process's pid).
HOST_CATEGORIES = {"cpu_op", "operator", "user_annotation", "python_function", "cuda_runtime", "runtime",
                   "cuda_driver", "driver", "hip_runtime", "hip_driver"}
# Top-level keys of a PyTorch execution trace (ExecutionTraceObserver, Chakra host ET).
ET_KEYS = {b"schema", b"start_ts", b"finish_ts"}
ET_WHY = "a PyTorch execution trace (Chakra ET; no importer for it yet)"

_JSON_ATOM = re.compile(rb"true|false|null|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?")
_TOKEN = re.compile(rb'\s*(?:("(?:[^"\\]|\\.)*")|([{}\[\]:,])|([^\s{}\[\]:,"]+))', re.S)


@dataclass
class Sniff:
    """What the first bytes of a file say.  ``kind``: ``trace`` (a Kineto/Chrome
    trace, or undecided: the importer then judges), ``et`` (an execution trace) or
    ``json`` (JSON that is no trace); ``why``: for ``et``/``json``, in words."""

    kind: str
    why: str = ""
    header: dict[str, Any] = field(default_factory=dict)
    pid: int | None = None
    first_ts: float | None = None


def sniff(path: Path) -> Sniff:
    """Classify ``path`` from at most ``SNIFF_BYTES`` of its (decompressed) start."""
    try:
        with open(path, "rb") as raw:
            if raw.read(2) == b"\x1f\x8b":
                raw.seek(0)
                with gzip.GzipFile(fileobj=raw, mode="rb") as gz:
                    head = _read_upto(gz, SNIFF_BYTES)
            else:
                raw.seek(0)
                head = raw.read(SNIFF_BYTES)
    except (OSError, EOFError, zlib.error):
        return Sniff("trace")  # unreadable: the importer says why, in one line
    return classify(head)


def _read_upto(f: Any, n: int) -> bytes:
    parts, got = [], 0
    try:
        while got < n:
            block = f.read(n - got)
            if not block:
                break
            parts.append(block)
            got += len(block)
    except (OSError, EOFError, zlib.error):
        pass  # a corrupt or truncated gzip stream: judge the bytes that did come
    return b"".join(parts)


def classify(head: bytes) -> Sniff:
    """Classify the first bytes of a JSON document (see :func:`sniff`)."""
    text = head[3:] if head.startswith(b"\xef\xbb\xbf") else head
    tokens = _tokens(text, 0)
    first = next(tokens, None)
    if first is None:
        return Sniff("trace")  # empty or not JSON: the importer names the problem
    pos, string, punct, _atom = first
    if punct == b"[":
        nxt = next(tokens, None)
        if nxt is not None and nxt[2] not in (b"{", b"]"):
            return Sniff("json", "a JSON array that holds no trace events")
        return _with_events(Sniff("trace"), text, pos)
    if punct != b"{":
        if string is not None or (_atom is not None and _JSON_ATOM.fullmatch(_atom)):
            return Sniff("json", "JSON that is not an object with traceEvents")
        return Sniff("trace")  # not JSON: the importer names the problem
    return _object(text, tokens)


def _tokens(text: bytes, pos: int):
    """(start, string, punctuation, atom) per JSON token from ``pos``; stops at the
    first byte that starts no token (an unterminated string at the cut)."""
    n = len(text)
    while pos < n:
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            return
        string, punct, atom = m.group(1), m.group(2), m.group(3)
        if string is None and punct is None and atom is None:
            return  # only whitespace left
        start = m.start(1) if string is not None else m.start(2) if punct is not None else m.start(3)
        yield start, string, punct, atom
        pos = m.end()


def _object(text: bytes, tokens) -> Sniff:
    """A top-level object: its depth-1 keys decide (traceEvents: a trace; the
    execution trace's keys with ``nodes``: an ET; closed without either: other JSON)."""
    depth, keys = 1, set()
    last_string: tuple[int, bytes] | None = None
    pending: tuple[int, bytes] | None = None  # a depth-1 key whose value comes next
    for pos, string, punct, _atom in tokens:
        if pending is not None:
            key_start, key = pending
            pending = None
            if key == b"traceEvents" and punct == b"[":
                return _with_events(Sniff("trace", header=_header(text, key_start)), text, pos)
            if key == b"nodes" and keys & ET_KEYS:
                return Sniff("et", ET_WHY)
        if punct in (b"{", b"["):
            depth += 1
        elif punct in (b"}", b"]"):
            depth -= 1
            if depth == 0:
                return Sniff("et", ET_WHY) if b"nodes" in keys and keys & ET_KEYS else \
                    Sniff("json", "JSON without a traceEvents array")
        elif punct == b":" and depth == 1 and last_string is not None:
            keys.add(last_string[1])
            pending = last_string
        last_string = (pos, string[1:-1]) if string is not None and depth == 1 else None
    return Sniff("trace")  # undecided within the bound: the importer judges


def _header(text: bytes, key_start: int) -> dict[str, Any]:
    """The metadata before ``"traceEvents"`` as a dict.
    Parsed by the standard library: orjson turns integers beyond 64 bits into
    floats, and a hostile rank of 2**70 must be reported as what it is.  The header
    is a few kilobytes."""
    body = text[:key_start].rstrip().rstrip(b",") + b"}"
    try:
        meta = json.loads(body)
    except (ValueError, RecursionError):
        return {}
    return meta if isinstance(meta, dict) else {}


def _with_events(s: Sniff, text: bytes, array_start: int) -> Sniff:
    """Fill ``pid`` (the most common pid of host-side events, or of the CPU process
    label) and ``first_ts`` from the first events after the array's '['."""
    pids: Counter[int] = Counter()
    first_ts = None
    depth, start, seen = 0, -1, 0
    for pos, _string, punct, _atom in _tokens(text, array_start + 1):
        if punct in (b"{", b"["):
            if depth == 0:
                start = pos
            depth += 1
        elif punct in (b"}", b"]"):
            depth -= 1
            if depth < 0:
                break  # the array closed
            if depth == 0 and start >= 0:
                ev = _load(text[start:pos + 1])
                if isinstance(ev, dict):
                    pid, ts = _host_pid(ev), ev.get("ts")
                    if pid is not None:
                        pids[pid] += 1
                    if isinstance(ts, (int, float)) and not isinstance(ts, bool) and ev.get("ph") == "X":
                        first_ts = ts if first_ts is None else min(first_ts, ts)
                seen += 1
                if seen >= EVENTS_SEEN:
                    break
    s.pid = pids.most_common(1)[0][0] if pids else None
    s.first_ts = first_ts
    return s


def _load(b: bytes) -> Any:
    try:
        return orjson.loads(b)
    except orjson.JSONDecodeError:
        return None


def _host_pid(ev: dict[str, Any]) -> int | None:
    pid = ev.get("pid")
    if isinstance(pid, bool) or not isinstance(pid, int) or not 0 < pid < 2**31:
        return None
    cat = ev.get("cat")
    if isinstance(cat, str) and cat.lower() in HOST_CATEGORIES:
        return pid
    args = ev.get("args")
    if ev.get("ph") == "M" and ev.get("name") == "process_labels" and isinstance(args, dict) \
            and args.get("labels") == "CPU":
        return pid
    return None
