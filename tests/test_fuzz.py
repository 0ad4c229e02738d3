"""A fixed-seed slice of bench/fuzz_traces.py: mutated real traces through the real
import and the default tools (the CLI entry for every third case), each in a worker
process with a timeout.  Every case must end in reports or one PastaprofError line;
a traceback or a hang fails the test and names the case (``--replay SEED:INDEX``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench" / "fuzz_traces.py"
SEED, CASES = 20261201, 150


def _fuzzer():
    spec = importlib.util.spec_from_file_location("fuzz_traces", BENCH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("fuzz_traces", mod)
    spec.loader.exec_module(mod)
    return mod


def test_fuzz_slice_has_no_traceback_and_no_hang():
    fz = _fuzzer()
    small = [p for p in fz.SOURCES if p.exists() and p.stat().st_size < 1 << 20]  # not the 22 MB example
    res = fz.fuzz(CASES, SEED, workers=2, timeout=60.0, sources=small)
    counts = res["counts"]
    assert sum(counts.values()) == CASES
    assert counts["traceback"] == 0 and counts["hang"] == 0, res["failures"][:5]
    # the slice reaches both ends: traces read and traces refused in one line
    assert counts["ok"] >= CASES // 5 and counts["clean"] >= CASES // 5


def test_cases_are_a_function_of_the_seed():
    fz = _fuzzer()
    bases = fz.make_bases(sources=[p for p in fz.SOURCES if p.name.startswith("leak_5steps")])
    assert [fz.make_case(bases, SEED, i) for i in range(20)] == [fz.make_case(bases, SEED, i) for i in range(20)]
    kinds = {fz.make_case(bases, SEED, i)[2].split(": ")[1] for i in range(40)}
    assert len(kinds) > 10  # many different mutations
