"""Per-op cost of pastaprof's PyTorch capture, configurations toggled inside one process (issue B).

    python bench/op_capture_inprocess.py [--workloads tiny,resnet50] [--rounds 3] [--steps 5]

Process-to-process spread on the lent H200 reaches 15-50% (docs/benchmarks.md), more than the
differences wanted here, so one process runs every configuration, interleaved: bare (nothing
attached); the C++ op observer lean (no shapes, no call sites), with shapes, with shapes and call
sites (the default); the caching-allocator tracker alone.  No CUPTI: this isolates the PyTorch side.
Each cell: median seconds of `--steps` steps (synchronized), median over rounds, and microseconds
per recorded op over bare.  Workloads from bench/workloads.py (a GPU is needed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", default="tiny,resnet50")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    a = ap.parse_args()
    import torch
    from workloads import make

    from pastaprof import native
    from pastaprof.handlers.torch_native import NativeOps

    lib = native.load("torch")
    ops = NativeOps(lib, 0)
    configs = {"bare": None, "ops_lean": (0, 0), "ops_shapes": (1, 0), "ops_full": (1, 1), "tensors": "mem"}
    out = {}
    for name in a.workloads.split(","):
        step = make(name)
        for _ in range(2):
            step()
        torch.cuda.synchronize()
        times: dict[str, list[float]] = {c: [] for c in configs}
        n_ops = 0
        for _ in range(a.rounds):
            for cfg, how in configs.items():
                if isinstance(how, tuple):
                    lib.pp_obs_start(None, None, 0, how[0], how[1])
                elif how == "mem":
                    if lib.pp_mem_start() != 0:
                        continue
                    ops.mem = True  # its events drained below
                per = []
                for _ in range(a.steps):
                    t0 = time.perf_counter()
                    step()
                    torch.cuda.synchronize()
                    per.append(time.perf_counter() - t0)
                if isinstance(how, tuple):
                    lib.pp_obs_stop()
                elif how == "mem":
                    lib.pp_mem_stop()
                drained = ops.drain()
                if cfg == "ops_full" and "op" in drained:
                    n_ops = drained["op"].num_rows // a.steps
                times[cfg].append(statistics.median(per))
        bare = statistics.median(times["bare"])
        res = {c: {"s": round(statistics.median(t), 6), "x": round(statistics.median(t) / bare, 3)}
               for c, t in times.items() if t}
        for c in res:
            if n_ops:
                res[c]["us_per_op"] = round((res[c]["s"] - bare) / n_ops * 1e6, 3)
        out[name] = {"ops_per_step": n_ops, **res}
        print(json.dumps({name: out[name]}), flush=True)


if __name__ == "__main__":
    main()
