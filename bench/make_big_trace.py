#!/usr/bin/env python3
"""Build a big Kineto trace by replicating the bundled real trace along the time axis.

The source is pastaprof's example (GPT-2 small, 3 training steps, recorded on an
H200: ~70k events, ~22 MB of JSON).  Copy ``c`` (0-based) of every event is shifted
by ``c * period`` in ``ts`` (period = span of the events + a gap) and gets unique
ids: every id namespace is shifted by ``c * stride`` with a stride that is a power
of ten larger than the namespace's largest value in the original:

* correlation: ``args.correlation`` and the ids of ``ac2g`` flow events (s/f) --
  one namespace, because Kineto's ac2g flow id *is* the correlation id;
* ``args."External id"``;
* ``fwdbwd`` flow ids (s/f);
* ``args."Python id"`` and ``args."Python parent id"`` (null parents stay null);
* ``args."Sequence number"``.

Metadata events (``"ph": "M"``) are written once.  The three trace-global events
are written once too: the ``Trace`` span ("PyTorch Profiler (0)") is stretched over
all copies, "Iteration Start" keeps its time, "Record Window End" moves to the last
copy.  The output keeps Kineto's own layout byte for byte: the original header, the
``"traceEvents": [`` line, one pretty-printed event after another (each copy is the
original event text with only the numbers above replaced), the trailer with
``traceName``.

The text of the original is used as a template: it is split into literal pieces and
numeric *slots* once; each copy is then one ``str.join`` of the literals with the
shifted numbers, streamed to the output file.  Nothing holds more than one copy
(~22 MB) in memory.  Timestamps are shifted in integer nanoseconds, so no float
rounding creeps in (every ts keeps exactly 3 decimals).

Usage (pastaprof's venv has orjson):

    .venv/bin/python bench/make_big_trace.py                 # 57 copies -> ~4.0 M events, ~1.27 GB
    .venv/bin/python bench/make_big_trace.py --copies 2 --verify
"""

from __future__ import annotations

import argparse
import gzip
import math
import os
import re
import sys
import time
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "src" / "pastaprof" / "data" / "example_gpt2_train_3steps.pt.trace.json.gz"
OUT_DIR = Path("/tmp/pastaprof-bench")
DEFAULT_COPIES = 57  # 57 x 70,325 + 63 = 4,008,588 events; 1.27e9 bytes (= 1.18 GiB)

# A numeric value of one of the keys we shift (only top-level "ts"/"dur"/"id" and the
# args keys below ever appear with these exact names in a Kineto event).
SLOT_RE = re.compile(
    r'"(ts|dur|id|correlation|External id|Python id|Python parent id|Sequence number)": ?(-?\d+(?:\.\d+)?)'
)
ARG_NS = {"correlation": "corr", "External id": "ext", "Python id": "py", "Python parent id": "py",
          "Sequence number": "seq"}
NAMESPACES = ("corr", "ext", "fwdbwd", "py", "seq")


def ts_to_ns(text: str) -> int:
    """'5152965157358.957' -> 5152965157358957, exactly (no float)."""
    neg = text.startswith("-")
    whole, _, frac = text.lstrip("-").partition(".")
    ns = int(whole) * 1000 + int((frac + "000")[:3] or "0")
    if len(frac) > 3 and int(frac[3:]):
        raise ValueError(f"timestamp {text} has sub-ns digits")
    return -ns if neg else ns


def ns_to_ts(ns: int) -> str:
    return f"{ns // 1000}.{ns % 1000:03d}" if ns >= 0 else "-" + ns_to_ts(-ns)


def split_trace(text: str) -> tuple[str, list[str], str]:
    """(header up to and including the '[' of traceEvents, event texts, trailer from ']')."""
    m = re.search(r'"traceEvents"\s*:\s*\[', text)
    if not m:
        raise SystemExit("source has no traceEvents array")
    start = m.end()
    end = text.rindex("]", 0, text.rindex('"traceName"'))
    body = text[start:end]
    # Kineto pretty-prints each event as "\n  {\n    ...\n  }" joined by ","; nested
    # objects are indented deeper, so "\n  }," + "\n  {" is always an event boundary.
    parts = re.split(r"(?<=\n  \}),(?=\n  \{)", body)
    trail_ws = re.search(r"\s*$", parts[-1]).group(0)
    parts[-1] = parts[-1][: len(parts[-1]) - len(trail_ws)]
    return text[:start], parts, trail_ws + text[end:]


