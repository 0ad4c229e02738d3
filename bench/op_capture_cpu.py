"""Per-op cost of recording PyTorch ops on the CPU, side by side in one run (issue B).

    python bench/op_capture_cpu.py [--ops 20000] [--repeat 5]

Interleaved, `--repeat` times: bare; pastaprof's C++ RecordFunction observer (sampled shapes +
call sites, the default); with every op's shapes (``--shapes all``); its lean mode (no shapes,
no call sites); the Python
TorchDispatchMode fallback (PASTAPROF_NATIVE=0); torch.profiler (CPU activity,
record_shapes, with_stack).  Workloads: `--ops` x ``x.add_(1)`` on a 1-element CPU
tensor, and a 4-layer MLP training step (forward, backward, SGD).  Each configuration
runs in its own process (``python -m pastaprof.cli run`` for pastaprof); the timed region
excludes start-up and the final flush.  Prints us/op over bare.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

APP = r'''
import json, sys, time, torch
mode, n = sys.argv[1], int(sys.argv[2])
x = torch.zeros(1)
net = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(4)])
opt = torch.optim.SGD(net.parameters(), lr=0.01)
data = torch.randn(32, 256)
def adds():
    for _ in range(n): x.add_(1)
def train():
    for _ in range(n // 200):
        net(data).sum().backward(); opt.step(); opt.zero_grad()
for f in (adds, train): f()  # warm-up
out = {}
prof = None
if mode == "torchprof":
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True, with_stack=True)
    prof.__enter__()
for name, f in (("adds", adds), ("train", train)):
    t0 = time.perf_counter(); f(); out[name] = time.perf_counter() - t0
if prof is not None:
    prof.__exit__(None, None, None)
print(json.dumps(out))
'''


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    d = tempfile.mkdtemp()
    app = os.path.join(d, "app.py")
    with open(app, "w") as f:
        f.write(APP)
    pp = [sys.executable, "-m", "pastaprof.cli", "run", "--force", "-o", os.path.join(d, "run"), "--"]
    configs = {"bare": ([], {}), "native": (pp, {}), "native_all": (pp, {"PASTAPROF_SHAPES": "all"}),
               "native_lean": (pp, {"PASTAPROF_SHAPES": "0", "PASTAPROF_CALL_SITES": "0"}),
               "python_mode": (pp, {"PASTAPROF_NATIVE": "0"}), "torchprof": ([], {})}
    res: dict[str, list[dict]] = {k: [] for k in configs}
    for _ in range(a.repeat):
        for name, (wrap, env) in configs.items():
            mode = "torchprof" if name == "torchprof" else "bare"
            r = subprocess.run(wrap + [sys.executable, app, mode, str(a.ops)], capture_output=True, text=True,
                               env={**os.environ, **env})
            if r.returncode != 0:
                raise SystemExit(r.stderr[-2000:])
            res[name].append(json.loads(r.stdout.strip().splitlines()[-1]))
    med = {k: {w: statistics.median(x[w] for x in v) for w in ("adds", "train")} for k, v in res.items()}
    # ops per workload, from a native run: adds = n x (add_ and what it calls); train = what the steps run
    out = {"ops": a.ops, "median_seconds": med,
           "x_bare": {k: {w: round(med[k][w] / med["bare"][w], 2) for w in ("adds", "train")} for k in med}}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
