#!/usr/bin/env python3
"""Structural fuzzer of the trace importer: mutated real traces through the real import
and the default tools; every case must end in a report or a PastaprofError.

    .venv/bin/python bench/fuzz_traces.py                      # 10,000 cases, seed 1, 2 workers
    .venv/bin/python bench/fuzz_traces.py --cases 500 --seed 7 --workers 1 --keep /tmp/fuzz-failures
    .venv/bin/python bench/fuzz_traces.py --replay 1:4242      # one case (seed:index), in this process

Each case starts from a small window (a few hundred events, metadata events kept) of a
real trace -- tests/data/*.json.gz, tests/data/foreign, tests/data/recorded, the bundled
GPT-2 example -- and applies one to three mutations: wrong types, missing and extra keys,
whole kinds missing (no ops, no frames, no launches), duplicated ids, hostile names (control characters, 1 MB names, lone surrogates, invalid
UTF-8), numbers at int64/float extremes, NaN/Infinity, nested garbage, broken metadata
(deviceProperties, distributedInfo, baseTimeNanoseconds), unknown phases, entries that
are not objects, other top-level shapes (bare arrays, log arrays after traceEvents, keys
in any order, traceEvents twice), truncation at a random byte, gzip corruption; and
bench/fuzz_mutations.py's classes (hostile values at every level, times, ids, duplicate keys,
encodings, concatenated documents, structural cuts, gzip of garbage/empty/multi-member).  The case
is written to a file and run in a worker process -- through the CLI entry in-process
(``analyze PATH -q --json OUT``, every third case) or ``pastaprof.analyze`` -- with a
per-case timeout (a worker past it is killed and counted as a hang).

Outcomes: ok (reports), clean (PastaprofError: one line, exit 2), traceback (anything
else), hang.  Target: 0 tracebacks, 0 hangs.  Failing cases are listed with their
``seed:index`` (``--replay`` runs one again) and, with --keep, their files are kept.
A case is a pure function of (seed, index): the same seed gives the same cases.
"""

from __future__ import annotations

import argparse
import copy
import gzip
import io
import json
import multiprocessing as mp
import os
import random
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fuzz_mutations  # noqa: E402 - the other fuzzer's mutation classes, beside this file

REPO = Path(__file__).resolve().parent.parent
SOURCES = [*sorted((REPO / "tests" / "data").glob("*.json.gz")),
           *sorted((REPO / "tests" / "data" / "foreign").glob("*.json")),
           *sorted((REPO / "tests" / "data" / "ddp_mlp_2ranks").glob("*.json.gz")),
           *sorted((REPO / "tests" / "data" / "recorded").glob("*.pt.trace.json.gz")),
           REPO / "src" / "pastaprof" / "data" / "example_gpt2_train_3steps.pt.trace.json.gz"]
WINDOW = 250          # events per base sample (plus the trace's metadata events)
BASES_PER_TRACE = 3   # windows cut from each real trace
I64 = 2**63 - 1
EXTREME_NUMBERS = [I64, -I64 - 1, 2**64, 2**70, -(2**70), 1e308, -1e308, 1e-320, -0.0, 0, -1, 2**53 + 1]
WRONG_VALUES: list[Any] = [None, True, False, "", "x", "12", "stream 7", "NaN", -1, 0, 1.5, I64, -I64 - 1,
                           2**64, 1e308, [], [1, 2], {}, {"a": 1}, [[[]]], "\u0000\u001b[31m"]
FIELDS = ["ph", "cat", "name", "pid", "tid", "ts", "dur", "id", "args", "s", "bp"]
ARG_KEYS = ["correlation", "External id", "external id", "device", "stream", "grid", "block", "bytes",
            "Python id", "Python parent id", "Sequence number", "Input Dims", "Input type", "Addr", "Bytes",
            "Total Allocated", "Total Reserved", "Device Id", "Device Type", "registers per thread",
            "shared memory", "Collective name", "In msg nelems", "Group size", "dtype", "Process Group Ranks"]
CATEGORIES = ["kernel", "cuda_runtime", "cpu_op", "python_function", "gpu_memcpy", "gpu_memset", "cuda_sync",
              "cpu_instant_event", "ac2g", "user_annotation", "gpu_user_annotation", "mtia_ccp_events",
              "mtia_runtime", "Kernel", "Runtime", "nonsense_cat", ""]