class Template:
    """One copy's worth of event text, as literals interleaved with numeric slots."""

    def __init__(self, events: list[str]) -> None:
        self.literals: list[str] = []
        kinds: list[str] = []
        values: list[int] = []
        pending = ""
        for i, ev_text in enumerate(events):
            ev = orjson.loads(ev_text)
            pending += ("," if i else "")
            flow_ns = None
            if ev.get("ph") in ("s", "f"):
                flow_ns = {"ac2g": "corr", "fwdbwd": "fwdbwd"}.get(ev.get("cat"))
            pos = 0
            for m in SLOT_RE.finditer(ev_text):
                key, num = m.group(1), m.group(2)
                if key == "ts":
                    kind, val = "ts", ts_to_ns(num)
                elif key == "id" and flow_ns:
                    kind, val = flow_ns, int(num)
                elif key in ARG_NS and key in (ev.get("args") or {}):
                    kind, val = ARG_NS[key], int(num)
                    if ev["args"][key] != val:
                        raise SystemExit(f"slot mismatch for {key!r} in {ev_text[:200]}")
                else:
                    continue  # dur, non-flow "id": copied as they are
                pending += ev_text[pos : m.start(2)]
                self.literals.append(pending)
                pending = ""
                kinds.append(kind)
                values.append(val)
                pos = m.end(2)
            pending += ev_text[pos:]
        self.literals.append(pending)
        self.kinds = kinds
        self.values = values
        self.n_events = len(events)

    def render(self, ts_shift_ns: int, id_shift: dict[str, int]) -> str:
        vals: list[str] = []
        append = vals.append
        for kind, v in zip(self.kinds, self.values, strict=True):
            if kind == "ts":
                v += ts_shift_ns
                s = str(v)
                append(s[:-3] + "." + s[-3:])  # ts > 1 s always in Kineto (epoch-ish us)
            else:
                append(str(v + id_shift[kind]))
        out = [""] * (2 * len(vals) + 1)
        out[::2] = self.literals
        out[1::2] = vals
        return "".join(out)


