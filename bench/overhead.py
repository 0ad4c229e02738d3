"""Live-capture overhead and fidelity on the GPU (issue B), in one invocation.

    python bench/overhead.py [--repeat 3] [--workloads tiny,resnet50,gpt2] [--out DIR]
    python bench/overhead.py --breakdown [--steps 3] [--inner 5]   # which mechanism costs what, in the region

For each workload, interleaved `--repeat` times: bare; `pastaprof run --ranges
measure` (GPU activity via CUPTI, store written); torch.profiler with shapes,
memory and stacks (export included).  Each run is its own process; the timed
region is the workload's steps (bench/workloads.py).  pastaprof's time adds
what it spends after the region: the final flush in the program and the
compaction of the store by the launcher (both from run.json).

Fidelity, from the same runs: kernels pastaprof stored for the measured steps
vs torch.profiler's kernel count for the same steps (target: within 0.5%), and
CUPTI's delivered kernel records == stored + filtered out (nothing lost).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
STEPS = {"tiny": 1, "resnet50": 1, "gpt2": 1}


# pastaprof configurations measured: the issue's (ops with shapes and call sites, kernels,
# tensors) and a lean one without shapes and call sites.
# The third variant has no periodic flush inside the run: what the background flush costs; the
# fourth flushes every 100 ms, moving stop's work into the run (H200, tiny loop: no gain).
VARIANTS = {"pastaprof": {}, "pastaprof_lean": {"PASTAPROF_SHAPES": "0", "PASTAPROF_CALL_SITES": "0"},
            "pastaprof_noflush": {"PASTAPROF_FLUSH_MS": "600000"},
            "pastaprof_flush100": {"PASTAPROF_FLUSH_MS": "100"}}


INNER = [1]  # --inner: measured regions per process (the breakdown's median of several)


def _workload(name: str, mode: str, out: Path, wrap: list[str] | None = None, env: dict | None = None) -> dict:
    js = out / f"{name}-{mode}-{time.time_ns()}.json"
    cmd = [sys.executable, str(HERE / "workloads.py"), name, mode, "--steps", str(STEPS[name]), "--json", str(js),
           "--inner", str(INNER[0] if mode == "bare" else 1)]
    r = subprocess.run((wrap or []) + cmd, capture_output=True, text=True, env={**os.environ, **(env or {})})
    if r.returncode != 0:
        raise RuntimeError(f"{name} {mode} failed ({r.returncode}): {r.stderr[-2000:]}")
    return json.loads(js.read_text())


def one_round(name: str, out: Path) -> dict:
    res = {"bare": _workload(name, "bare", out)}
    for variant, env in VARIANTS.items():
        run_dir = out / f"run-{name}-{time.time_ns()}"
        pp = [sys.executable, "-m", "pastaprof.cli", "run", "-o", str(run_dir), "--ranges", "measure", "--"]
        r = res[variant] = _workload(name, "bare", out, wrap=pp, env=env)
        m = json.loads((run_dir / "run.json").read_text())
        ov = m["capture_overhead"]
        r["after_region_seconds"] = ov.get("stop_seconds", 0) + ov.get("compact_seconds", 0)
        proc = m["processes"][0]
        r["manifest"] = {k: m[k] for k in ("rows", "dropped_events", "status")}
        r["manifest"]["capture_overhead"] = {**ov, **proc.get("capture_overhead", {})}
        r["kernels_stored"] = m["rows"].get("kernel", 0)
        r["kernels_seen"] = sum(p["handlers"].get("cupti", {}).get("kernels_seen", 0) for p in m["processes"])
        r["kernels_filtered"] = sum((p.get("filtered_by_kind") or {}).get("kernel", 0) for p in m["processes"])
        r["events"] = proc["events"]
        r["mechanisms"] = {h: v.get("mechanism") for h, v in proc["handlers"].items()}
        shutil.rmtree(run_dir, ignore_errors=True)
    res["torchprof"] = _workload(name, "torchprof", out)
    return res


# --breakdown: one mechanism switched off at a time (PASTAPROF_OFF), then all but one family,
# inside the measured region only: which mechanism the in-step overhead comes from.
BREAKDOWN = {"full": "", "no_callbacks": "callbacks", "no_ops": "ops", "no_ext": "ext", "no_api": "api,ext", "no_modules": "modules",
             "no_tensors": "tensors", "no_memory": "memory",
             "kernels_only": "api,ext,ops,modules,tensors,memory", "torch_only": "kernels,api,ext,memory",
             "session_only": "kernels,api,ext,ops,modules,tensors,memory"}


VARIANTS_OF: list[str] = []  # --breakdown-variants: a subset of BREAKDOWN


def breakdown(name: str, out: Path, repeat: int) -> dict:
    """Region seconds per variant (medians of `repeat` interleaved rounds) and x bare."""
    chosen = {v: BREAKDOWN[v] for v in (VARIANTS_OF or BREAKDOWN)}
    times: dict[str, list[float]] = {"bare": [], **{v: [] for v in chosen}}
    for _ in range(repeat):
        times["bare"].append(_workload(name, "bare", out)["seconds"])
        for variant, off in chosen.items():
            run_dir = out / f"bd-{name}-{variant}-{time.time_ns()}"
            pp = [sys.executable, "-m", "pastaprof.cli", "run", "-o", str(run_dir), "--ranges", "measure", "--"]
            times[variant].append(_workload(name, "bare", out, wrap=pp, env={"PASTAPROF_OFF": off})["seconds"])
            shutil.rmtree(run_dir, ignore_errors=True)
    bare = statistics.median(times["bare"])
    return {v: {"s": round(statistics.median(t), 5), "x": round(statistics.median(t) / bare, 3),
                "off": chosen.get(v, "")} for v, t in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workloads", default="tiny,resnet50,gpt2")
    ap.add_argument("--out", default=os.environ.get("OUT") or tempfile.mkdtemp())
    ap.add_argument("--steps", type=int, default=None, help="training steps per timed region (default: 1, as in issue B)")
    ap.add_argument("--breakdown", action="store_true",
                    help="in-region cost with each capture mechanism switched off in turn (PASTAPROF_OFF)")
    ap.add_argument("--breakdown-variants", default="", help="of: " + ",".join(BREAKDOWN))
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help="pastaprof configurations measured, of: " + ",".join(VARIANTS))
    ap.add_argument("--inner", type=int, default=1,
                    help="with --breakdown: measured regions per process, their median taken (default 1)")
    a = ap.parse_args()
    INNER[0] = a.inner if a.breakdown else 1
    VARIANTS_OF[:] = [v for v in a.breakdown_variants.split(",") if v]
    chosen = [v for v in a.variants.split(",") if v]
    if "pastaprof" not in chosen or any(v not in VARIANTS for v in chosen):
        ap.error(f"--variants: 'pastaprof' and any of {', '.join(VARIANTS)}")
    for v in list(VARIANTS):
        if v not in chosen:
            del VARIANTS[v]
    for v in VARIANTS_OF:
        if v not in BREAKDOWN:
            ap.error(f"unknown breakdown variant {v!r}")
    if a.steps:
        for k in ("resnet50", "gpt2"):
            STEPS[k] = a.steps
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = {}
    if a.breakdown:
        for name in a.workloads.split(","):
            summary[name] = breakdown(name, out, a.repeat)
            print(json.dumps({name: summary[name]}), flush=True)
        (out / f"breakdown-steps{a.steps or 1}.json").write_text(json.dumps(summary, indent=1))
        return
    for name in a.workloads.split(","):
        rounds = [one_round(name, out) for _ in range(a.repeat)]
        bare = statistics.median(r["bare"]["seconds"] for r in rounds)
        pp = statistics.median(r["pastaprof"]["seconds"] + r["pastaprof"]["after_region_seconds"] for r in rounds)
        pp_region = statistics.median(r["pastaprof"]["seconds"] for r in rounds)
        lean, noflush = (statistics.median(r[v]["seconds"] + r[v]["after_region_seconds"] for r in rounds)
                         if v in VARIANTS else None for v in ("pastaprof_lean", "pastaprof_noflush"))
        tp = statistics.median(r["torchprof"]["seconds"] for r in rounds)
        last = rounds[-1]
        stored, tk = last["pastaprof"]["kernels_stored"], last["torchprof"]["kernels"]
        summary[name] = {
            "steps": STEPS[name], "bare_s": round(bare, 4), "pastaprof_s": round(pp, 4), "torchprof_s": round(tp, 4),
            "pastaprof_x": round(pp / bare, 3), "torchprof_x": round(tp / bare, 3),
            "pastaprof_region_s": round(pp_region, 4), "pastaprof_region_x": round(pp_region / bare, 3),
            "pastaprof_lean_s": lean and round(lean, 4), "pastaprof_lean_x": lean and round(lean / bare, 3),
            "pastaprof_noflush_x": noflush and round(noflush / bare, 3),
            "mechanisms": last["pastaprof"]["mechanisms"],
            "kernels_pastaprof": stored, "kernels_torchprof": tk,
            "kernel_count_diff_pct": round(100 * abs(stored - tk) / tk, 3) if tk else None,
            "kernels_seen": last["pastaprof"]["kernels_seen"], "kernels_filtered": last["pastaprof"]["kernels_filtered"],
            "nothing_lost": last["pastaprof"]["kernels_seen"] == stored + last["pastaprof"]["kernels_filtered"]
            and last["pastaprof"]["manifest"]["dropped_events"] == 0,
            "events": last["pastaprof"]["events"], "capture_overhead": last["pastaprof"]["manifest"]["capture_overhead"],
            "rounds": [{m: r[m]["seconds"] + r[m].get("after_region_seconds", 0)
                        for m in ("bare", *VARIANTS, "torchprof")} for r in rounds],
            "regions": [{m: r[m]["seconds"] for m in ("bare", *VARIANTS, "torchprof")} for r in rounds],
        }
        print(json.dumps({name: summary[name]}), flush=True)
    (out / f"overhead-steps{a.steps or 1}.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
