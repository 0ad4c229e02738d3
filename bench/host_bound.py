"""In-step cost of `pastaprof run` around an unchanged script, where the host is the bottleneck
and where the GPU is (issue E, section 6), against torch.profiler, in fresh processes.

    python bench/host_bound.py [--rounds 3] [--workloads resnet50,gpt2,...] [--variants ...] [--out DIR]

Each process runs bench/user_steps.py: 3 warm-up steps, then 20 timed steps, each synchronized.
Variants: ``bare``; ``pastaprof`` (`pastaprof run` with the default capture); ``pastaprof_all``
(``--shapes all``: every op's shapes); ``pastaprof_none`` (``--no-shapes``); ``pastaprof_noflush``
(the default capture, no flush until the program ends); parts switched off (``pastaprof_nomodules``,
``_noops``, ``_nocupti``: every CUPTI kind off, ``_nothing``: every PASTAPROF_OFF part), ``pastaprof_idle`` (the session with no handler), the floors (``pastaprof_nosession``,
``pastaprof_nosession_inject``, ``bare_preload``: see FLOORS); ``tp_default``
(torch.profiler, CPU + CUDA activities) and ``tp_full`` (with shapes, memory and stacks).
Rounds are interleaved (every variant once per round) so the host's drift spreads over all of
them.  Per process the median step is taken (wall, and the main thread's CPU time: a cost that
shows in wall but not in CPU is waiting, not work); the report gives the median over rounds and its
ratio to bare.  For pastaprof variants the exit cost is the wall time from the script's last
step to `pastaprof run` returning with the run stored, less the same span of the bare process
(interpreter teardown), and per 100,000 stored events.  ``--budget-s`` starts no round that
would not end within it (the device tool's 10-minute command limit).  ``--pin gpu`` (the default)
runs every process on the GPU's NUMA-local CPUs (bench/host_cpus.py), so that where the scheduler
puts a fresh process is not part of the comparison; each process also records the host's steal
time while it ran (a VM's noisy neighbours), reported per variant.
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
sys.path.insert(0, str(HERE))
from host_cpus import gpu_local_cpus, steal_jiffies  # noqa: E402

PP_FLAGS = {"pastaprof": [], "pastaprof_all": ["--shapes", "all"], "pastaprof_none": ["--no-shapes"],
            "pastaprof_noflush": [], "pastaprof_nomodules": [], "pastaprof_nosites": ["--no-call-sites"],
            "pastaprof_noops": [], "pastaprof_nocupti": [], "pastaprof_nothing": [], "pastaprof_idle": [],
            "pastaprof_kernel_api": [], "pastaprof_kernel_only": [], "pastaprof_nocopies": [], "pastaprof_nomemory": []}
# the default capture with no flush before the program ends (buffer large enough): what the
# background flushes (drain, link, Parquet writes; the GIL) cost the program's steps
PP_ENV = {"pastaprof_noflush": {"PASTAPROF_FLUSH_MS": "600000", "PASTAPROF_BUFFER_MB": "4096"},
          # the default capture less one part (PASTAPROF_OFF), to locate the cost under `pastaprof run`
          "pastaprof_nomodules": {"PASTAPROF_OFF": "modules"},
          "pastaprof_noops": {"PASTAPROF_OFF": "ops,modules"},
          "pastaprof_nocupti": {"PASTAPROF_OFF": "kernels,api,ext,memory,copies,sync"},
          # CUPTI with kernel and launch-call records only (no copy, memset, sync or memory kinds),
          # and with kernel records alone (no launch calls, no op id per launch)
          "pastaprof_kernel_api": {"PASTAPROF_OFF": "memory,copies,sync"},
          "pastaprof_kernel_only": {"PASTAPROF_OFF": "api,ext,memory,copies,sync"},
          # the default less CUPTI's MEMCPY/MEMSET kinds, or less its MEMORY2/MEMORY_POOL kinds
          "pastaprof_nocopies": {"PASTAPROF_OFF": "copies"},
          "pastaprof_nomemory": {"PASTAPROF_OFF": "memory"},
          # every mechanism off: what the bootstrap, the session and the supervising parent cost alone
          "pastaprof_nothing": {"PASTAPROF_OFF": "kernels,api,ext,ops,modules,tensors,memory,copies,sync"},
          # the session and its threads with no handler at all (no CUPTI client, no torch hooks)
          "pastaprof_idle": {"PASTAPROF_FOUND_HANDLERS": "[]"},
          # `env` is not a Python command: `pastaprof run` prepares native capture for it
          # (CUDA_INJECTION64_PATH), which the CUDA driver then loads into the Python child (where
          # the library starts nothing). The parent alone is measured without it; with it, what
          # a loaded injection library costs a Python program launched through a shell or `env`.
          "pastaprof_nosession": {"PASTAPROF_NATIVE_INJECT": "0"}}
TP = ("tp_default", "tp_full")
CUPTI_OFF = ("pastaprof_nocupti", "pastaprof_nothing", "pastaprof_idle")  # the variants that run without CUPTI
# Floors without capture: the supervising `pastaprof run` parent with the child's session never
# started (PASTAPROF_OUT unset in the child; without, and with, the native injection library that
# `pastaprof run` prepares for the non-Python `env`), and a bare process that first imports what
# the session imports (pyarrow, numpy, duckdb-free parts) before the script runs.
PRELOAD = ("import pyarrow, pyarrow.parquet, numpy, runpy, sys; sys.argv = sys.argv[1:]; "
           "runpy.run_path(sys.argv[0], run_name='__main__')")
FLOORS = ("pastaprof_nosession", "pastaprof_nosession_inject", "bare_preload")
ALL = ("bare", *PP_FLAGS, *TP, *FLOORS)


def one(workload: str, variant: str, out: Path, steps: int, warmup: int) -> dict:
    """One fresh process of ``variant``: its step seconds, exit cost and (pastaprof) run facts."""
    js = out / f"{workload}-{variant}-{time.time_ns()}.json"
    mode = variant if variant in TP else "bare"
    cmd = [sys.executable, str(HERE / "user_steps.py"), workload, "--mode", mode, "--steps", str(steps),
           "--warmup", str(warmup), "--json", str(js)]
    run_dir = None
    if variant == "bare_preload":
        cmd = [sys.executable, "-c", PRELOAD, *cmd[1:]]
    elif variant in ("pastaprof_nosession", "pastaprof_nosession_inject"):
        cmd = [sys.executable, "-m", "pastaprof.cli", "run", "-o", str(out / f"run-nosession-{time.time_ns()}"),
               "--", "env", "-u", "PASTAPROF_OUT", *cmd]
    if variant in PP_FLAGS:
        run_dir = out / f"run-{workload}-{variant}-{time.time_ns()}"
        cmd = [sys.executable, "-m", "pastaprof.cli", "run", "-o", str(run_dir), *PP_FLAGS[variant], "--", *cmd]
    steal0 = steal_jiffies()
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **PP_ENV.get(variant, {})})
    t_return = time.time()
    steal = steal_jiffies() - steal0
    if r.returncode != 0:
        raise RuntimeError(f"{workload} {variant} failed ({r.returncode}): {r.stderr[-1500:]}")
    res = json.loads(js.read_text())
    rec = {"step_s": statistics.median(res["steps"]), "exit_s": t_return - res["t_end"], "stop_s": res["stop_s"],
           "cpu_step_s": statistics.median(res.get("cpu_steps") or [0.0]), "steps": res["steps"],
           "cpu_steps": res.get("cpu_steps"), "steal_jiffies": steal,
           "threads_cpu_s": res.get("threads_cpu_s")}
    if run_dir is not None:
        m = json.loads((run_dir / "run.json").read_text())
        rec["events"] = sum(m.get("rows", {}).values())
        rec["rows"] = m.get("rows", {})
        proc = (m.get("processes") or [{}])[0]
        rec["shapes"] = (proc.get("handlers", {}).get("torch", {}) or {}).get("shapes")
        ov = proc.get("capture_overhead") or {}
        rec["flush_s"] = ov.get("flush_seconds")
        rec["flushes"] = {k: ov.get(k) for k in ("deadline_flushes", "starved_flushes", "max_pending_rows")}
        rec["status"] = m.get("status")
        down = [f"{k}: {v}" for k, v in (m.get("status") or {}).items() if v != "ok" and k.endswith(": cupti")]
        if down and variant not in CUPTI_OFF:  # a capture without kernels is not the default capture
            raise RuntimeError(f"{workload} {variant}: CUPTI did not run ({down[0]})")
        shutil.rmtree(run_dir, ignore_errors=True)
    js.unlink(missing_ok=True)
    return rec


def summarize(rounds: list[dict], variants: list[str]) -> dict:
    """Medians over rounds per variant, x bare, and pastaprof's exit cost per 100,000 events."""
    bare = statistics.median(r["bare"]["step_s"] for r in rounds)
    bare_cpu = statistics.median(r["bare"]["cpu_step_s"] for r in rounds)
    bare_exit = statistics.median(r["bare"]["exit_s"] for r in rounds)
    s: dict = {"rounds": len(rounds), "bare_ms": round(1e3 * bare, 2), "bare_cpu_ms": round(1e3 * bare_cpu, 2)}
    for v in variants:
        step = statistics.median(r[v]["step_s"] for r in rounds)
        cpu = statistics.median(r[v]["cpu_step_s"] for r in rounds)
        s[v] = {"step_ms": round(1e3 * step, 2), "x": round(step / bare, 3),
                "per_round_x": [round(r[v]["step_s"] / r["bare"]["step_s"], 3) for r in rounds],
                "cpu_ms": round(1e3 * cpu, 2), "cpu_x": round(cpu / bare_cpu, 3) if bare_cpu else None,
                "min_x": round(statistics.median(min(r[v]["steps"]) / min(r["bare"]["steps"]) for r in rounds), 3),
                "steal_jiffies": [r[v].get("steal_jiffies") for r in rounds]}
        if v in PP_FLAGS:
            exit_s = statistics.median(r[v]["exit_s"] for r in rounds) - bare_exit
            events = statistics.median(r[v]["events"] for r in rounds)
            s[v].update(exit_s=round(exit_s, 3), events=int(events),
                        exit_s_per_100k=round(exit_s * 1e5 / events, 3) if events else None,
                        shapes=rounds[-1][v].get("shapes"),
                        flush_s=statistics.median(r[v].get("flush_s") or 0 for r in rounds),
                        flushes=rounds[-1][v].get("flushes"))
        elif v in TP:
            s[v]["stop_s"] = round(statistics.median(r[v]["stop_s"] for r in rounds), 3)
    return s


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workloads", default="resnet50,gpt2,resnet50_bs256,gpt2_16x1024,tiny")
    ap.add_argument("--variants", default=",".join(ALL), help="of: " + ",".join(ALL))
    ap.add_argument("--tiny-variants", default="bare,pastaprof,pastaprof_all",
                    help="variants for the tiny loop (torch.profiler on 400,000 launches takes minutes)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=0, help="start no round past this many seconds")
    ap.add_argument("--out", default=os.environ.get("OUT") or tempfile.mkdtemp())
    ap.add_argument("--pin", choices=["gpu", "none"], default="gpu",
                    help="gpu: run every process on the GPU's NUMA-local CPUs; none: wherever the scheduler puts it")
    a = ap.parse_args()
    if a.pin == "gpu":
        cpus = gpu_local_cpus()
        if cpus:
            os.sched_setaffinity(0, cpus)  # the processes started below inherit it
        print(f"pinned to CPUs {sorted(cpus)}" if cpus else "not pinned: the GPU's local CPUs are unknown", flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0, summary = time.time(), {}
    for w in a.workloads.split(","):
        variants = [v for v in (a.tiny_variants if w == "tiny" else a.variants).split(",") if v]
        bad = [v for v in variants if v not in ALL]
        if bad or "bare" not in variants:
            ap.error(f"variants must include bare and be of {', '.join(ALL)}")
        rounds: list[dict] = []
        for _ in range(a.rounds):
            r0 = time.time()
            rounds.append({v: one(w, v, out, a.steps, a.warmup) for v in variants})
            took = time.time() - r0
            if a.budget_s and time.time() - t0 + took > a.budget_s:
                break
        summary[w] = summarize(rounds, [v for v in variants if v != "bare"])
        summary[w]["raw"] = rounds
        print(json.dumps({w: {k: v for k, v in summary[w].items() if k != "raw"}}), flush=True)
        (out / "host_bound.json").write_text(json.dumps(summary, indent=1))
        if a.budget_s and time.time() - t0 > a.budget_s:
            print(f"budget of {a.budget_s:.0f} s reached after {w}", flush=True)
            break
    print("step x bare: wall (main thread's CPU)")
    for w, s in summary.items():
        print(f"{w:16} bare {s['bare_ms']:.2f} ms (CPU {s['bare_cpu_ms']:.2f} ms)  " +
              "  ".join(f"{v} {s[v]['x']:.3f}x ({s[v]['cpu_x']}x)" for v in ALL[1:] if v in s))
    print(f"total {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
