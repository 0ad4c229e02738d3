"""What the op observer's shapes modes cost on the CPU, toggled in one process (no GPU needed).

    python bench/shapes_cpu.py [--rounds 7] [--ops 20000]

Modes, interleaved ``--rounds`` times around the same two workloads: ``bare`` (no observer);
``none`` (the observer, no inputs boxed: ``--no-shapes``); ``sample`` (sampled inputs, the
default, its first phase skipped: the steady state); ``all`` (every op's inputs, ``--shapes all``).
Workloads: ``--ops`` x ``x.add_(1)`` on a 1-element tensor, and 50 steps of a 4-layer MLP
(forward, backward, SGD).  Prints each mode's median and fastest region over bare's.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from pastaprof import native
from pastaprof.handlers.torch_native import SAMPLE_CHASE, SAMPLE_PERIOD, SAMPLE_WINDOW, SHAPES_MODES, NativeOps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--ops", type=int, default=20000)
    a = ap.parse_args()
    lib = native.load("torch")
    ops = NativeOps(lib, 0)
    x = torch.zeros(1)
    net = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(4)])
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    data = torch.randn(32, 256)

    def adds() -> None:
        for _ in range(a.ops):
            x.add_(1)

    def train() -> None:
        for _ in range(50):
            net(data).sum().backward()
            opt.step()
            opt.zero_grad()

    work = {"adds": adds, "train": train}
    modes = ["bare", "none", "sample", "all"]
    res = {w: {m: [] for m in modes} for w in work}
    for f in work.values():
        f()  # warm-up
    for _ in range(a.rounds):
        for m in modes:
            if m != "bare":
                code = SHAPES_MODES[m]
                if code:
                    lib.pp_obs_sampling(code, 1, SAMPLE_PERIOD, SAMPLE_WINDOW, SAMPLE_CHASE)
                lib.pp_obs_start(None, None, 0, 3 if code else 0, 1)
            for w, f in work.items():
                t0 = time.perf_counter()
                f()
                res[w][m].append(time.perf_counter() - t0)
            if m != "bare":
                lib.pp_obs_stop()
                ops.drain()
    for w, r in res.items():
        fast, med = min(r["bare"]), statistics.median(r["bare"])
        print(w, {m: f"median {statistics.median(v) / med:.2f}x, fastest {min(v) / fast:.2f}x" for m, v in r.items()})


if __name__ == "__main__":
    main()
