"""Peak resident memory of a captured program against the ops it recorded.

A CPU torch loop of tiny ops (one ``aten::add`` each) runs bare and under ``pastaprof run``
with several buffer budgets (PASTAPROF_BUFFER_MB); the program's peak RSS comes from
``wait4`` (bare: here; captured: run.json's ``program.max_rss_bytes``, which pastaprof run
takes the same way).  The periodic flush is set far out (PASTAPROF_FLUSH_MS=600000) so that
only the buffer bound spills rows to disk: what is measured is that bound.

    python bench/capture_memory.py --ops 2000000 --budgets 16,64,1024
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

PROGRAM = textwrap.dedent("""
    import sys, torch
    x = torch.ones(4)
    for _ in range(int(sys.argv[1])):
        x = x + 1
""")


def _bare(script: Path, ops: int) -> tuple[int, float]:
    t0 = time.perf_counter()
    pid = os.posix_spawn(sys.executable, [sys.executable, str(script), str(ops)], dict(os.environ))
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=2_000_000)
    ap.add_argument("--budgets", default="16,64,1024", help="PASTAPROF_BUFFER_MB values, comma-separated")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "tiny_ops.py"
        script.write_text(PROGRAM)
        rss, wall = _bare(script, args.ops)
        print(json.dumps({"bare": {"max_rss_mb": round(rss / 2**20, 1), "wall_s": round(wall, 2)}, "ops": args.ops}))
        for b in (int(x) for x in args.budgets.split(",")):
            print(json.dumps(_captured(script, args.ops, b, Path(tmp) / f"run-{b}")), flush=True)


if __name__ == "__main__":
    main()
