"""Diagnose why pastaprof's CUPTI capture does not come back after a torch.profiler
session (issue B, coexistence; scripts/gpu_coexist_check.py fails on the H200).  Runs
in-process, prints one line per experiment: kernel records CUPTI delivered to pastaprof
after each attempt to take CUPTI back.

    python scripts/gpu_coexist_diag.py OUTDIR
    python -m pastaprof.cli run -o RUN -- python scripts/gpu_coexist_diag.py OUTDIR

Measured on the H200 (fourth session): 60 of 60 kernels delivered after the session when
this thread forces the flush, in both ways of running it.
"""

from __future__ import annotations

import json
import sys
import time

import torch

import pastaprof
from pastaprof import live


def main() -> None:
    out = sys.argv[1]
    pastaprof.start(out=out, flush_ms=100000)
    h = next(h for h in live._session.handlers if h.name == "cupti")
    cupti, nat = h._cupti, h._native
    x = torch.randn(256, 256, device="cuda")

    def burst() -> int:
        nonlocal x
        before = nat.stat("kernels_seen")
        for _ in range(20):
            x = (x @ x).tanh()
        torch.cuda.synchronize()
        cupti.activity_flush_all(1)
        nat.drain() if hasattr(nat, "drain") else None
        return nat.stat("kernels_seen") - before

    def attr() -> object:
        import ctypes

        v, n = ctypes.c_uint8(7), ctypes.c_size_t(1)
        try:
            cupti.activity_get_attribute(cupti.ActivityAttribute.PER_THREAD_ACTIVITY_BUFFER, ctypes.addressof(n),
                                         ctypes.addressof(v))
            return v.value
        except Exception as e:  # noqa: BLE001
            return f"{type(e).__name__}: {e}"

    res = {"before": burst(), "per_thread_before": str(attr())}
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        burst()
    res["theirs"] = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    res["per_thread_after"] = str(attr())
    # The check (gpu_coexist_check.py) fails where this script passes; the difference under
    # test: who calls the forced flush.  First leave it to pastaprof's flush thread (which
    # forces a flush at each of its flushes after a foreign session), then flush here.
    seen = nat.stat("kernels_seen")
    for _ in range(20):
        x = (x @ x).tanh()
    torch.cuda.synchronize()
    time.sleep(2.5)
    res["flush_thread_only"] = nat.stat("kernels_seen") - seen
    cupti.activity_flush_all(1)
    res["then_flushed_from_this_thread"] = nat.stat("kernels_seen") - seen
    res["after_profiler"] = burst()
    steps = {
        "reattach": lambda: h.reattach(),
        "disable_enable": lambda: [cupti.activity_disable(k) for k in h._enabled] + [cupti.activity_enable(k) for k in h._enabled],
        "register_again": lambda: h._register(),
        "shared_buffers": lambda: nat.shared_buffers(),
        "finalize_then_reattach": lambda: (cupti.finalize(), h.reattach()),
    }
    for name, fn in steps.items():
        try:
            fn()
            err = None
        except Exception as e:  # noqa: BLE001
            err = f"{type(e).__name__}: {e}"
        time.sleep(0.2)
        res[name] = {"kernels": burst(), "error": err, "per_thread": str(attr()),
                     "buffers_requested": nat.stat("buffers_requested"), "foreign": nat.stat("foreign_buffers")}
    with open("/proc/self/maps") as f:
        res["libcupti"] = sorted({ln.split()[-1] for ln in f if "cupti" in ln})
    res["under_pastaprof_run"] = bool(__import__("os").environ.get("PASTAPROF_RUN_PARENT"))
    print(json.dumps(res))
    pastaprof.stop()


if __name__ == "__main__":
    main()