# ----------------------------------------------------------------------------- bases


def _load(path: Path) -> Any:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return json.loads(raw)


def make_bases(seed: int = 0, sources: list[Path] | None = None) -> list[dict[str, Any]]:
    """Small windows of the real traces: the metadata events plus ``WINDOW`` consecutive
    events in time order (so ops, their frames, launches and kernels stay together)."""
    rng = random.Random(seed)
    bases = []
    for path in SOURCES if sources is None else sources:
        if not path.exists():
            continue
        doc = _load(path)
        events = doc["traceEvents"] if isinstance(doc, dict) else doc
        meta = {k: v for k, v in doc.items() if k != "traceEvents"} if isinstance(doc, dict) else {}
        head = [e for e in events if isinstance(e, dict) and e.get("ph") == "M"]
        rest = sorted((e for e in events if isinstance(e, dict) and e.get("ph") != "M"),
                      key=lambda e: e.get("ts") if isinstance(e.get("ts"), (int, float)) else 0)
        for _ in range(BASES_PER_TRACE):
            lo = rng.randrange(max(1, len(rest) - WINDOW))
            bases.append({"name": path.name, "meta": meta, "events": head + rest[lo : lo + WINDOW]})
    return bases


# ----------------------------------------------------------------------------- mutations
# Each takes (rng, doc) where doc = {"meta": {...}, "events": [...], "shape": ..., "post": [...]}
# and mutates it in place; "post" collects byte-level steps run after serialization.


def _some(rng: random.Random, events: list, k: int | None = None) -> list:
    objs = [e for e in events if isinstance(e, dict)]
    if not objs:
        return []
    return rng.sample(objs, min(len(objs), k if k is not None else rng.randint(1, 20)))


def m_drop_category(rng, doc):
    """Whole kinds missing: no ops, no Python frames, no launches, no kernels (partial traces)."""
    gone = set(rng.sample(["cpu_op", "python_function", "cuda_runtime", "cuda_driver", "kernel", "ac2g",
                           "cpu_instant_event", "gpu_memset", "user_annotation"], rng.randint(1, 3)))
    if rng.random() < 0.3:  # or only the user's own frames (the library's and the modules' stay)
        doc["events"] = [e for e in doc["events"] if not (isinstance(e, dict) and e.get("cat") == "python_function"
                         and not str(e.get("name", "")).startswith(("nn.Module: ", "torch/", "<built-in")))]
    else:
        doc["events"] = [e for e in doc["events"] if not (isinstance(e, dict) and str(e.get("cat")) in gone)]


def m_wrong_type(rng, doc):
    for e in _some(rng, doc["events"]):
        if rng.random() < 0.6:
            e[rng.choice(FIELDS)] = copy.deepcopy(rng.choice(WRONG_VALUES))
        else:
            args = e.setdefault("args", {})
            if isinstance(args, dict):
                args[rng.choice(ARG_KEYS)] = copy.deepcopy(rng.choice(WRONG_VALUES))


def m_drop_keys(rng, doc):
    for e in _some(rng, doc["events"], rng.randint(1, 60)):
        for key in rng.sample(FIELDS, rng.randint(1, 3)):
            e.pop(key, None)
        if isinstance(e.get("args"), dict) and rng.random() < 0.5:
            for key in list(e["args"])[: rng.randint(1, 4)]:
                e["args"].pop(key, None)


def m_extra_keys(rng, doc):
    for e in _some(rng, doc["events"]):
        e[rng.choice(["extra", "ph2", "Ts", "args ", "\u00e9", "x" * 300])] = copy.deepcopy(rng.choice(WRONG_VALUES))
        if isinstance(e.get("args"), dict):
            e["args"]["zz_" + str(rng.randrange(100))] = copy.deepcopy(rng.choice(WRONG_VALUES))


def m_dup_ids(rng, doc):
    events = doc["events"]
    key = rng.choice(["correlation", "External id", "Python id", "Python parent id", "Sequence number"])
    value = rng.choice([1, 0, -1, I64, 5115])
    for e in _some(rng, events, rng.randint(2, 80)):
        if isinstance(e.get("args"), dict):
            e["args"][key] = value
    if rng.random() < 0.5:  # whole events twice
        events.extend(dict(e) for e in _some(rng, events, rng.randint(1, 50)))  # shallow: args may be 500 deep
    if rng.random() < 0.3:
        for e in _some(rng, events, 30):
            e["id"] = value


