"""Issue C's proof on the GPU: naive unified memory vs pastaprof's plan vs hand-tuned prefetch.

    python bench/uvm_proof.py [--mib 256] [--iters 5] [--repeat 3] [--out DIR]

1. record: `pastaprof run --uvm -t uvm_advisor` on the naive program, then
   `pastaprof analyze -t uvm_advisor --uvm-plan plan.json` (the plan);
2. interleaved ``--repeat`` times, each its own process without capture: naive, the plan
   applied (``--plan``: pastaprof.apply_uvm_plan), hand-tuned prefetch.
Targets (issue C): plan >= 5x faster than naive, within 1.2x of hand-tuned.  Also prints
the uvm handler's own overhead: the recorded naive run vs the bare naive runs.
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
APP = HERE.parent / "examples" / "uvm" / "cupy_managed.py"


def run(args: list[str], wrap: list[str] | None = None) -> dict:
    r = subprocess.run((wrap or []) + [sys.executable, str(APP), *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-3000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=os.environ.get("OUT") or tempfile.mkdtemp())
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    common = ["--mib", str(a.mib), "--iters", str(a.iters)]
    rec = out / "uvm-record"
    recorded = run(["--mode", "naive", *common],
                   wrap=[sys.executable, "-m", "pastaprof.cli", "run", "-o", str(rec), "--force", "--uvm", "--"])
    plan = out / "plan.json"
    subprocess.run([sys.executable, "-m", "pastaprof.cli", "analyze", str(rec), "-t", "uvm_advisor", "-q",
                    "--uvm-plan", str(plan)], check=True)
    rounds = []
    for _ in range(a.repeat):
        rounds.append({"naive": run(["--mode", "naive", *common])["seconds"],
                       "plan": run(["--mode", "naive", "--plan", str(plan), *common])["seconds"],
                       "hand": run(["--mode", "hand", *common])["seconds"],
                       "advise": run(["--mode", "advise", *common])["seconds"]})
    med = {k: statistics.median(r[k] for r in rounds) for k in ("naive", "plan", "hand", "advise")}
    res = {"mib": a.mib, "iters": a.iters, "median_s": med, "rounds": rounds,
           "plan_speedup_vs_naive": med["naive"] / med["plan"], "plan_vs_hand": med["plan"] / med["hand"],
           # the best hand-written version is whichever of prefetch / advice is faster
           "best_hand": min(("hand", "advise"), key=lambda k: med[k]),
           "plan_vs_best_hand": med["plan"] / min(med["hand"], med["advise"]),
           "recorded_naive_s": recorded["seconds"], "uvm_capture_overhead_x": recorded["seconds"] / med["naive"],
           "plan_actions": json.loads(plan.read_text())["actions"]}
    print(json.dumps(res, indent=1))
    (out / "uvm_proof.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
