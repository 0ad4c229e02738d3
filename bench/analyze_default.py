#!/usr/bin/env python3
"""What the default tools cost in ``pastaprof analyze``: time, CPU seconds and peak memory.

On one big Kineto trace (bench/make_big_trace.py: the bundled example replicated ``--copies``
times, 57 by default: ~4.0 M events, 1.27 GB), each command is a child process measured from
the outside with import_bench.measure (wall, peak RSS from wait4 and a sampled process tree,
CPU seconds):

  floor     pastaprof analyze BIG -t kernels,timeline -q --json OUT   (no op import: the import's floor)
  default   pastaprof analyze BIG -q --json OUT                       (the default tools, registry.DEFAULT_TOOLS)
  all       pastaprof analyze BIG -t DEFAULT,ranges,sequences,critical_path -q --json OUT

With --repeat N the commands are interleaved (floor, default, all, floor, ...) so drift of the
machine hits each alike; the table reports the median per command (wall, and user+sys CPU
seconds, which a shared machine's load does not inflate), and the default run's steps count (3
per copy) as a check that the tools saw the whole trace.

Usage:
    .venv/bin/python bench/analyze_default.py                    # 57 copies, builds the trace if missing
    .venv/bin/python bench/analyze_default.py --copies 8 --repeat 3
Results: a table on stdout, everything as JSON in --results (default /tmp/pastaprof-bench/analyze_default.json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from import_bench import _git_state, machine_info, measure  # noqa: E402

REPO = HERE.parent
WORK = Path("/tmp/pastaprof-bench")
sys.path.insert(0, str(HERE.parent / "src"))
from pastaprof.tools.registry import DEFAULT_TOOLS  # noqa: E402

EXTRA = "ranges,sequences,critical_path"
VARIANTS = {"floor": "kernels,timeline", "default": None, "all": ",".join([*DEFAULT_TOOLS, EXTRA])}


def build(copies: int) -> Path:
    out = WORK / f"gpt2_x{copies}.pt.trace.json"
    if not out.exists():
        WORK.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, str(HERE / "make_big_trace.py"), "--copies", str(copies), "-o", str(out)],
                       check=True)
    return out


def run_once(pastaprof: str, trace: Path, tools: str | None, src: Path | None = None) -> dict:
    """One command in a child process; ``src``: run pastaprof from that source tree instead
    (``python -m pastaprof.cli`` with PYTHONPATH=src), e.g. a checkout of an older commit."""
    with tempfile.TemporaryDirectory() as tmp:
        js = Path(tmp) / "out.json"
        head, env = [pastaprof], None
        if src is not None:
            head, env = [sys.executable, "-m", "pastaprof.cli"], {**os.environ, "PYTHONPATH": str(src)}
        cmd = head + ["analyze", str(trace), "-q", "--json", str(js)] + (["-t", tools] if tools else [])
        load = os.getloadavg()[0]
        m = measure(cmd, env=env)
        m["loadavg_1min"] = [load, os.getloadavg()[0]]  # before and after: how shared the machine was
        m.pop("stdout", None)
        if m["rc"] == 0 and js.exists():
            steps = json.loads(js.read_text()).get("tools", {}).get("steps")
            if steps:
                m["steps"] = steps.get("summary", {}).get("steps")
    return m


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--copies", type=int, default=57, help="copies of the example in the trace (default 57)")
    ap.add_argument("--repeat", type=int, default=1, help="interleaved repetitions of every command")
    ap.add_argument("--results", type=Path, default=WORK / "analyze_default.json")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="which commands, of: " + ", ".join(VARIANTS))
    ap.add_argument("--base-src", type=Path, help="also run the default command from this source tree "
                                                  "(e.g. src/ of `git worktree add /tmp/wt-OLD REV`), interleaved")
    args = ap.parse_args(argv)
    variants = {k: VARIANTS[k] for k in args.variants.split(",") if k}
    if args.base_src is not None:
        variants["base-default"] = None
    trace = build(args.copies)
    pastaprof = str(Path(sys.executable).with_name("pastaprof"))
    subprocess.run(["cat", str(trace)], stdout=subprocess.DEVNULL, check=True)  # into the page cache
    runs: dict[str, list[dict]] = {k: [] for k in variants}
    for _ in range(args.repeat):
        for name, tools in variants.items():
            m = run_once(pastaprof, trace, tools, args.base_src if name.startswith("base-") else None)
            runs[name].append(m)
            print(f"{name:9s} rc={m['rc']} wall={m['wall_s']:.2f}s cpu={m['user_s'] + m['sys_s']:.2f}s peak_rss={m['peak_rss_bytes'] / 2**20:.0f} MiB "
                  f"tree={m['peak_tree_rss_sampled_bytes'] / 2**20:.0f} MiB steps={m.get('steps')} "
                  f"load={m['loadavg_1min'][0]:.1f}->{m['loadavg_1min'][1]:.1f}", flush=True)
    summary = {name: {"wall_s": statistics.median(m["wall_s"] for m in ms),
                      "cpu_s": statistics.median(m["user_s"] + m["sys_s"] for m in ms),
                      "peak_rss_bytes": statistics.median(m["peak_rss_bytes"] for m in ms),
                      "rc": sorted({m["rc"] for m in ms}), "steps": ms[-1].get("steps")}
               for name, ms in runs.items()}
    base = summary.get("default") or next(iter(summary.values()))
    print(f"\ntrace: {trace} ({trace.stat().st_size / 1e9:.2f} GB, {args.copies} copies), median of {args.repeat}")
    print(f"{'command':10s} {'wall s':>8s} {'cpu s':>8s} {'vs default':>10s} {'peak RSS MiB':>13s}")
    for name, s in summary.items():
        print(f"{name:10s} {s['wall_s']:8.2f} {s['cpu_s']:8.2f} {s['cpu_s'] / base['cpu_s']:9.2f}x "
              f"{s['peak_rss_bytes'] / 2**20:13.0f}")
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps({"trace": str(trace), "copies": args.copies, "machine": machine_info(),
                                        "git": _git_state(), "summary": summary, "runs": runs}, indent=1, default=str))
    return 0 if all(s["rc"] == [0] for s in summary.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
