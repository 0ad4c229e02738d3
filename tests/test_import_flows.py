"""Older Kineto traces link GPU work to its launch only through ``ac2g`` flows (no
``args.correlation``): the importer must recover each link from the flow that ends at
the activity (``f``) or starts at the launch (``s``) on the same thread and time.

The input is a real trace (tests/data/two_streams_copies) with ``correlation`` taken
out of every event's args; the borrowed ids must be the ones the trace had."""

from __future__ import annotations

import gzip
from pathlib import Path

import orjson
import pyarrow.compute as pc

from pastaprof.importers.kineto import import_file

DATA = Path(__file__).parent / "data" / "two_streams_copies.pt.trace.json.gz"


def _without_correlation(tmp_path: Path) -> Path:
    trace = orjson.loads(gzip.decompress(DATA.read_bytes()))
    for e in trace["traceEvents"]:
        args = e.get("args")
        if isinstance(args, dict):
            args.pop("correlation", None)
    out = tmp_path / "no_correlation.json"
    out.write_bytes(orjson.dumps(trace))
    return out


def test_flows_give_the_correlation_back(tmp_path: Path) -> None:
    kinds = {"kernel", "memcpy", "api"}
    want, _ = import_file(DATA, kinds=kinds)
    got, _ = import_file(_without_correlation(tmp_path), kinds=kinds)
    for kind in ("kernel", "memcpy"):
        assert got[kind].num_rows == want[kind].num_rows > 0
        assert got[kind]["start_ns"].equals(want[kind]["start_ns"])
        # every activity of this trace has its ac2g flow: all ids come back
        assert got[kind]["correlation"].to_pylist() == want[kind]["correlation"].to_pylist()
    api_got, api_want = got["api"]["correlation"].to_pylist(), want["api"]["correlation"].to_pylist()
    assert got["api"]["start_ns"].equals(want["api"]["start_ns"])
    borrowed = [(g, w) for g, w in zip(api_got, api_want) if g is not None]
    assert all(g == w for g, w in borrowed)
    # the launches (one flow start each: 37 in this trace) get their id; calls without a flow have none
    starts = [e for e in orjson.loads(gzip.decompress(DATA.read_bytes()))["traceEvents"]
              if e.get("cat") == "ac2g" and e.get("ph") == "s"]
    assert len(borrowed) == len(starts) == 37
    launched = set(pc.unique(got["kernel"]["correlation"]).to_pylist()) | set(
        pc.unique(got["memcpy"]["correlation"]).to_pylist())
    assert launched <= {g for g, _ in borrowed}

