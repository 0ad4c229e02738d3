#!/usr/bin/env python3
"""A job of real-size rank shards: time, CPU and peak RSS of ``pastaprof analyze`` on it.

Why: bench/many_ranks.py measures many *small* shards (~3k events each, where the per-file cost of the
importer dominates); a real job has fewer ranks with big traces.  Here each rank's shard is
``--copies`` copies of the bundled real GPT-2 trace (H200, 3 training steps, ~70k events) made by
bench/make_big_trace.py, so 16 ranks of 4 copies are ~4.5 M events: about the 57-copy 1.28 GB trace's
steps split over 16 ranks.  Shard r is the template with ``distributedInfo`` (rank r, world size N,
NCCL) added to its header and its host pid moved to ``100000 + r``; nothing else changes (so its
events, ids and times are those of a real capture, every rank the same program).

Each command runs in a child process measured from outside (bench/import_bench.measure: wall time,
user + sys CPU seconds and peak RSS from wait4):

    pastaprof analyze JOB -q --json OUT [-t TOOLS] [--engine ENGINE]

Usage:
    .venv/bin/python bench/real_size_ranks.py                       # 16 ranks x 4 copies, default tools
    .venv/bin/python bench/real_size_ranks.py --ranks 4 --copies 1 --engine dask
Results: a line per run on stdout, everything as JSON in --results.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from import_bench import _git_state, machine_info, measure  # noqa: E402
from make_big_trace import EXAMPLE  # noqa: E402
from make_big_trace import build as build_copies  # noqa: E402

REPO = HERE.parent
WORK = Path("/tmp/pastaprof-bench/real_size_ranks")
HOST_PID = b'"pid": 434,'  # the bundled example's host process (its cpu_op events)
EVENTS_ARRAY = b'"traceEvents": ['


def build_job(ranks: int, copies: int, root: Path = WORK) -> tuple[Path, int]:
    """A folder of ``ranks`` shards of ``copies`` copies each (built once, then reused), and its events."""
    out = root / f"job_{ranks}x{copies}"
    done = out / ".complete"
    if done.exists():
        return out, int(done.read_text())
    out.mkdir(parents=True, exist_ok=True)
    template = root / f"template_x{copies}.pt.trace.json"
    info = build_copies(copies, template, 1000.0, EXAMPLE)
    text = template.read_bytes()
    if text.count(EVENTS_ARRAY) != 1 or HOST_PID not in text:
        raise SystemExit(f"{template}: not the bundled example's layout (no single traceEvents / host pid 434)")
    for r in range(ranks):
        dist = json.dumps({"backend": "nccl", "rank": r, "world_size": ranks,
                           "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "backend": "nccl",
                                          "pg_size": ranks, "ranks": list(range(ranks))}]}).encode()
        shard = text.replace(EVENTS_ARRAY, b'"distributedInfo": ' + dist + b",\n  " + EVENTS_ARRAY, 1)
        shard = shard.replace(HOST_PID, f'"pid": {100000 + r},'.encode())
        (out / f"rank-{r}.pt.trace.json").write_bytes(shard)
    template.unlink()
    events = info["events"] * ranks
    done.write_text(str(events))
    return out, events


def run_once(job: Path, tools: str | None, engine: str | None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        js = Path(tmp) / "out.json"
        cmd = [str(REPO / ".venv" / "bin" / "pastaprof"), "analyze", str(job), "-q", "--json", str(js)]
        cmd += (["-t", tools] if tools else []) + (["--engine", engine] if engine else [])
        m = measure(cmd)
        m.pop("stdout", None)
        if m["rc"] == 0:
            doc = json.loads(js.read_text())
            m["findings"] = len(doc.get("findings", []))
            m["steps"] = doc.get("tools", {}).get("steps", {}).get("summary", {}).get("steps")
    return m


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=16, help="ranks in the job (default 16)")
    ap.add_argument("--copies", type=int, default=4, help="copies of the example per shard (default 4)")
    ap.add_argument("-t", "--tools", action="append", default=None,
                    help="-t of analyze, one run each (repeatable; default: the default tools)")
    ap.add_argument("--engine", default=None, help="--engine of analyze (default: analyze's default)")
    ap.add_argument("--results", type=Path, default=WORK / "results.json")
    args = ap.parse_args()
    if args.ranks < 1 or args.copies < 1:
        ap.error("--ranks and --copies must be >= 1")
    job, events = build_job(args.ranks, args.copies)
    size = sum(p.stat().st_size for p in job.glob("rank-*"))
    rows = []
    for tools in args.tools or [None]:
        m = run_once(job, tools, args.engine)
        cpu = m["user_s"] + m["sys_s"]
        m.update(ranks=args.ranks, copies=args.copies, events=events, bytes=size, tools=tools or "default")
        rows.append(m)
        print(f"{args.ranks} ranks x {args.copies} copies ({events:,} events, {size / 1e9:.2f} GB)  "
              f"tools {tools or 'default'}  rc={m['rc']}  wall {m['wall_s']:.1f} s  CPU {cpu:.1f} s "
              f"({cpu / events * 1e6:.1f} us/event)  peak RSS {m['peak_rss_bytes'] / 2**20:.0f} MiB  "
              f"steps {m.get('steps')}  findings {m.get('findings')}", flush=True)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps({"machine": machine_info(), "git": _git_state(), "engine": args.engine,
                                        "rows": rows}, indent=1, default=str))


if __name__ == "__main__":
    main()
