"""A cheap look at the first bytes of a JSON file: what it is, before importing it.

A folder of traces often holds other JSON too: a PyTorch execution trace (Chakra
ET) written next to the Kineto trace, a config file.  Reading the first bytes
(at most ``SNIFF_BYTES``, decompressed) tells them apart from Kineto traces by
their top-level keys, and yields the trace's header (``distributedInfo``,
``host_name``) and the process id of its first events -- what rank assignment
needs -- without staging the whole file.
"""

from __future__ import annotations

import json
import re
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import orjson

SNIFF_BYTES = 1 << 20   # decompressed bytes read from the start of a file
EVENTS_SEEN = 64        # first events parsed for the process id and start time

# Event categories recorded on the host process (their pid is the process's pid).
HOST_CATEGORIES = {"cpu_op", "operator", "user_annotation", "python_function", "cuda_runtime", "runtime",
                   "cuda_driver", "driver", "hip_runtime", "hip_driver"}
# Top-level keys of a PyTorch execution trace (ExecutionTraceObserver, Chakra host ET).
ET_KEYS = {b"schema", b"start_ts", b"finish_ts"}
ET_WHY = "a PyTorch execution trace (Chakra ET, read by the execution_trace importer)"

STEPS = 50_000           # strings, keys and brackets looked at, at most: a hostile head stays cheap

_JSON_ATOM = re.compile(rb"true|false|null|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?")
# No regex walks a string: on a hostile head (an unterminated string full of escaped
# quotes) one would be quadratic.  Strings end where _string_end says (bytes.find).
_STRUCT = re.compile(rb'["{}\[\]]')           # where a string or a bracket starts
_SPACE = re.compile(rb"\s*")
_ATOM = re.compile(rb'[^\s{}\[\]:,"]+')


class _Cut(Exception):
    """The head ends (or the step budget does) before the answer: undecided."""


@dataclass
class Sniff:
    """What the first bytes of a file say.  ``kind``: ``trace`` (a Kineto/Chrome
    trace, or undecided: the importer then judges), ``et`` (an execution trace) or
    ``json`` (JSON that is no trace); ``why``: for ``et``/``json``, in words;
    ``decided``: False when the bytes ran out first (then ``header`` is unknown)."""

    kind: str
    why: str = ""
    header: dict[str, Any] = field(default_factory=dict)
    pid: int | None = None
    first_ts: float | None = None
    decided: bool = True


def sniff(path: Path) -> Sniff:
    """Classify ``path`` from at most ``SNIFF_BYTES`` of its (decompressed) start."""
    try:
        with open(path, "rb") as raw:
            head = raw.read(SNIFF_BYTES)
            if head[:2] == b"\x1f\x8b":
                head = _gunzip_head(raw, head)
    except OSError:
        return Sniff("trace", decided=False)  # unreadable: the importer says why, in one line
    return classify(head)


def _gunzip_head(raw: BinaryIO, first: bytes) -> bytes:
    """The first ``SNIFF_BYTES`` of a gzip stream; of a corrupt or truncated one,
    what decompresses before the damage."""
    d = zlib.decompressobj(31)
    out: list[bytes] = []
    got, block = 0, first
    try:
        while got < SNIFF_BYTES and block and not d.eof:
            part = d.decompress(block, SNIFF_BYTES - got)
            out.append(part)
            got += len(part)
            block = d.unconsumed_tail or raw.read(1 << 16)
    except zlib.error:
        pass
    return b"".join(out)


def classify(head: bytes) -> Sniff:
    """Classify the first bytes of a JSON document (see :func:`sniff`)."""
    text = head[3:] if head.startswith(b"\xef\xbb\xbf") else head
    pos = _SPACE.match(text, 0).end()
    c = text[pos:pos + 1]
    try:
        if c == b"[":
            nxt = _SPACE.match(text, pos + 1).end()
            if nxt < len(text) and text[nxt:nxt + 1] not in (b"{", b"]"):
                return Sniff("json", "a JSON array that holds no trace events")
            return _with_events(Sniff("trace"), text, pos)
        if c == b"{":
            return _object(text, pos)
    except _Cut:
        return Sniff("trace", decided=False)
    atom = _ATOM.match(text, pos)
    if c == b'"' or (atom is not None and _JSON_ATOM.fullmatch(atom.group())):
        return Sniff("json", "JSON that is not an object with traceEvents")
    return Sniff("trace", decided=bool(c))  # not JSON (or empty): the importer names the problem


