"""Where the per-step host cost of `pastaprof run` sits, on a CPU (no GPU needed): the same
host-bound steps as bench/host_bound.py's ResNet-50 bs64 on the H200, but with every op on the
CPU at one thread, so the step is the host's time only.

    python bench/cpu_bound.py [--rounds 5] [--workloads mlp,pyloop,convnet] [--variants ...] [--out DIR]

Each fresh process runs this file as the user's script (``--child WORKLOAD``, which never imports
pastaprof): ``torch.set_num_threads(1)``, 3 warm-up steps, then 40 timed steps.  Workloads:
``mlp`` (10 training steps of 6 linear layers of 256 at batch 8 per step), ``convnet`` (4 training
steps of a ResNet-style net of 8 3x3 convolutions at 16-64 channels, batch 2 at 32x32),
``pyloop`` (torch imported, so the capture session runs, but each step is a pure Python + NumPy
loop: what the idle session costs code that is not torch's).  Variants are those of
bench/host_bound.py (``bare``, ``bare_preload``, ``pastaprof_nosession``, ``pastaprof_idle``,
``pastaprof_nothing``, ``pastaprof``, ...).  Rounds are interleaved.  Per process and step: wall
seconds, the main thread's CPU seconds (what the program's own thread did, hooks included) and the
process's CPU seconds (its other threads too), as medians and as the least step (noise only
adds); per run, the CPU seconds of everything outside the program's timed life (the `pastaprof
run` parent, its warm-up thread and compaction, and every variant's interpreter teardown: the
bare variant's value is the baseline).  The report gives medians over rounds and ratios to
bare's.  On a loaded machine the wall ratio drifts, and even a step's CPU time swings (2-core
VM, load 10: 40-160 ms for one step's work); the least step's main-thread CPU is the stable one.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def _make(workload: str):
    """The workload's step function (in the child: torch imported here, never pastaprof)."""
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    if workload == "mlp":
        model = torch.nn.Sequential(*[m for _ in range(6) for m in (torch.nn.Linear(256, 256), torch.nn.ReLU())])
        x, y = torch.randn(8, 256), torch.randn(8, 256)
        return _trainer(model, lambda: torch.nn.functional.mse_loss(model(x), y), reps=10)
    if workload == "convnet":
        model = _convnet(torch)
        x, y = torch.randn(2, 3, 32, 32), torch.randint(0, 10, (2,))
        return _trainer(model, lambda: torch.nn.functional.cross_entropy(model(x), y), reps=4)
    if workload == "pyloop":
        import numpy as np

        a = np.arange(64, dtype=np.float64)

        def step() -> None:
            acc, d = 0.0, {}
            for i in range(60_000):
                d[i & 1023] = i * 0.5
                acc += d[i & 511]
                if i % 100 == 0:
                    acc += float(np.dot(a, a))
        return step
    raise SystemExit(f"cpu_bound: unknown workload {workload!r} (mlp, convnet, pyloop)")


def _trainer(model, loss_fn, reps: int):
    import torch

    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step() -> None:
        for _ in range(reps):
            loss_fn().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    return step


def _convnet(torch):
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, c_in: int, c_out: int, stride: int) -> None:
            super().__init__()
            self.c1, self.b1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False), nn.BatchNorm2d(c_out)
            self.c2, self.b2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False), nn.BatchNorm2d(c_out)
            self.skip = (nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))
                         if stride != 1 or c_in != c_out else nn.Identity())

        def forward(self, x):
            return torch.relu(self.b2(self.c2(torch.relu(self.b1(self.c1(x))))) + self.skip(x))

    return nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                         Block(16, 16, 1), Block(16, 32, 2), Block(32, 64, 2), Block(64, 64, 1),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))


def child(workload: str, steps: int, warmup: int, out: str) -> None:
    """The user's script: timed steps, written to ``out`` as JSON."""
    step = _make(workload)
    for _ in range(warmup):
        step()
    wall, main_cpu, proc_cpu = [], [], []
    for _ in range(steps):
        w, c, p = time.perf_counter(), time.thread_time(), time.process_time()
        step()
        wall.append(time.perf_counter() - w)
        main_cpu.append(time.thread_time() - c)
        proc_cpu.append(time.process_time() - p)
    ru = resource.getrusage(resource.RUSAGE_SELF)
    Path(out).write_text(json.dumps({"wall": wall, "main_cpu": main_cpu, "proc_cpu": proc_cpu,
                                     "self_cpu": ru.ru_utime + ru.ru_stime, "threads": _thread_cpu(),
                                     "t_end": time.time()}))


def _thread_cpu() -> dict[str, float]:
    """CPU seconds so far of each thread of this process, by its Python name (or its kernel
    name, for threads Python did not start: torch's, pyarrow's): which of them took CPU."""
    import threading

    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    cpu: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat", "rb") as f:
                comm, rest = f.read().rsplit(b")", 1)
            fields = rest.split()
            name = names.get(int(tid)) or comm.split(b"(", 1)[1].decode(errors="replace")
            cpu[name] = round(cpu.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick, 3)
        except (OSError, ValueError, IndexError):
            continue
    return cpu