def build(copies: int, out_path: Path, gap_us: float, src: Path) -> dict:
    t0 = time.perf_counter()
    with gzip.open(src, "rb") as fh:
        text = fh.read().decode("utf-8")
    header, events, trailer = split_trace(text)
    parsed = [orjson.loads(e) for e in events]
    # Self-check of the split: same events as a real JSON parse of the whole file.
    full = orjson.loads(text)
    if len(full["traceEvents"]) != len(parsed) or full["traceEvents"] != parsed:
        raise SystemExit("event split does not match the JSON parse of the source")

    def is_global(e: dict) -> bool:
        return e.get("cat") == "Trace" or (e.get("ph") == "i" and e.get("cat") is None)

    rep_idx = [i for i, e in enumerate(parsed) if e.get("ph") != "M" and not is_global(e)]
    once_idx = [i for i, e in enumerate(parsed) if e.get("ph") == "M" or is_global(e)]
    rep = [parsed[i] for i in rep_idx]

    starts = [ts_to_ns(f"{e['ts']:.3f}") for e in rep]
    ends = [s + round(float(e.get("dur", 0)) * 1000) for s, e in zip(starts, rep, strict=True)]
    span_ns = max(ends) - min(starts)
    period_ns = span_ns + round(gap_us * 1000)
    period_ns = -(-period_ns // 1000) * 1000  # whole microseconds

    maxima = {ns: 0 for ns in NAMESPACES}
    tmpl = Template([events[i] for i in rep_idx])
    for kind, v in zip(tmpl.kinds, tmpl.values, strict=True):
        if kind != "ts":
            maxima[kind] = max(maxima[kind], v)
    strides = {k: 10 ** max(1, math.ceil(math.log10(m + 1))) if m else 10 for k, m in maxima.items()}
    for k, m in maxima.items():
        assert strides[k] > m

    # Events written once: metadata and the trace-global span / instants.
    once_texts = []
    for i in once_idx:
        e, t = parsed[i], events[i]
        if e.get("cat") == "Trace" and "dur" in e:
            new_dur = ns_to_ts(ts_to_ns(f"{e['dur']:.3f}") + (copies - 1) * period_ns)
            t = re.sub(r'"dur": ?[\d.]+', f'"dur": {new_dur}', t, count=1)
        elif e.get("name") == "Record Window End":
            new_ts = ns_to_ts(ts_to_ns(f"{e['ts']:.3f}") + (copies - 1) * period_ns)
            t = re.sub(r'"ts": ?[\d.]+', f'"ts": {new_ts}', t, count=1)
        once_texts.append(t)

    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(out_path.name + ".partial")
    n_events = 0
    with open(tmp, "wb", buffering=16 << 20) as out:
        out.write(header.encode())
        for c in range(copies):
            block = tmpl.render(c * period_ns, {k: c * strides[k] for k in strides})
            out.write(((",") if c else "").encode() + block.encode())
            n_events += tmpl.n_events
        out.write(("," + ",".join(once_texts)).encode())
        n_events += len(once_texts)
        out.write(trailer.encode())
    os.replace(tmp, out_path)
    size = out_path.stat().st_size
    return {
        "path": str(out_path), "bytes": size, "events": n_events, "copies": copies,
        "source_events": len(parsed), "source_bytes": len(text.encode()),
        "events_per_copy": tmpl.n_events, "written_once": len(once_texts),
        "span_us": span_ns / 1000, "period_us": period_ns / 1000, "id_strides": strides, "id_maxima": maxima,
        "bytes_per_event": size / n_events, "seconds": time.perf_counter() - t0,
    }


def verify(path: Path, info: dict) -> None:
    """Parse the whole output with orjson and check counts, ids and times (small outputs only)."""
    with open(path, "rb") as fh:
        d = orjson.loads(fh.read())
    ev = d["traceEvents"]
    assert len(ev) == info["events"], (len(ev), info["events"])
    assert "traceName" in d and "deviceProperties" in d
    copies = info["copies"]
    corr = [e["args"]["correlation"] for e in ev if e.get("cat") == "kernel"]
    assert len(set(corr)) == len(corr), "kernel correlation ids not unique"
    pyid = [e["args"]["Python id"] for e in ev if e.get("cat") == "python_function"]
    assert len(set(pyid)) == len(pyid), "Python ids not unique"
    meta = [e for e in ev if e.get("ph") == "M"]
    src_meta = info["written_once"] - 3
    assert len(meta) == src_meta, (len(meta), src_meta)
    ac2g = {(e["ph"], e["id"]) for e in ev if e.get("cat") == "ac2g"}
    n_ac2g = sum(1 for e in ev if e.get("cat") == "ac2g")
    assert len(ac2g) == n_ac2g, "ac2g flow ids not unique per phase"
    # every kernel's correlation has a launching runtime call in the same copy
    rt = {e["args"]["correlation"] for e in ev if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e["args"]}
    assert all(c in rt for c in corr), "kernel without launch after shifting"
    print(f"verify: ok ({len(ev):,} events, {copies} copies, unique ids)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--copies", type=int, default=DEFAULT_COPIES, help=f"copies of the example (default {DEFAULT_COPIES})")
    ap.add_argument("--gap-us", type=float, default=1000.0, help="idle gap between copies, us (default 1000)")
    ap.add_argument("-o", "--out", type=Path, help="output file (default /tmp/pastaprof-bench/gpt2_x<copies>.pt.trace.json)")
    ap.add_argument("--source", type=Path, default=EXAMPLE, help="Kineto trace to replicate (.json.gz)")
    ap.add_argument("--verify", action="store_true", help="re-parse the output with orjson and check it (needs ~5x its size in RAM)")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = ap.parse_args(argv)
    if args.copies < 1:
        ap.error("--copies must be >= 1")
    out = args.out or OUT_DIR / f"gpt2_x{args.copies}.pt.trace.json"
    info = build(args.copies, out, args.gap_us, args.source)
    if args.json:
        print(orjson.dumps(info).decode())
    else:
        print(f"wrote {info['path']}: {info['bytes']:,} bytes ({info['bytes'] / 1e9:.3f} GB, "
              f"{info['bytes'] / 2**30:.3f} GiB), {info['events']:,} events "
              f"({info['copies']} copies x {info['events_per_copy']:,} + {info['written_once']} once; "
              f"{info['bytes_per_event']:.1f} B/event) in {info['seconds']:.1f} s")
        print(f"  source: {info['source_events']:,} events, {info['source_bytes']:,} bytes; "
              f"span {info['span_us']:.3f} us, period {info['period_us']:.0f} us; id strides {info['id_strides']}")
    if args.verify:
        verify(out, info)
    return 0


if __name__ == "__main__":
    sys.exit(main())