def m_hostile_name(rng, doc):
    choices = ["\x00\x01\x07\x1b[2J\r\n\t", "\ud800", "\udfff\ud800x", "a" * (1 << 20), "\u202e\u0007bidi",
               "]}{[\"\\", "nn.Module: " + "\x1b]8;;x\x07", "f.py(12): \x00", "\\u0000", "\U0001f600" * 1000]
    for e in _some(rng, doc["events"], rng.randint(1, 10)):
        field = rng.choice(["name", "cat", "name", "pid", "tid"])
        e[field] = rng.choice(choices)
    if rng.random() < 0.3:
        doc["post"].append("bad_utf8")


def m_extreme_numbers(rng, doc):
    for e in _some(rng, doc["events"]):
        field = rng.choice(["ts", "dur", "pid", "tid", "id"])
        e[field] = rng.choice(EXTREME_NUMBERS)
        if isinstance(e.get("args"), dict) and rng.random() < 0.5:
            e["args"][rng.choice(ARG_KEYS)] = rng.choice(EXTREME_NUMBERS)
    if rng.random() < 0.3:
        doc["meta"]["baseTimeNanoseconds"] = rng.choice(EXTREME_NUMBERS)


def m_nan_inf(rng, doc):
    for e in _some(rng, doc["events"]):
        e[rng.choice(["ts", "dur", "pid"])] = rng.choice([float("nan"), float("inf"), float("-inf")])
    if rng.random() < 0.2:
        doc["meta"]["baseTimeNanoseconds"] = float("nan")


def _nested(depth: int, lists: bool) -> Any:
    deep: Any = 1
    for _ in range(depth):
        deep = [deep] if lists else {"a": deep}
    return deep


def m_nested_garbage(rng, doc):
    depth, lists = rng.choice([5, 100, 500]), rng.random() < 0.5
    for e in _some(rng, doc["events"], rng.randint(1, 5)):
        if rng.random() < 0.5:
            e["args"] = _nested(depth, lists)
        else:
            e.setdefault("args", {})
            if isinstance(e["args"], dict):
                e["args"][rng.choice(ARG_KEYS)] = _nested(depth, lists)


def m_bad_metadata(rng, doc):
    meta = doc["meta"]
    key = rng.choice(["deviceProperties"] * 4 + ["distributedInfo", "baseTimeNanoseconds", "traceName",
                                                  "schemaVersion", "cuda_driver_version", "displayTimeUnit"])
    meta[key] = rng.choice([
        [{"id": "zero", "name": 5}], [{"id": 1.5}], [{"id": None, "totalGlobalMem": "lots"}], ["x", 3, None],
        [{"id": "0", "name": "\x1b[2Jdev", "numSms": -1}, {"id": 0}, {"id": [0]}, {"id": 2**40}, {"id": -3}],
        [{"id": 0, "totalGlobalMem": float("inf"), "numSms": "many", "name": ["x"]}, {"id": True}],
        {"id": 0}, "string", None, 7, [{"id": I64 + 1}], {"rank": "3"}, {"rank": -5}, {"rank": 2**40},
        {"rank": True}, [[]], float("nan"),
    ])


def m_unknown_phase(rng, doc):
    for e in _some(rng, doc["events"]):
        e["ph"] = rng.choice(["B", "E", "i", "I", "b", "e", "n", "C", "P", "O", "N", "D", "Q", "", "XX", "x"])


def m_not_objects(rng, doc):
    events = doc["events"]
    for _ in range(rng.randint(1, 5)):
        events.insert(rng.randrange(len(events) + 1), copy.deepcopy(rng.choice([1, "e", None, [], [1, {}], True])))


def m_categories(rng, doc):
    for e in _some(rng, doc["events"]):
        e["cat"] = rng.choice(CATEGORIES)


def m_shape(rng, doc):
    doc["shape"] = rng.choice(["bare", "info_after", "events_first", "events_last", "twice", "bom", "minified",
                               "empty_events", "not_array", "samples_after"])


def m_truncate(rng, doc):
    doc["post"].append("truncate")


