"""What each CUPTI setting costs a launch-bound step, one fresh process per variant (issue B).

    python bench/cupti_kinds.py [--workloads tiny,resnet50] [--rounds 3] [--steps 10] [--variants a,b]
    python bench/cupti_kinds.py --toggle [--workloads tiny] [--rounds 6] [--steps 3]

Every variant is its own process (CUPTI, once enabled on a context, leaves it slower:
bench/cupti_presence.py), run interleaved ``--rounds`` times.  Each process imports torch,
sets CUPTI's attributes (before the CUDA context exists), builds the workloads, enables the
variant's kinds, warms up three steps and times ``--steps`` synchronized steps (median).
The variants add one thing at a time, from CUPTI's kernel records alone (the floor of any
kernel trace) to the handler pastaprof starts, so the per-launch price of each piece shows:
kinds, the native drain against cupti-python's Python buffers, the flush period, the launch
callbacks, and the attributes that say where CUPTI keeps its buffers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# variant -> (kinds, settings).  kinds: K = kernels, C = memcpy+memset+sync, M = memory2+pool,
# and one at a time: Y = memcpy, S = memset, Z = synchronization.
VARIANTS: dict[str, tuple[str, dict]] = {
    "bare": ("", {}),
    "cupti_loaded": ("", {}),  # the native drain's buffers registered, no kind enabled
    "kernel": ("K", {}),
    "kernel_py": ("K", {"python": True}),  # cupti-python's buffer callbacks, records counted only
    "kernel_pinned": ("K", {"attr": {"ATTR_MEM_ALLOCATION_TYPE_HOST_PINNED": 1}}),
    "kernel_shared_buf": ("K", {"attr": {"ATTR_PER_THREAD_BUFFER": 0}}),
    "copies_memory": ("CM", {}),  # what stays on with every PASTAPROF_OFF part set
    "memcpy": ("Y", {}),
    "memset": ("S", {}),
    "sync": ("Z", {}),
    "memory": ("M", {}),
    "kernel_copies": ("KC", {}),
    "kernel_copies_memory": ("KCM", {}),
    "kinds_flush": ("KCM", {"flush_ms": 1000}),
    "kinds_flush_callbacks": ("KCM", {"flush_ms": 1000, "callbacks": True}),
    "handler": ("", {"handler": True}),  # CuptiActivityHandler.start(), as pastaprof run does
    # the floor of the capture (every op with its inputs, every kernel): an empty
    # RecordFunction callback handed the op's inputs, alone and with CUPTI's kernel records
    "rf_inputs": ("", {"rf_inputs": True}),  # (CUPTI's buffers registered, as in cupti_loaded)
    "floor": ("K", {"rf_inputs": True}),
    # ... with every kind issue B asks for (kernels, copies, memsets, syncs, allocations)
    "required_floor": ("KCM", {"rf_inputs": True}),
}


def _native_drain():
    """pastaprof's native drain, its buffers registered with CUPTI."""
    from pastaprof import native
    from pastaprof.handlers.cupti_native import NativeCupti
    from pastaprof.handlers.cupti_records import BUFFER_BYTES

    drain = NativeCupti(native.load("cupti"), native.loaded_libcupti(), BUFFER_BYTES)
    drain.register()
    return drain


def _callback_cbids(cupti, drain) -> list[tuple[bool, int]]:
    """The launch callbacks' cbids as ``pastaprof run`` keeps them (for ``callbacks_on``)."""
    from pastaprof.handlers.cupti_activity import CuptiActivityHandler
    from pastaprof.live.config import CaptureConfig

    h = CuptiActivityHandler(CaptureConfig.from_env({}))
    h._cupti, h._native = cupti, drain
    return h._keep_api_names()


def child(variant: str, workloads: list[str], steps: int) -> dict:
    import torch  # loads torch's libcupti (Kineto), the one cupti-python must reuse
    from cupti import cupti
    from workloads import make, timed_steps

    kinds, opt = VARIANTS[variant]
    K = cupti.ActivityKind
    if variant != "bare":
        cupti.get_timestamp()
        for name, value in opt.get("attr", {}).items():
            import ctypes

            v = ctypes.c_uint8(value)  # both attributes used here are uint8_t
            size = ctypes.c_size_t(ctypes.sizeof(v))
            cupti.activity_set_attribute(getattr(cupti.ActivityAttribute, name), ctypes.addressof(size),
                                         ctypes.addressof(v))
    steps_of = {w: make(w) for w in workloads}
    torch.cuda.synchronize()
    seen = [0]
    handler = None
    if opt.get("handler"):
        from pastaprof.handlers.cupti_activity import CuptiActivityHandler
        from pastaprof.live.config import CaptureConfig

        handler = CuptiActivityHandler(CaptureConfig.from_env({}))
        handler.start()
        if handler.status:
            raise SystemExit(handler.status)
    elif opt.get("python"):
        def requested():
            return 8 << 20, 0

        def completed(records):
            seen[0] += len(records)

        cupti.activity_register_callbacks(requested, completed)
    elif variant != "bare":
        drain = _native_drain()
        if opt.get("callbacks") and drain.callbacks_on(_callback_cbids(cupti, drain)) != 0:
            raise SystemExit("callbacks refused")
    for letter, names in (("K", [K.CONCURRENT_KERNEL]), ("C", [K.MEMCPY, K.MEMSET, K.SYNCHRONIZATION]),
                          ("M", [K.MEMORY2, K.MEMORY_POOL]), ("Y", [K.MEMCPY]), ("S", [K.MEMSET]),
                          ("Z", [K.SYNCHRONIZATION])):
        if letter in kinds:
            for k in names:
                cupti.activity_enable(k)
    if opt.get("flush_ms"):
        cupti.activity_flush_period(opt["flush_ms"])
    if opt.get("rf_inputs"):
        from pastaprof import native

        native.load("torch").pp_obs_floor_start(1)
    out = {}
    for w, step in steps_of.items():
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        per = timed_steps(step, steps)
        out[w] = {"median": statistics.median(per), "min": min(per)}
        if kinds or handler is not None:  # what delivering one step's records at exit costs
            flushes = []
            for _ in range(3):
                step()
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                cupti.activity_flush_all(1)
                flushes.append(time.perf_counter() - t0)
            out[w]["flush_ms"] = statistics.median(flushes) * 1e3
    if handler is not None:
        handler.stop()
        out["kernels_seen"] = handler.kernels_seen
    return out


