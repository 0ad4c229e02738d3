"""A user's training script, unchanged for profiling (bench/host_bound.py runs it).

    python bench/user_steps.py WORKLOAD [--mode bare|tp_default|tp_full] [--warmup 3] [--steps 20] --json OUT

It never imports pastaprof: `pastaprof run` captures it from outside, as it would a user's
program.  It times each step (synchronized with the GPU) after ``--warmup`` steps and writes the
step seconds (wall, and the main thread's CPU seconds: what the program's own thread did, callbacks
included, apart from time it waited), the CPU seconds of each of the process's threads over the
timed steps (by thread name: the autograd engine's backward thread, a profiler's threads) and the wall-clock time its last step ended (``t_end``) to ``--json``, so the caller
can tell the steady-state step from the cost of leaving the program.  ``tp_default`` and
``tp_full`` wrap warm-up and timed steps in torch.profiler (default settings; with shapes, memory
and stacks), as a user of torch.profiler would.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workloads import make  # noqa: E402


def thread_cpu() -> dict[str, float]:
    """CPU seconds so far of each thread of this process, by OS thread name ("main" for the main
    thread; threads of one name are summed; Linux /proc)."""
    out: dict[str, float] = {}
    pid = str(os.getpid())
    tick = os.sysconf("SC_CLK_TCK")
    for task in Path("/proc/self/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        name = "main" if task.name == pid else stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("workload")
    ap.add_argument("--mode", choices=["bare", "tp_default", "tp_full"], default="bare")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    torch.manual_seed(0)
    step = make(a.workload)
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    prof = (contextlib.nullcontext() if a.mode == "bare" else
            torch.profiler.profile(activities=acts) if a.mode == "tp_default" else
            torch.profiler.profile(activities=acts, record_shapes=True, profile_memory=True, with_stack=True))
    per, cpu = [], []
    with prof:
        for _ in range(a.warmup):
            step()
        torch.cuda.synchronize()
        threads0 = thread_cpu()
        for _ in range(a.steps):
            t0, c0 = time.perf_counter(), time.thread_time()
            step()
            torch.cuda.synchronize()
            per.append(time.perf_counter() - t0)
            cpu.append(time.thread_time() - c0)
        t_end = time.time()
        threads1 = thread_cpu()
    stop_s = time.time() - t_end
    with open(a.json, "w") as f:
        json.dump({"workload": a.workload, "mode": a.mode, "steps": per, "cpu_steps": cpu, "t_end": t_end, "stop_s": stop_s,
                   "threads_cpu_s": {k: round(v - threads0.get(k, 0.0), 3) for k, v in threads1.items()}}, f)


if __name__ == "__main__":
    main()