def m_gzip_corrupt(rng, doc):
    doc["post"].append(rng.choice(["gzip", "gzip_truncate", "gzip_flip"]))


def m_raw_bytes(rng, doc):
    doc["post"].append(rng.choice(["raw_control", "flip", "raw_nan", "nul"]))


# Mutations that end most cases in an error come once, the others twice (more cases reach
# linking and the tools).
MUTATIONS = [m_drop_category, m_wrong_type, m_drop_keys, m_extra_keys, m_dup_ids, m_hostile_name, m_extreme_numbers,
             m_nested_garbage, m_bad_metadata, m_unknown_phase, m_categories, m_shape] * 2 + \
            [m_nan_inf, m_not_objects, m_truncate, m_gzip_corrupt, m_raw_bytes] + \
    fuzz_mutations.MUTATIONS


# ----------------------------------------------------------------------------- serialization


def _serialize(doc: dict[str, Any]) -> bytes:
    events, meta, shape = doc["events"], dict(doc["meta"]), doc["shape"]
    dumps = lambda v: json.dumps(v, allow_nan=True, separators=(",", ":") if shape == "minified" else None)  # noqa: E731
    ev = dumps(events)
    if shape == "bare":
        return ev.encode()
    if shape == "empty_events":
        ev = "[]"
    if shape == "not_array":
        ev = dumps({"events": events[:3]})
    items = [(json.dumps(k), dumps(v)) for k, v in meta.items()]
    if shape == "info_after":  # as torch >= 2.4's Kineto writes its log after the events
        items.append(('"INFO"', dumps(["Chrome Trace written to x]", "log [with] \"quotes\" {and braces}"])))
    if shape == "samples_after":
        items.append(('"samples"', dumps([{"ts": i, "cpu": [i, "]"]} for i in range(50)])))
    pos = 0 if shape == "events_first" else len(items) if shape in ("events_last", "info_after", "samples_after") \
        else min(len(items), max(0, len(items) - 1))
    items.insert(pos, ('"traceEvents"', ev))
    if shape == "twice":
        items.append(('"traceEvents"', "[]"))
    text = "{\n" + ",\n".join(f"  {k}: {v}" for k, v in items) + "\n}"
    return (("\ufeff" if shape == "bom" else "") + text).encode("utf-8", "surrogatepass")


def _post(rng: random.Random, data: bytes, steps: list[str]) -> tuple[bytes, bool]:
    gz = False
    for step in steps:
        if step == "truncate" and data:
            data = data[: rng.randrange(len(data))]
        elif step == "bad_utf8":
            i = data.find(b'"name"')
            if i >= 0:
                data = data[: i + 9] + rng.choice([b"\xff\xfe", b"\xc3", b"\xed\xa0\x80", b"\x80"]) + data[i + 9 :]
        elif step == "raw_control":
            i = data.find(b'"name"')
            if i >= 0:
                data = data[: i + 9] + b"\x01\n\x1b" + data[i + 9 :]
        elif step == "flip" and data:
            b = bytearray(data)
            for _ in range(rng.randint(1, 8)):
                b[rng.randrange(len(b))] = rng.randrange(256)
            data = bytes(b)
        elif step == "raw_nan":
            data = data.replace(b'"ts": ', rng.choice([b'"ts": NaN, "x": ', b'"ts": -Infinity, "x": ']), 3)
        elif step == "nul" and data:
            i = rng.randrange(len(data))
            data = data[:i] + b"\x00" * rng.randint(1, 4) + data[i:]
        elif step.startswith("gzip"):
            buf = io.BytesIO()
            with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as g:
                g.write(data)
            data, gz = buf.getvalue(), True
            if step == "gzip_truncate":
                data = data[: rng.randrange(2, max(3, len(data)))]
            elif step == "gzip_flip":
                b = bytearray(data)
                for _ in range(rng.randint(1, 4)):
                    b[rng.randrange(10, len(b))] = rng.randrange(256)
                data = bytes(b)
        elif step in fuzz_mutations.STEPS:
            data, was_gz = fuzz_mutations.post_step(rng, data, step)
            gz = gz or was_gz
    return data, gz