def toggle(workload: str, rounds: int, steps: int) -> dict:
    """In one process, with kernel records on throughout: each extra kind (memcpy, memset,
    sync, memory2+pool) and the launch callbacks switched on and off in turn, ``steps``
    steps per phase, ``rounds`` times.  A kind's cost is its phase against the kernel-only phase just before it, so the
    host's drift over the minutes of a run (bare steps 120-210 ms between processes in one
    device call) cancels out."""
    import torch
    from cupti import cupti
    from workloads import make, timed_steps

    K = cupti.ActivityKind
    step = make(workload)
    cupti.get_timestamp()
    drain = _native_drain()
    kept = _callback_cbids(cupti, drain)
    cupti.activity_enable(K.CONCURRENT_KERNEL)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    extra = {"memcpy": [K.MEMCPY], "memset": [K.MEMSET], "sync": [K.SYNCHRONIZATION],
             "memory": [K.MEMORY2, K.MEMORY_POOL], "callbacks": []}
    ratios: dict[str, list[float]] = {k: [] for k in extra}
    for _ in range(rounds):
        for name, kinds in extra.items():
            base = statistics.median(timed_steps(step, steps))
            for k in kinds:
                cupti.activity_enable(k)
            if name == "callbacks" and drain.callbacks_on(kept) != 0:
                raise SystemExit("callbacks refused")
            with_kind = statistics.median(timed_steps(step, steps))
            for k in kinds:
                cupti.activity_disable(k)
            if name == "callbacks":
                drain.callbacks_off()
            ratios[name].append(with_kind / base)
        drain.take()  # keep the drain's memory flat
    return {name: {"x": round(statistics.median(v), 3), "per_round": [round(x, 3) for x in v]}
            for name, v in ratios.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", default="tiny,resnet50")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--toggle", action="store_true",
                    help="in one process: each extra kind on and off against kernel records alone")
    a = ap.parse_args()
    workloads = a.workloads.split(",")
    if a.toggle:
        for w in workloads:
            print(json.dumps({"toggle": w, **toggle(w, a.rounds, a.steps)}), flush=True)
        return
    if a.child:
        print(json.dumps(child(a.child, workloads, a.steps)))
        return
    variants = [v for v in a.variants.split(",") if v]
    for v in variants:
        if v not in VARIANTS:
            ap.error(f"unknown variant {v!r}; of: {', '.join(VARIANTS)}")
    if "bare" not in variants:
        variants.insert(0, "bare")
    times: dict[str, dict[str, list[float]]] = {v: {w: [] for w in workloads} for v in variants}
    for r in range(a.rounds):
        for v in variants:
            cmd = [sys.executable, __file__, "--child", v, "--workloads", a.workloads, "--steps", str(a.steps)]
            p = subprocess.run(cmd, capture_output=True, text=True, env=os.environ)
            if p.returncode != 0:
                print(json.dumps({"variant": v, "round": r, "failed": p.stderr[-800:]}), flush=True)
                continue
            res = json.loads(p.stdout.strip().splitlines()[-1])
            for w in workloads:
                times[v][w].append(res[w]["median"])
            print(json.dumps({"variant": v, "round": r, **{w: round(res[w]["median"] * 1e3, 3) for w in workloads},
                              **{f"{w}_flush_ms": round(res[w]["flush_ms"], 3) for w in workloads
                                 if "flush_ms" in res[w]}}), flush=True)
    summary = {}
    for w in workloads:
        bare = statistics.median(times["bare"][w])
        summary[w] = {v: {"ms": round(statistics.median(t[w]) * 1e3, 3), "x": round(statistics.median(t[w]) / bare, 3),
                          "per_round_x": [round(s / bare, 3) for s in t[w]]}
                      for v, t in times.items() if t[w]}
    print(json.dumps({"summary": summary}, indent=1), flush=True)


if __name__ == "__main__":
    main()