class _Walker:
    """Skips JSON values in ``text`` on a budget of strings and brackets (numbers,
    commas and spaces between them are skipped by ``re.search``, in C)."""

    def __init__(self, text: bytes) -> None:
        self.text, self.steps = text, STEPS

    def _step(self) -> None:
        self.steps -= 1
        if self.steps < 0:
            raise _Cut

    def string_end(self, quote: int) -> int:
        """Index of the quote that closes the string opening at ``quote``.  Linear:
        each quote is looked at once (one step), each backslash run once."""
        text, j = self.text, quote
        while True:
            self._step()
            j = text.find(b'"', j + 1)
            if j < 0:
                raise _Cut
            k = j
            while text[k - 1] == 0x5C:
                k -= 1
            if (j - k) % 2 == 0:
                return j

    def skip_value(self, pos: int) -> int:
        """The position after the value starting at ``pos``."""
        text = self.text
        c = text[pos:pos + 1]
        if c == b'"':
            return self.string_end(pos) + 1
        if c not in (b"{", b"["):
            m = _ATOM.match(text, pos)
            if m is None or m.end() >= len(text):
                raise _Cut
            return m.end()
        depth = 0
        while (m := _STRUCT.search(text, pos)) is not None:
            self._step()
            at, ch = m.start(), m.group()
            if ch == b'"':
                pos = self.string_end(at) + 1
                continue
            depth += 1 if ch in (b"{", b"[") else -1
            pos = at + 1
            if depth == 0:
                return pos
        raise _Cut

    def skip_space(self, pos: int) -> int:
        pos = _SPACE.match(self.text, pos).end()
        if pos >= len(self.text):
            raise _Cut
        return pos


def _object(text: bytes, pos: int) -> Sniff:
    """A top-level object: its keys decide (traceEvents: a trace; the execution
    trace's keys with ``nodes``: an ET; closed without either: other JSON)."""
    w, keys = _Walker(text), set()
    pos = w.skip_space(pos + 1)
    while text[pos:pos + 1] != b"}":
        if text[pos:pos + 1] != b'"':
            return Sniff("trace")  # not JSON: the importer names the problem
        end = w.string_end(pos)
        key, key_start = text[pos + 1:end], pos
        pos = w.skip_space(end + 1)
        if text[pos:pos + 1] != b":":
            return Sniff("trace")
        pos = w.skip_space(pos + 1)
        keys.add(key)
        w._step()
        if key == b"traceEvents" and text[pos:pos + 1] == b"[":
            return _with_events(Sniff("trace", header=_header(text, key_start)), text, pos)
        if key == b"nodes" and keys & ET_KEYS:
            return Sniff("et", ET_WHY)
        pos = w.skip_space(w.skip_value(pos))
        if text[pos:pos + 1] == b",":
            pos = w.skip_space(pos + 1)
        elif text[pos:pos + 1] != b"}":
            return Sniff("trace")
    if b"nodes" in keys and keys & ET_KEYS:
        return Sniff("et", ET_WHY)
    return Sniff("json", "JSON without a traceEvents array")


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
    w = _Walker(text)
    pos = array_start + 1
    try:
        for _ in range(EVENTS_SEEN):
            pos = w.skip_space(pos)
            if text[pos:pos + 1] in (b"]", b""):
                break
            end = w.skip_value(pos)
            ev = _load(text[pos:end])
            if isinstance(ev, dict):
                pid, ts = _host_pid(ev), ev.get("ts")
                if pid is not None:
                    pids[pid] += 1
                if isinstance(ts, (int, float)) and not isinstance(ts, bool) and ev.get("ph") == "X":
                    first_ts = ts if first_ts is None else min(first_ts, ts)
            pos = w.skip_space(end)
            if text[pos:pos + 1] != b",":
                break
            pos += 1
    except _Cut:
        pass  # what the head holds is enough
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
