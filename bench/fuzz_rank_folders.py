#!/usr/bin/env python3
"""Fuzzer of rank assignment: random folders of real traces, every case must end in a
report whose kernel count is exactly that of the traces it says it read, or in one
PastaprofError line.

    .venv/bin/python bench/fuzz_rank_folders.py                 # 200 cases, seed 1
    .venv/bin/python bench/fuzz_rank_folders.py --cases 50 --seed 7

Each case copies 1-5 real traces (tests/data, tests/data/ddp_mlp_2ranks) into a folder
under names drawn from what profilers write (rank-N, tensorboard_trace_handler's
host_pid.time, plain names, huge or zero-padded ranks), some with distributedInfo set to
hostile values or moved in time, and adds execution traces, configs and hidden files.
Outcomes: ok (the kernels tool counted exactly the kernels of the files in the
manifest's rank_source, no file counted twice), clean (PastaprofError), wrong (a count
that does not add up), traceback.  Target: 0 wrong, 0 tracebacks.  A case is a pure
function of (seed, index).
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import shutil
import sys
import tempfile
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
SOURCES = sorted(DATA.glob("*.pt.trace.json.gz")) + sorted((DATA / "ddp_mlp_2ranks").glob("*.json.gz"))
ET = DATA / "ranks" / "pytorch_et.json.gz"
RANK_VALUES = [0, 1, 2, 7, -1, 2**31 - 1, 2**31, 2**40, "1", 1.0, True, None, [0], {"r": 1}]


def kernels_of(path: Path) -> int:
    doc = json.loads(gzip.open(path).read())
    return sum(1 for e in doc["traceEvents"] if e.get("cat") == "kernel" and e.get("ph") == "X")


def _name(rng: random.Random, i: int) -> str:
    kind = rng.choice(["rank", "rank_pad", "tb", "tb_same", "plain", "huge"])
    if kind == "rank":
        return f"rank-{rng.choice([0, 1, 2, 3, i])}.pt.trace.json.gz"
    if kind == "rank_pad":
        return f"worker_rank{rng.choice(['0', '01', '007'])}_{i}.json.gz"
    if kind == "tb":
        return f"node{rng.randint(0, 2)}_{rng.randint(100, 103)}.{1790000000000000000 + i}.pt.trace.json.gz"
    if kind == "tb_same":
        return f"node0_100.{1790000000000000000 + i}.pt.trace.json.gz"
    if kind == "huge":
        return f"rank-{rng.choice(['99999999999', '2147483648', '2147483647'])}.pt.trace.json.gz"
    return f"trace_{i}.pt.trace.json.gz"


def _write(src: Path, dest: Path, rng: random.Random) -> None:
    if rng.random() < 0.5:
        shutil.copy(src, dest)
        return
    doc = json.loads(gzip.open(src).read())
    if rng.random() < 0.5:
        shift = rng.choice([1e6, 5e6, -3e6])
        for e in doc["traceEvents"]:
            if isinstance(e.get("ts"), (int, float)):
                e["ts"] += shift
    if rng.random() < 0.5:
        doc["distributedInfo"] = {"rank": rng.choice(RANK_VALUES), "world_size": rng.choice([2, 4, 2**31, "x"])}
    events = doc.pop("traceEvents")
    head, tail = (doc, {}) if rng.random() < 0.8 else ({}, doc)
    body = json.dumps(head)[:-1] + (", " if head else "") + '"traceEvents": ' + json.dumps(events)
    body += (", " + json.dumps(tail)[1:]) if tail else "}"
    dest.write_bytes(gzip.compress(body.encode()))


def make_case(folder: Path, seed: int, index: int) -> dict[str, int]:
    """Fill ``folder``; return the kernel count of each trace file written."""
    rng = random.Random(seed * 1_000_003 + index)
    counts: dict[str, int] = {}
    for i in range(rng.randint(1, 5)):
        src = rng.choice(SOURCES)
        name = _name(rng, i)
        if name in counts:
            continue
        _write(src, folder / name, rng)
        counts[name] = KERNELS[src]
    if rng.random() < 0.3:
        (folder / "pytorch_et.json").write_bytes(gzip.open(ET).read())
    if rng.random() < 0.2:
        (folder / "config.json").write_text(json.dumps({"lr": 0.1, "rank": 1}))
    if rng.random() < 0.1:
        (folder / "._rank-0.pt.trace.json.gz").write_bytes(b"\x00\x05\x16\x07")
    return counts


def run_case(seed: int, index: int) -> tuple[str, str]:
    import pastaprof
    from pastaprof.errors import PastaprofError
    from pastaprof.importers import iter_ranks

    with tempfile.TemporaryDirectory(prefix="pastaprof-fuzz-ranks-") as tmp:
        folder = Path(tmp) / "job"
        folder.mkdir()
        counts = make_case(folder, seed, index)
        try:
            metas = [m for _r, _t, m in iter_ranks(folder, note=lambda _line: None)]
            report = pastaprof.analyze(folder, tools=["kernels"])[0]
        except PastaprofError as e:
            msg = str(e)
            return ("clean", msg) if "\n" not in msg else ("wrong", f"a message of several lines: {msg!r}")
        except Exception:
            return "traceback", traceback.format_exc(limit=6)
        read = [m["file"] for m in metas]
        want = sum(counts[f] for f in read)
        got = report.summary.get("kernels", 0)
        if len(read) != len(set(read)) or got != want:
            return "wrong", f"kernels {got} != {want} of {read}"
        return "ok", ""


KERNELS = {s: kernels_of(s) for s in SOURCES}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    outcomes: dict[str, int] = {"ok": 0, "clean": 0, "wrong": 0, "traceback": 0}
    for i in range(args.cases):
        what, detail = run_case(args.seed, i)
        outcomes[what] += 1
        if what in ("wrong", "traceback"):
            print(f"{args.seed}:{i} {what}: {detail}", file=sys.stderr)
    print(json.dumps({"seed": args.seed, "cases": args.cases, "counts": outcomes}))
    return 0 if outcomes["wrong"] == outcomes["traceback"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
