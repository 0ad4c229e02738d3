"""Issue C's proof on the GPU: naive unified memory vs pastaprof's plan vs hand-tuned prefetch.

    python bench/uvm_proof.py [--app cupy|torch] [--workload gather|pingpong] [--mib 1024]
        [--iters 5] [--repeat 3] [--out DIR] [--oversubscribe F]   (torch only)

``--app cupy`` (default): examples/uvm/cupy_managed.py; ``--workload gather`` is the
fault-bound example (a table filled once by the CPU, gathered page by page in scrambled
order by the GPU), ``pingpong`` the one where CPU and GPU take turns; both also run an
``advise`` hand-written version.  ``--app torch``: examples/uvm/torch_managed.py,
an MLP trained on managed memory through a pluggable allocator (``--oversubscribe 1.5``
makes the driver evict).

1. record: `pastaprof run --uvm` on the naive program and (CuPy) an access run,
   `pastaprof run -t working_set`, then `pastaprof analyze -t uvm_advisor --uvm-plan
   plan.json [--access-run DIR]` (the plan);
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
APPS = {"cupy": HERE.parent / "examples" / "uvm" / "cupy_managed.py",
        "torch": HERE.parent / "examples" / "uvm" / "torch_managed.py"}
APP = APPS["cupy"]


def run(args: list[str], wrap: list[str] | None = None) -> dict:
    r = subprocess.run((wrap or []) + [sys.executable, str(APP), *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-3000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--app", choices=sorted(APPS), default="cupy")
    ap.add_argument("--oversubscribe", type=float, default=1.0)
    ap.add_argument("--workload", choices=["gather", "pingpong"], default="gather")
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=os.environ.get("OUT") or tempfile.mkdtemp())
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    global APP
    APP = APPS[a.app]
    if a.app == "cupy":
        common = ["--workload", a.workload, "--mib", str(a.mib), "--iters", str(a.iters)]
        hands = ("hand", "pin", "advise") if a.workload == "gather" else ("hand", "pin")
    else:
        common = ["--steps", str(a.iters), "--oversubscribe", str(a.oversubscribe)]
        hands = ("hand",)
    rec = out / "uvm-record"
    recorded = run(["--mode", "naive", *common],
                   wrap=[sys.executable, "-m", "pastaprof.cli", "run", "-o", str(rec), "--force", "--uvm", "--"])
    plan = out / "plan.json"
    access = []
    if a.app == "cupy":  # an access run too: how much of each page the GPU touches (pin or migrate)
        acc = out / "access-record"
        run(["--mode", "naive", *common],
            wrap=[sys.executable, "-m", "pastaprof.cli", "run", "-o", str(acc), "--force", "-t", "working_set", "--"])
        access = ["--access-run", str(acc)]
    subprocess.run([sys.executable, "-m", "pastaprof.cli", "analyze", str(rec), "-t", "uvm_advisor", "-q",
                    "--uvm-plan", str(plan), *access], check=True)
    import pastaprof  # the advisor's evidence per allocation and point, for the record
    from pastaprof.tools.uvm_advisor import UvmAdvisor

    rep = pastaprof.analyze(rec, tools=[UvmAdvisor(access_run=access[1] if access else None)])[0]
    evidence = rep.tables["by_allocation_and_point"].to_pylist() if "by_allocation_and_point" in rep.tables else []
    # what the records were, attributed or not (e.g. eviction migrations under oversubscription)
    recs = (rep.details or {}).get("records")
    by_cause = []
    if recs is not None and recs.num_rows:
        import pyarrow.compute as pc

        recs = recs.append_column("attributed", pc.greater_equal(recs["alloc_id"], 0))
        by_cause = recs.group_by(["uvm_kind", "cause", "attributed"], use_threads=False).aggregate(
            [("bytes", "sum"), ("count", "sum"), ("alloc_id", "count")]).to_pylist()
    rounds = []
    for _ in range(a.repeat):
        r = {"naive": run(["--mode", "naive", *common])["seconds"],
             "plan": run(["--mode", "naive", "--plan", str(plan), *common])["seconds"]}
        r.update({h: run(["--mode", h, *common])["seconds"] for h in hands})
        rounds.append(r)
    med = {k: statistics.median(r[k] for r in rounds) for k in ("naive", "plan", *hands)}
    best = min(hands, key=lambda k: med[k])  # the best hand-written version
    res = {"app": a.app, "args": common, "median_s": med, "rounds": rounds,
           "plan_speedup_vs_naive": med["naive"] / med["plan"], "plan_vs_hand": med["plan"] / med["hand"],
           "best_hand": best, "plan_vs_best_hand": med["plan"] / med[best],
           "recorded_naive_s": recorded["seconds"], "recorded_app": recorded, "uvm_capture_overhead_x": recorded["seconds"] / med["naive"],
           "plan_actions": [{k: a.get(k) for k in ("allocation", "action", "to", "before", "advice", "location",
                                                   "evidence")}
                            for a in json.loads(plan.read_text())["actions"]],
           "advisor_summary": rep.summary, "evidence": evidence[:12], "records_by_cause": by_cause}
    print(json.dumps(res, indent=1))
    (out / "uvm_proof.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