def one(workload: str, variant: str, out: Path, steps: int, warmup: int) -> dict:
    """One fresh process of ``variant``: per-step medians and the CPU spent outside the program."""
    import host_bound as hb

    js = out / f"{workload}-{variant}-{time.time_ns()}.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", workload, "--steps", str(steps),
           "--warmup", str(warmup), "--json", str(js)]
    run_dir = out / f"run-{workload}-{variant}-{time.time_ns()}"
    if variant == "bare_preload":
        cmd = [sys.executable, "-c", hb.PRELOAD, *cmd[1:]]
    elif variant in ("pastaprof_nosession", "pastaprof_nosession_inject"):
        cmd = [sys.executable, "-m", "pastaprof.cli", "run", "-o", str(run_dir), "--", "env", "-u", "PASTAPROF_OUT",
               *cmd]
    elif variant in hb.PP_FLAGS:
        cmd = [sys.executable, "-m", "pastaprof.cli", "run", "-o", str(run_dir), *hb.PP_FLAGS[variant], "--", *cmd]
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **hb.PP_ENV.get(variant, {})})
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t_return = time.time()
    if r.returncode != 0:
        raise SystemExit(f"cpu_bound: {workload} {variant} failed ({r.returncode}): {r.stderr[-800:]}")
    res = json.loads(js.read_text())
    js.unlink()
    all_cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    rec = {k: statistics.median(res[k]) for k in ("wall", "main_cpu", "proc_cpu")}
    # the least a step took: noise (descheduling, a neighbour's cache and frequency) only adds
    rec.update({f"{k}_min": min(res[k]) for k in ("wall", "main_cpu")})
    rec["outside_cpu_s"] = all_cpu - res["self_cpu"]  # the parent(s): pastaprof run, env
    rec["exit_s"] = t_return - res["t_end"]
    rec["threads"] = res["threads"]
    if run_dir.exists():
        import shutil

        shutil.rmtree(run_dir, ignore_errors=True)
    return rec


def summarize(rounds: list[dict], variants: list[str]) -> dict:
    """Medians over rounds per variant and their ratios to bare's medians."""
    med = {v: {k: statistics.median(r[v][k] for r in rounds) for k in rounds[0][v] if k != "threads"}
           for v in variants}
    b = med["bare"]
    s: dict = {"rounds": len(rounds), "bare_wall_ms": round(1e3 * b["wall"], 3),
               "bare_main_cpu_ms": round(1e3 * b["main_cpu"], 3)}
    for v in variants:
        m = med[v]
        s[v] = {"wall_x": round(m["wall"] / b["wall"], 3), "main_cpu_x": round(m["main_cpu"] / b["main_cpu"], 3),
                "wall_min_x": round(m["wall_min"] / b["wall_min"], 3),
                "main_cpu_min_x": round(m["main_cpu_min"] / b["main_cpu_min"], 3),
                "proc_cpu_x": round(m["proc_cpu"] / b["proc_cpu"], 3),
                "per_round_wall_x": [round(r[v]["wall"] / r["bare"]["wall"], 3) for r in rounds],
                "outside_cpu_s": round(m["outside_cpu_s"], 3), "exit_s": round(m["exit_s"], 3),
                "threads_cpu_s": rounds[-1][v]["threads"]}
    return s


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--json", help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--workloads", default="mlp,pyloop")
    ap.add_argument("--variants", default="bare,bare_preload,pastaprof_nosession,pastaprof_idle,pastaprof_nothing,"
                                          "pastaprof")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--out", default=os.environ.get("OUT") or tempfile.mkdtemp())
    a = ap.parse_args()
    if a.child:
        child(a.child, a.steps, a.warmup, a.json)
        return
    import host_bound as hb

    variants = [v for v in a.variants.split(",") if v]
    bad = [v for v in variants if v not in (*hb.ALL,) or v in hb.TP]
    if bad or "bare" not in variants:
        ap.error(f"variants must include bare and be of {', '.join(v for v in hb.ALL if v not in hb.TP)}")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0, summary = time.time(), {}
    load0 = os.getloadavg()[0]
    for w in a.workloads.split(","):
        rounds = [{v: one(w, v, out, a.steps, a.warmup) for v in variants} for _ in range(a.rounds)]
        summary[w] = summarize(rounds, variants)
        summary[w]["raw"] = rounds
        print(json.dumps({w: {k: v for k, v in summary[w].items() if k != "raw"}}), flush=True)
    summary["loadavg"] = [round(load0, 2), round(os.getloadavg()[0], 2)]
    (out / "cpu_bound.json").write_text(json.dumps(summary, indent=1))
    print(f"{'workload':9} {'variant':27} {'wall x':>7} {'min wall x':>10} {'main-CPU x':>10} {'min main-CPU x':>14} "
          f"{'proc-CPU x':>10} {'outside CPU s':>13}")
    for w in a.workloads.split(","):
        for v in variants:
            s = summary[w][v]
            print(f"{w:9} {v:27} {s['wall_x']:7.3f} {s['wall_min_x']:10.3f} {s['main_cpu_x']:10.3f} "
                  f"{s['main_cpu_min_x']:14.3f} {s['proc_cpu_x']:10.3f} {s['outside_cpu_s']:13.3f}")
    print("bare step ms: " + ", ".join(f"{w} {summary[w]['bare_wall_ms']}" for w in a.workloads.split(",")))
    print(f"load average {summary['loadavg'][0]} -> {summary['loadavg'][1]}; total {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
