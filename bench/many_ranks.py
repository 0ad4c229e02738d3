#!/usr/bin/env python3
"""Many ranks on one machine: time and peak RSS of ``pastaprof analyze`` on jobs of N rank shards.

Jobs are built from the real 2-rank DDP trace in tests/data/ddp_mlp_2ranks (H200, NCCL): shard r is
a copy of rank ``r % 2`` with ``distributedInfo.rank = r`` and ``world_size = N``, its host pid
moved to ``100000 + r`` and its times shifted by ``r`` microseconds (so ranks are not byte-identical
and clocks differ a little).  Each shard has ~1,500 events; ``--repeat-steps K`` makes each shard K
copies of the original's events along the time axis (K x events per shard).

Every command is a child process measured from outside (bench/import_bench.measure: wall time,
peak RSS from wait4 and from a sampled process tree, CPU seconds):

    pastaprof analyze JOB -q --json OUT [--engine ENGINE]

Usage:
    .venv/bin/python bench/many_ranks.py                         # 64, 256, 1024 ranks, local engine
    .venv/bin/python bench/many_ranks.py --ranks 64 --engine dask
    .venv/bin/python bench/many_ranks.py --ranks 256 --per-tool  # CPU seconds of each tool's report, in process
Real-size shards (16 ranks of GPT-2 traces): bench/real_size_ranks.py.
Results: a table on stdout, everything as JSON in --results.
"""

from __future__ import annotations

import argparse
import copy
import gzip
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from import_bench import _git_state, machine_info, measure  # noqa: E402

REPO = HERE.parent
WORK = Path("/tmp/pastaprof-bench/many_ranks")
SOURCE = REPO / "tests" / "data" / "ddp_mlp_2ranks"


def _templates() -> list[dict]:
    return [json.load(gzip.open(SOURCE / f"rank-{r}.pt.trace.json.gz")) for r in (0, 1)]


def _host_pid(doc: dict) -> int:
    """The host process id of a Kineto trace: the pid of its cpu_op events."""
    return next(e["pid"] for e in doc["traceEvents"] if e.get("cat") == "cpu_op")


def shard(template: dict, rank: int, world: int, repeat: int = 1) -> dict:
    """Rank ``rank`` of a ``world``-rank job: the template with its rank, pid and times moved."""
    doc = copy.deepcopy(template)
    dist = doc["distributedInfo"]
    dist["rank"], dist["world_size"] = rank, world
    for pg in dist.get("pg_config", []):
        pg["pg_size"], pg["ranks"] = world, list(range(world))
    old_pid, new_pid = _host_pid(template), 100000 + rank
    events = doc["traceEvents"]
    timed = [e for e in events if e.get("ph") != "M" and "ts" in e]
    span = max(float(e["ts"]) + float(e.get("dur", 0)) for e in timed) - min(float(e["ts"]) for e in timed)
    out = []
    for e in events:  # metadata (process and thread names) once
        if e.get("ph") == "M" or "ts" not in e:
            out.append(_moved(dict(e), old_pid, new_pid))
    for c in range(repeat):
        for e in timed:
            if c and e.get("cat") == "Trace":
                continue
            e = dict(e, args=dict(e.get("args") or {}))
            if c:  # ids unique per copy
                for key in ("correlation", "External id"):
                    if isinstance(e["args"].get(key), int):
                        e["args"][key] += c * 10_000_000
                if e.get("ph") in ("s", "f") and isinstance(e.get("id"), int):
                    e["id"] += c * 10_000_000
            e["ts"] = round(float(e["ts"]) + rank + c * (span + 1000.0), 3)
            out.append(_moved(e, old_pid, new_pid))
    doc["traceEvents"] = out
    return doc


def _moved(e: dict, old_pid: int, new_pid: int) -> dict:
    for key in ("pid", "tid"):
        if e.get(key) == old_pid:
            e[key] = new_pid
    return e


