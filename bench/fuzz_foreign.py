#!/usr/bin/env python3
"""Structural fuzzer of the foreign importers: mutated real files of every format but Kineto
(bench/fuzz_traces.py covers that one) through the real import and the default tools.

    .venv/bin/python bench/fuzz_foreign.py --cases 400 --seed 20261202            # every format
    .venv/bin/python bench/fuzz_foreign.py --formats et,snapshot --cases 200 --seed 7
    .venv/bin/python bench/fuzz_foreign.py --replay rocpd:7:42                      # one case

Formats and what is mutated (each a pure function of (format, seed, index)):

* ``et``: a Chakra execution trace (tests/data/ranks/pytorch_et.json.gz) with a node's
  fields, inputs/outputs or attributes set to junk, its top-level keys broken, or the
  text cut or its bytes flipped (tests/test_execution_trace.py's mutations);
* ``snapshot``: CUDA memory snapshots (tests/data/snapshots/*.pickle) with entries,
  frames and segments of wrong types, truncated or flipped pickles;
* ``rocpd``: rocprofv3 SQLite databases with a table dropped, columns set to text,
  blobs, huge or negative numbers, bytes flipped, the file cut;
* ``nsys``: the Nsight Systems exports (tests/data/nsys/*.sqlite) under the same SQLite
  mutations.

Every case runs in a worker process (bench/fuzz_traces.py's pool: a case past its timeout
is a hang) through ``pastaprof.analyze`` or, every third case, the CLI's ``analyze --json``.
Outcomes: ok, clean (one PastaprofError line), traceback, hang.  Target: 0 and 0.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"
DATA = TESTS / "data"
FORMATS = ("et", "snapshot", "rocpd", "nsys")
SUFFIX = {"et": ".et.json", "snapshot": ".pickle", "rocpd": ".db", "nsys": ".sqlite"}


def _module(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, mod)
    spec.loader.exec_module(mod)
    return mod


def _mutators() -> dict[str, Any]:
    """The tests' mutation functions (one definition of each format's damage)."""
    sys.path.insert(0, str(TESTS))  # the test modules import conftest
    et = _module("test_execution_trace", TESTS / "test_execution_trace.py")
    snap = _module("test_memory_snapshot", TESTS / "test_memory_snapshot.py")
    rocpd = _module("test_rocpd", TESTS / "test_rocpd.py")
    return {"et": et, "snapshot": snap, "rocpd": rocpd}


class Cases:
    """Writes case ``index`` of ``fmt`` and ``seed`` into a directory."""

    def __init__(self) -> None:
        self.m = _mutators()
        self.et_doc = self.m["et"]._raw_et()
        self.et_text = gzip.decompress(self.m["et"].ET.read_bytes())
        names = ["train_step.pickle", "leak.pickle", "oom.pickle"]
        self.snaps = [((DATA / "snapshots" / n).read_bytes(), self.m["snapshot"]._load(n)) for n in names]
        self.dbs = {"rocpd": [DATA / "rocpd" / n for n in self.m["rocpd"].SINGLES],
                    "nsys": sorted((DATA / "nsys").glob("*.sqlite"))}

    def write(self, fmt: str, seed: int, index: int, out: Path) -> Path:
        rng = random.Random(f"{fmt}:{seed}:{index}")
        path = out / f"{fmt}{index}{SUFFIX[fmt]}"
        if fmt == "et":
            path.write_bytes(self.m["et"]._case(rng, self.et_doc, self.et_text))
        elif fmt == "snapshot":
            base, snap = self.snaps[index % len(self.snaps)]
            path.write_bytes(self.m["snapshot"]._mutations(rng, base, snap))
        else:
            shutil.copy(rng.choice(self.dbs[fmt]), path)
            self.m["rocpd"]._mutate(rng, path)
        return path


def fuzz(formats: list[str], cases: int, seed: int, timeout: float = 120.0) -> dict[str, Any]:
    """``cases`` cases of each format; counts per format and the failing cases."""
    fz = _module("fuzz_traces", REPO / "bench" / "fuzz_traces.py")
    made = Cases()
    counts = {f: {"ok": 0, "clean": 0, "traceback": 0, "hang": 0} for f in formats}
    failures: list[dict[str, str]] = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="pastaprof-fuzz-foreign-") as tmp:
        paths: dict[int, tuple[str, int, Path]] = {}

        def jobs():
            n = 0
            for i in range(cases):
                for fmt in formats:
                    p = made.write(fmt, seed, i, Path(tmp))
                    paths[n] = (fmt, i, p)
                    yield n, str(p), n % 3 == 0
                    n += 1

        def on_result(n: int, status: str, detail: str) -> None:
            fmt, i, p = paths.pop(n)
            counts[fmt][status] += 1
            if status in ("traceback", "hang"):
                failures.append({"case": f"{fmt}:{seed}:{i}", "status": status, "detail": detail})
            p.unlink(missing_ok=True)
            p.with_suffix(".out.json").unlink(missing_ok=True)

        pool = fz.Pool(1, timeout)
        try:
            pool.run(jobs(), on_result)
        finally:
            pool.close()
    return {"seed": seed, "cases_per_format": cases, "counts": counts, "failures": failures,
            "seconds": round(time.monotonic() - t0, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--formats", default=",".join(FORMATS), help=f"comma-separated, of {', '.join(FORMATS)}")
    ap.add_argument("--cases", type=int, default=200, help="cases per format")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per case before it counts as a hang")
    ap.add_argument("--results", type=Path, help="write counts and failures as JSON here")
    ap.add_argument("--replay", metavar="FORMAT:SEED:INDEX", help="run one case in this process")
    args = ap.parse_args()
    if args.replay:
        fmt, seed, index = args.replay.split(":")
        fz = _module("fuzz_traces", REPO / "bench" / "fuzz_traces.py")
        with tempfile.TemporaryDirectory() as tmp:
            p = Cases().write(fmt, int(seed), int(index), Path(tmp))
            print(fmt, p.stat().st_size, "bytes", fz.run_one(str(p), int(index) % 3 == 0))
        return
    formats = [f for f in args.formats.split(",") if f]
    bad = [f for f in formats if f not in FORMATS]
    if bad:
        print(f"fuzz_foreign: unknown format {bad[0]!r} (known: {', '.join(FORMATS)})", file=sys.stderr)
        sys.exit(2)
    res = fuzz(formats, args.cases, args.seed, args.timeout)
    print(json.dumps({k: v for k, v in res.items() if k != "failures"}))
    for f in res["failures"][:50]:
        print(f"{f['status']:<9} {f['case']:<20} {f['detail'][:400]}")
    if args.results:
        args.results.write_text(json.dumps(res, indent=1))
    sys.exit(1 if res["failures"] else 0)


if __name__ == "__main__":
    main()