def make_case(bases: list[dict[str, Any]], seed: int, index: int) -> tuple[bytes, bool, str]:
    """(file bytes, gzipped, description) of case ``index`` of ``seed``."""
    rng = random.Random(seed * 1_000_003 + index)
    base = rng.choice(bases)
    doc = {"meta": copy.deepcopy(base["meta"]), "events": [copy.deepcopy(e) for e in base["events"]],
           "shape": "object", "post": []}
    muts = list(dict.fromkeys(rng.choices(MUTATIONS, k=rng.choice([1, 1, 2, 2, 3]))))
    for m in muts:
        m(rng, doc)
    if not any(p.startswith(("gzip", "gz_")) for p in doc["post"]) and rng.random() < 0.3:
        doc["post"].append("gzip")
    data, gz = _post(rng, _serialize(doc), doc["post"])
    return data, gz, f"{base['name']}: {', '.join(m.__name__[2:] for m in muts)} {doc['shape']} {doc['post']}"


# ----------------------------------------------------------------------------- running


def run_one(path: str, via_cli: bool) -> tuple[str, str]:
    """Run one case file; ("ok"|"clean"|"traceback", detail)."""
    from pastaprof.errors import PastaprofError

    try:
        if via_cli:
            from pastaprof.cli import cli

            out = Path(path).with_suffix(".out.json")
            try:
                cli.main(["analyze", path, "-q", "--json", str(out)], prog_name="pastaprof", standalone_mode=False)
            except SystemExit as e:
                if e.code not in (0, 2, None):
                    return "traceback", f"exit code {e.code}"
                return ("clean" if e.code == 2 else "ok"), ""
            return "ok", ""
        import pastaprof

        pastaprof.analyze(path)
        return "ok", ""
    except PastaprofError as e:
        msg = str(e)
        if "\n" in msg:
            return "traceback", f"multi-line error: {msg[:200]!r}"
        return "clean", msg[:200]
    except BaseException as e:  # noqa: BLE001 - everything else is the failure we look for
        tb = traceback.format_exception(type(e), e, e.__traceback__)
        return "traceback", f"{type(e).__name__}: {str(e)[:200]} | {''.join(tb[-3:])[-600:]}"


def _worker(conn) -> None:
    import pastaprof  # noqa: F401 - import once, before the first case

    devnull = os.open(os.devnull, os.O_WRONLY)  # the cases' notes and error lines: not the fuzzer's output
    os.dup2(devnull, 2)
    sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the worker

    while True:
        job = conn.recv()
        if job is None:
            return
        conn.send(run_one(*job))


class Pool:
    """Worker processes that each run one case at a time; a case past its timeout
    kills its worker (a hang) and a fresh one takes its place."""

    def __init__(self, n: int, timeout: float) -> None:
        self.ctx = mp.get_context("fork")
        self.timeout = timeout
        self.workers = [self._spawn() for _ in range(n)]

    def _spawn(self):
        parent, child = self.ctx.Pipe()
        p = self.ctx.Process(target=_worker, args=(child,), daemon=True)
        p.start()
        return [p, parent, None, 0.0]  # process, pipe, current job, started

    def run(self, jobs, on_result) -> None:
        jobs = iter(jobs)
        busy = 0
        exhausted = False
        while True:
            for w in self.workers:
                if w[2] is None and not exhausted:
                    job = next(jobs, None)
                    if job is None:
                        exhausted = True
                        continue
                    w[1].send(job[1:])
                    w[2], w[3] = job, time.monotonic()
                    busy += 1
            if busy == 0:
                return
            for i, w in enumerate(self.workers):
                if w[2] is None:
                    continue
                if w[1].poll(0.01):
                    try:
                        status, detail = w[1].recv()
                    except EOFError:  # the worker died (a crash of the interpreter itself)
                        status, detail = "traceback", f"worker died (exit {w[0].exitcode})"
                        self.workers[i] = self._spawn()
                    on_result(w[2][0], status, detail)
                    w[2] = None
                    busy -= 1
                elif time.monotonic() - w[3] > self.timeout or not w[0].is_alive():
                    hung = w[0].is_alive()
                    w[0].kill()
                    w[0].join()
                    on_result(w[2][0], "hang" if hung else "traceback",
                              f"no answer in {self.timeout:.0f} s" if hung else f"worker died ({w[0].exitcode})")
                    self.workers[i] = self._spawn()
                    busy -= 1

    def close(self) -> None:
        for w in self.workers:
            try:
                w[1].send(None)
            except OSError:
                pass
            w[0].join(5)
            if w[0].is_alive():
                w[0].kill()


