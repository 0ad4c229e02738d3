"""What narrowed capture costs outside its window (issue B: "cheap enough to leave on").

    python bench/gated_capture.py [--device cpu|cuda] [--repeat 5] [--steps 20]

A conv-net training loop (24 conv+BN+ReLU blocks, SGD), one process per variant, interleaved
``--repeat`` times: bare; ``pastaprof run`` recording everything; ``pastaprof run --steps
1000:1001`` (a window the loop never reaches: every measured step is outside it); the same
with ``PASTAPROF_OFF=gate`` (recording throughout, the store alone gates: the cost before
gating at the source).  The op observer, the module-path wrapper (handlers/torch_ops.py
``set_gate``) and CUPTI's per-launch records (handlers/cupti_activity.py ``set_gate``) are
gated at the source, so outside a window a step should cost about what it costs bare; step 0
is observed whatever the window (the observer learns the program's signatures there) and is
not measured.  Prints the median step time of steps 2..N per variant (median over processes)
and its ratio to bare.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

APP = textwrap.dedent("""
    import json, sys, time, torch
    dev, n = sys.argv[1], int(sys.argv[2])
    torch.manual_seed(0)
    torch.set_num_threads(1)
    blocks = [torch.nn.Sequential(torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU())
              for _ in range(24)]
    net = torch.nn.Sequential(*blocks, torch.nn.Flatten(), torch.nn.Linear(16 * 16 * 16, 10)).to(dev)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    x = torch.randn(2, 16, 16, 16, device=dev)
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        net(x).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if dev == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    print(json.dumps(times[2:]))
""")

VARIANTS = {"bare": None, "pastaprof_all": [], "pastaprof_outside_window": ["--steps", "1000:1001"],
            "store_gated_outside_window": ["--steps", "1000:1001"]}
ENV = {"store_gated_outside_window": {"PASTAPROF_OFF": "gate"}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    app = tmp / "app.py"
    app.write_text(APP)
    per: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for r in range(a.repeat):
        for v, flags in VARIANTS.items():
            cmd = [sys.executable, str(app), a.device, str(a.steps)]
            if flags is not None:
                cmd = [sys.executable, "-m", "pastaprof.cli", "run", "-o", str(tmp / f"{v}-{r}"), *flags, "--", *cmd]
            out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **ENV.get(v, {})},
                                 check=True).stdout
            per[v].append(statistics.median(json.loads(out.strip().splitlines()[-1])))
    bare = statistics.median(per["bare"])
    print(json.dumps({v: {"step_ms": round(statistics.median(t) * 1e3, 3), "x": round(statistics.median(t) / bare, 3)}
                      for v, t in per.items()}))


if __name__ == "__main__":
    main()