def build_job(n: int, repeat: int = 1, root: Path = WORK) -> Path:
    """A folder of ``n`` rank shards (built once, then reused)."""
    out = root / f"job_{n}x{repeat}"
    if (out / ".complete").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    templates = _templates()
    for r in range(n):
        doc = shard(templates[r % 2], r, n, repeat)
        with gzip.open(out / f"rank-{r}.pt.trace.json.gz", "wt", compresslevel=1) as f:
            json.dump(doc, f)
    (out / ".complete").write_text("")
    return out


def run_once(job: Path, engine: str | None, tools: str | None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        js = Path(tmp) / "out.json"
        cmd = [str(REPO / ".venv" / "bin" / "pastaprof"), "analyze", str(job), "-q", "--json", str(js)]
        cmd += (["--engine", engine] if engine else []) + (["-t", tools] if tools else [])
        m = measure(cmd)
        m.pop("stdout", None)
        if m["rc"] == 0:
            doc = json.loads(js.read_text())
            m["findings"] = len(doc.get("findings", []))
            m["tools"] = list(doc.get("tools", {}))
    return m


def per_tool(job: Path) -> dict:
    """In this process: CPU seconds of each default tool's ``report()`` and of the rest (import,
    link, handing batches to the tools), and this process's peak RSS."""
    import resource
    import time

    import pastaprof
    from pastaprof.api import _instances

    tools = _instances(None)
    spent: dict[str, float] = {}

    def timed(tool):
        inner = tool.report

        def report():
            c = time.process_time()
            try:
                return inner()
            finally:
                spent[tool.name] = time.process_time() - c
        return report

    for tool in tools:
        tool.report = timed(tool)
    c0 = time.process_time()
    pastaprof.analyze(job, tools=tools)
    total = time.process_time() - c0
    return {"cpu_s": total, "reports_cpu_s": sum(spent.values()), "rest_cpu_s": total - sum(spent.values()),
            "per_tool_cpu_s": spent, "maxrss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="64,256,1024", help="job sizes, comma-separated")
    ap.add_argument("--repeat-steps", type=int, default=1, help="copies of each shard's events (K x events)")
    ap.add_argument("--engine", default=None, help="--engine of analyze (default: analyze's default)")
    ap.add_argument("-t", "--tools", default=None, help="-t of analyze (default: the default tools)")
    ap.add_argument("--per-tool", action="store_true",
                    help="in this process, the CPU seconds of each default tool's report (one job size at a time)")
    ap.add_argument("--results", type=Path, default=WORK / "results.json")
    args = ap.parse_args()
    rows = []
    for n in [int(x) for x in args.ranks.split(",")]:
        job = build_job(n, args.repeat_steps)
        events = sum(len(json.load(gzip.open(p))["traceEvents"]) for p in sorted(job.glob("rank-*"))[:1]) * n
        if args.per_tool:
            m = per_tool(job)
            m.update(ranks=n, events=events, repeat_steps=args.repeat_steps)
            rows.append(m)
            tools = "  ".join(f"{k} {v:.2f}" for k, v in m["per_tool_cpu_s"].items())
            print(f"{n:5d} ranks  {events:>10,} events  CPU {m['cpu_s']:.1f} s ({m['cpu_s'] / events * 1e6:.1f} us/event): "
                  f"reports {m['reports_cpu_s']:.1f} s ({m['reports_cpu_s'] / events * 1e6:.1f} us/event), "
                  f"rest {m['rest_cpu_s']:.1f} s; per tool: {tools}", flush=True)
            continue
        m = run_once(job, args.engine, args.tools)
        m.update(ranks=n, events=events, repeat_steps=args.repeat_steps)
        rows.append(m)
        print(f"{n:5d} ranks  {events:>10,} events  rc={m['rc']}  wall {m['wall_s']:7.1f} s  "
              f"peak RSS {m['peak_rss_bytes'] / 2**20:7.0f} MiB (tree {m['peak_tree_rss_sampled_bytes'] / 2**20:.0f})"
              f"  CPU {m['user_s'] + m['sys_s']:7.1f} s ({(m['user_s'] + m['sys_s']) / events * 1e6:.1f} us/event)"
              f"  findings {m.get('findings')}", flush=True)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps({"machine": machine_info(), "git": _git_state(), "engine": args.engine,
                                        "rows": rows}, indent=1, default=str))


if __name__ == "__main__":
    main()