def fuzz(cases: int, seed: int, workers: int = 1, timeout: float = 60.0, keep: Path | None = None,
         start: int = 0, report_every: int = 0, log: Path | None = None,
         sources: list[Path] | None = None) -> dict[str, Any]:
    """Run cases ``start .. start+cases-1`` of ``seed``; counts and the failing cases."""
    bases = make_bases(sources=sources)
    counts = {"ok": 0, "clean": 0, "traceback": 0, "hang": 0, "not_made": 0}
    failures: list[dict[str, Any]] = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="pastaprof-fuzz-") as tmp:
        descr: dict[int, str] = {}

        def jobs():
            for i in range(start, start + cases):
                try:
                    data, gz, what = make_case(bases, seed, i)
                except Exception as e:  # noqa: BLE001 - the fuzzer's own failure: counted, the run goes on
                    counts["not_made"] += 1
                    failures.append({"case": f"{seed}:{i}", "status": "not_made", "what": "", "detail": repr(e)[:200]})
                    continue
                path = Path(tmp) / f"case{i}.json{'.gz' if gz else ''}"
                path.write_bytes(data)
                descr[i] = what
                yield i, str(path), i % 3 == 0

        def on_result(i: int, status: str, detail: str) -> None:
            counts[status] += 1
            path = Path(tmp) / f"case{i}.json"
            for p in (path, path.with_name(path.name + ".gz")):
                if status in ("traceback", "hang") and keep is not None and p.exists():
                    keep.mkdir(parents=True, exist_ok=True)
                    p.replace(keep / f"{seed}_{i}{''.join(p.suffixes)}")
                p.unlink(missing_ok=True)
                p.with_suffix(".out.json").unlink(missing_ok=True)
            if status in ("traceback", "hang"):
                failures.append({"case": f"{seed}:{i}", "status": status, "what": descr.get(i, ""), "detail": detail})
                if log is not None:
                    with open(log, "a") as f:
                        f.write(json.dumps(failures[-1]) + "\n")
            done = sum(counts.values())
            if report_every and done % report_every == 0:
                rate = done / max(time.monotonic() - t0, 1e-9)
                print(f"  {done:>6} cases  {counts}  {rate:.1f}/s", file=sys.stderr, flush=True)
                if log is not None:
                    with open(log, "a") as f:
                        f.write(json.dumps({"done": done, "counts": counts, "seconds": round(time.monotonic() - t0)})
                                + "\n")

        pool = Pool(workers, timeout)
        try:
            pool.run(jobs(), on_result)
        finally:
            pool.close()
    return {"seed": seed, "cases": cases, "start": start, "counts": counts, "failures": failures,
            "seconds": round(time.monotonic() - t0, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--start", type=int, default=0, help="first case index (to split a run)")
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per case before it counts as a hang")
    ap.add_argument("--keep", type=Path, help="keep the files of failing cases here")
    ap.add_argument("--results", type=Path, help="write counts and failures as JSON here")
    ap.add_argument("--log", type=Path, help="append each failure and the running counts here (JSON lines)")
    ap.add_argument("--replay", metavar="SEED:INDEX", help="run one case in this process, with its traceback")
    args = ap.parse_args()
    if args.replay:
        seed, index = (int(x) for x in args.replay.split(":"))
        data, gz, what = make_case(make_bases(), seed, index)
        with tempfile.TemporaryDirectory() as tmp:
            p = Path(tmp) / f"case.json{'.gz' if gz else ''}"
            p.write_bytes(data)
            print(what, len(data), "bytes")
            print(run_one(str(p), index % 3 == 0))
        return
    res = fuzz(args.cases, args.seed, args.workers, args.timeout, args.keep, args.start, report_every=250,
               log=args.log)
    print(json.dumps({k: v for k, v in res.items() if k != "failures"}))
    for f in res["failures"][:50]:
        print(f"{f['status']:<9} {f['case']:<10} {f['what'][:90]}\n          {f['detail'][:300]}")
    if args.results:
        args.results.write_text(json.dumps(res, indent=1))
    sys.exit(1 if res["counts"]["traceback"] or res["counts"]["hang"] else 0)


if __name__ == "__main__":
    main()
