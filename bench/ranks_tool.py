"""Benchmark of the ranks tool on generated jobs (pastaprof.testing.jobs): N ranks in 2-D groups,
one planted straggler and skewed clocks.  Reports the generation, the end-to-end analyze
(`analyze DIR -t ranks`: import + map per rank + combine), the map and combine alone on the
loaded tables, the summaries' size and the peak RSS, and checks the straggler is found.

    python bench/ranks_tool.py 16 64 256
"""

from __future__ import annotations

import resource
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.compute as pc

from pastaprof import api
from pastaprof.testing import ClockSkew, Straggler, make_job
from pastaprof.tools.ranks import Ranks


def one(n: int, root: Path) -> dict:
    out = root / f"job{n}"
    t = time.perf_counter()
    make_job(out, ranks=n, steps=4, tp=8 if n >= 16 else None, plants=[Straggler(n - 3, 2, 20_000_000, "compute"),
                                                                      ClockSkew(spread_ns=5_000_000)])
    gen = time.perf_counter() - t
    t = time.perf_counter()
    rep = next(r for r in api.analyze(out, tools=["ranks"]) if r.tool == "ranks")
    e2e = time.perf_counter() - t
    ev = rep.findings[0].evidence
    assert (ev["rank"], ev["step"]) == (n - 3, "ProfilerStep#2"), ev
    run = api.load(out)
    tool = Ranks()
    tables = {k: run.table(k) for k in tool.consumes}
    per_rank = {r: {k: x.filter(pc.equal(x["rank"], r)) for k, x in tables.items()} for r in range(n)}
    t = time.perf_counter()
    sums = {r: tool.map_rank(r, per_rank[r]) for r in range(n)}
    mapped = time.perf_counter() - t
    t = time.perf_counter()
    tool.combine(sums)
    combined = time.perf_counter() - t
    size = sum(x.nbytes for s in sums.values() for x in s.values())
    events = sum(x.num_rows for x in tables.values())
    return {"ranks": n, "events": events, "generate_s": round(gen, 2), "analyze_s": round(e2e, 2),
            "map_ms_per_rank": round(1000 * mapped / n, 2), "combine_s": round(combined, 3),
            "summary_kb_per_rank": round(size / n / 1024, 1),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}


def main() -> None:
    sizes = [int(x) for x in sys.argv[1:]] or [16, 64]
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            print(one(n, Path(tmp)), flush=True)


if __name__ == "__main__":
    main()
