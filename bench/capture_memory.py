"""Peak resident memory of a captured program against the ops it recorded.

A CPU torch loop of tiny ops (one ``aten::add`` each) runs bare and under ``pastaprof run``
with several buffer budgets (PASTAPROF_BUFFER_MB); the program's peak RSS comes from
``wait4`` (bare: here; captured: run.json's ``program.max_rss_bytes``, which pastaprof run
takes the same way).  The periodic flush is set far out (PASTAPROF_FLUSH_MS=600000) so that
only the buffer bound spills rows to disk: what is measured is that bound.

    python bench/capture_memory.py --ops 2000000 --budgets 16,64,1024

``--per-op``: the loop's own time (start-up and the final flush excluded), bare and captured
with each budget, interleaved ``--repeat`` times, as us per op over bare; ``--baseline-src DIR``
adds the same captured runs with another pastaprof source tree first on PYTHONPATH (e.g. a
``git archive`` of an earlier commit's ``src``), so that a change's per-op cost is read side
by side in one run on one (possibly loaded) machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

PROGRAM = textwrap.dedent("""
    import sys, time, torch
    x = torch.ones(4)
    t0 = time.perf_counter()
    for _ in range(int(sys.argv[1])):
        x = x + 1
    print(time.perf_counter() - t0)
""")
OPS_PER_ITERATION = 5  # aten::add and what it calls, as the observer records them


def _bare(script: Path, ops: int) -> tuple[int, float]:
    t0 = time.perf_counter()
    with open(os.devnull, "w") as null:
        pid = os.posix_spawn(sys.executable, [sys.executable, str(script), str(ops)], dict(os.environ),
                             file_actions=[(os.POSIX_SPAWN_DUP2, null.fileno(), 1)])
    _, status, usage = os.wait4(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return usage.ru_maxrss * 1024, time.perf_counter() - t0


def _captured(script: Path, ops: int, budget_mb: int, out: Path) -> dict:
    env = dict(os.environ, PASTAPROF_BUFFER_MB=str(budget_mb), PASTAPROF_FLUSH_MS="600000")
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pastaprof.cli", "run", "-o", str(out), "--force", "--",
                    sys.executable, str(script), str(ops)], env=env, check=True, capture_output=True)
    wall = time.perf_counter() - t0
    m = json.loads((out / "run.json").read_text())
    proc = m["processes"][0]
    return {"budget_mb": budget_mb, "max_rss_mb": round(m["program"]["max_rss_bytes"] / 2**20, 1),
            "ops_recorded": m["rows"].get("op", 0), "dropped": m["dropped_events"],
            "spill_flushes": proc["capture_overhead"]["deadline_flushes"],
            "max_pending_rows": proc["capture_overhead"]["max_pending_rows"], "wall_s": round(wall, 2)}


def _loop_seconds(script: Path, ops: int, out: Path, budget_mb: int | None, src: str | None) -> float:
    """The program's loop time: bare (``budget_mb`` None) or under ``pastaprof run``."""
    env = dict(os.environ)
    cmd = [sys.executable, str(script), str(ops)]
    if budget_mb is not None:
        env.update(PASTAPROF_BUFFER_MB=str(budget_mb), PASTAPROF_FLUSH_MS="600000")
        cmd = [sys.executable, "-m", "pastaprof.cli", "run", "-o", str(out), "--force", "--", *cmd]
    if src:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
    r = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    return float(r.stdout.split()[0])


def per_op(script: Path, ops: int, budgets: list[int], repeat: int, baseline: str | None, tmp: Path) -> dict:
    """us per recorded op over bare, medians of ``repeat`` interleaved rounds."""
    configs = {"bare": (None, None)} | {f"{b}MB": (b, None) for b in budgets}
    if baseline:
        configs |= {f"{b}MB_baseline": (b, baseline) for b in budgets}
    times: dict[str, list[float]] = {k: [] for k in configs}
    for _ in range(repeat):
        for name, (budget, src) in configs.items():
            times[name].append(_loop_seconds(script, ops, tmp / "run", budget, src))
    med = {k: statistics.median(v) for k, v in times.items()}
    rows = ops * OPS_PER_ITERATION
    return {"ops": rows, "repeat": repeat, "median_s": {k: round(v, 4) for k, v in med.items()},
            "us_per_op_over_bare": {k: round((v - med["bare"]) / rows * 1e6, 3) for k, v in med.items() if k != "bare"},
            "x_bare": {k: round(v / med["bare"], 3) for k, v in med.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=2_000_000)
    ap.add_argument("--budgets", default="16,64,1024", help="PASTAPROF_BUFFER_MB values, comma-separated")
    ap.add_argument("--per-op", action="store_true", help="the loop's time per op instead of peak memory")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--baseline-src", help="another pastaprof src tree, run side by side (with --per-op)")
    args = ap.parse_args()
    budgets = [int(x) for x in args.budgets.split(",")]
    if args.baseline_src and not (Path(args.baseline_src) / "pastaprof" / "__init__.py").is_file():
        sys.stderr.write(f"capture_memory: {args.baseline_src} holds no pastaprof package\n")
        raise SystemExit(2)
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "tiny_ops.py"
        script.write_text(PROGRAM)
        if args.per_op:
            print(json.dumps(per_op(script, args.ops, budgets, args.repeat, args.baseline_src, Path(tmp)), indent=1))
            return
        rss, wall = _bare(script, args.ops)
        print(json.dumps({"bare": {"max_rss_mb": round(rss / 2**20, 1), "wall_s": round(wall, 2)}, "ops": args.ops}))
        for b in budgets:
            print(json.dumps(_captured(script, args.ops, b, Path(tmp) / f"run-{b}")), flush=True)


if __name__ == "__main__":
    main()
