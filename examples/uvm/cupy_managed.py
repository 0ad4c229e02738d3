"""Unified-memory programs on CuPy managed memory, for issue C's proof.

    python examples/uvm/cupy_managed.py [--workload gather|pingpong] --mode naive|hand|pin|advise
        [--plan plan.json] [--mib 256] [--iters 5] [--threads 128]

``gather`` (the fault-bound example): the CPU fills a table once (range cpu_fill, outside
the timed loop), then each iteration the GPU gathers one float from every 4 KiB page of
it in a scrambled order (range gpu_gather: ``--threads`` threads; page i of the walk is
(i * odd stride) mod pages, a permutation, so neighbouring threads touch pages far apart and
the driver's prefetcher finds little to do).  Naive, the first gather migrates the table page fault by page fault; ``hand``
prefetches it to the GPU once, after the fill; ``advise`` marks it read-mostly instead.

Hand-written alternatives in both workloads: ``pin`` keeps the pages on the CPU and lets
the GPU map them (SetPreferredLocation=cpu, SetAccessedBy=device): with a few bytes
touched per page, remote access may beat moving every page.

``pingpong``: each iteration the CPU updates one value in every 4 KiB page of the buffer (range
cpu_write: a table the host patches sparsely, so every page faults back to the CPU), the
GPU doubles one value per page, 32 threads each walking a chunk in order (range gpu_scale:
every page faults back to the GPU, 32 faults in flight at a time) and the CPU reads a
slice (range cpu_read).  The time goes to page faults, not to the work.  ``naive`` leaves all
migration to page faults; ``hand`` prefetches by hand: to the GPU before gpu_scale, to
the CPU before cpu_write; ``pin`` instead keeps the pages on the CPU and maps them to
the GPU: with a few values touched per page on each side, remote access may beat moving
every page twice.  ``--plan`` applies a uvm_advisor plan instead
(``pastaprof.apply_uvm_plan``, no capture).  Prints one JSON line with the loop's seconds.
The buffer is at most a quarter of the GPU's free memory (never oversubscribe by accident).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import time

import cupy as cp
import numpy as np

import pastaprof


def location(device: int | None):
    """The CPU (None) or a GPU, as cudaMemPrefetchAsync and cudaMemAdvise take it."""
    from cuda.bindings import runtime as rt

    loc = rt.cudaMemLocation()
    if device is None:
        loc.type, loc.id = rt.cudaMemLocationType.cudaMemLocationTypeHost, 0
    else:
        loc.type, loc.id = rt.cudaMemLocationType.cudaMemLocationTypeDevice, device
    return loc


def check(what: str, err) -> None:
    if int(err) != 0:
        raise RuntimeError(f"{what}: CUDA error {int(err)}")


def prefetch(ptr: int, size: int, device: int | None) -> None:
    from cuda.bindings import runtime as rt

    check("cudaMemPrefetchAsync", rt.cudaMemPrefetchAsync(ptr, size, location(device), 0, 0)[0])


WALK = r"""
extern "C" __global__ void walk(float* x, long n) {
  long chunk = n / blockDim.x, lo = threadIdx.x * chunk;
  for (long i = lo; i < lo + chunk; i += 1024) x[i] *= 2.0f;   // one float per 4 KiB page
}
"""


def pin(ptr: int, size: int, device: int) -> None:
    from cuda.bindings import runtime as rt

    A = rt.cudaMemoryAdvise
    check("cudaMemAdvise", rt.cudaMemAdvise(ptr, size, A.cudaMemAdviseSetPreferredLocation, location(None))[0])
    check("cudaMemAdvise", rt.cudaMemAdvise(ptr, size, A.cudaMemAdviseSetAccessedBy, location(device))[0])


GATHER = r"""
extern "C" __global__ void gather(const float* x, long pages, long stride, float* out) {
  long t = blockIdx.x * (long)blockDim.x + threadIdx.x, nt = (long)gridDim.x * blockDim.x;
  float acc = 0.0f;
  for (long i = t; i < pages; i += nt) {
    long page = (i * stride) & (pages - 1);         // odd stride, pages a power of two: a permutation
    acc += x[page * 1024];                          // one float per 4 KiB page
  }
  out[t] = acc;
}
"""


STRIDE = 2654435761  # odd: page i of the walk is (i * STRIDE) mod pages, every page once


def read_mostly(ptr: int, size: int, device: int) -> None:
    from cuda.bindings import runtime as rt

    advice = rt.cudaMemoryAdvise.cudaMemAdviseSetReadMostly
    check("cudaMemAdvise", rt.cudaMemAdvise(ptr, size, advice, location(device))[0])


def run_gather(a: argparse.Namespace, nbytes: int) -> dict:
    """The fault-bound example: one CPU fill, then GPU gathers over every page."""
    pages = 1 << ((nbytes >> 12).bit_length() - 1)  # a power of two, for the permutation
    nbytes = pages << 12
    mem = cp.cuda.malloc_managed(nbytes)
    n = nbytes // 4
    x = cp.ndarray((n,), cp.float32, mem)
    block = min(256, max(32, a.threads))
    threads = max(block, min(a.threads, pages) // block * block)
    out = cp.zeros(threads, cp.float32)
    kernel = cp.RawKernel(GATHER, "gather")
    host = np.ctypeslib.as_array(ctypes.cast(mem.ptr, ctypes.POINTER(ctypes.c_float)), (n,))
    with pastaprof.range("cpu_fill"):
        host[:] = 1.0
    total = 0.0
    t0 = time.perf_counter()  # the hand-written versions pay for their prefetch or advice
    if a.mode == "hand":
        prefetch(mem.ptr, nbytes, cp.cuda.Device().id)
    elif a.mode == "advise":
        read_mostly(mem.ptr, nbytes, cp.cuda.Device().id)
    elif a.mode == "pin":
        pin(mem.ptr, nbytes, cp.cuda.Device().id)
    for _ in range(a.iters):
        with pastaprof.range("gpu_gather"):
            kernel((threads // block,), (block,), (x, cp.int64(pages), cp.int64(STRIDE), out))
            total += float(out.sum())
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "check": total, "pages": pages, "threads": threads}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", choices=["gather", "pingpong"], default="gather")
    ap.add_argument("--mode", choices=["naive", "hand", "pin", "advise"], default="naive")
    ap.add_argument("--threads", type=int, default=128)
    ap.add_argument("--plan")
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--iters", type=int, default=5)
    a = ap.parse_args()
    free, _total = cp.cuda.runtime.memGetInfo()
    nbytes = min(a.mib << 20, free // 4)
    if a.plan:
        pastaprof.apply_uvm_plan(a.plan)
    if a.workload == "gather":
        res = run_gather(a, nbytes)
        print(json.dumps({"workload": "gather", "mode": "plan" if a.plan else a.mode, "bytes": nbytes,
                          "iters": a.iters, **res}))
        return
    mem = cp.cuda.malloc_managed(nbytes)
    n = nbytes // 4
    x = cp.ndarray((n,), cp.float32, mem)
    walk = cp.RawKernel(WALK, "walk")
    host = np.ctypeslib.as_array(ctypes.cast(mem.ptr, ctypes.POINTER(ctypes.c_float)), (n,))
    host[:] = 1.0  # first touch, outside the timed loop
    if a.mode in ("pin", "advise"):  # pingpong: both keep the pages on the CPU
        pin(mem.ptr, nbytes, cp.cuda.Device().id)
    total = 0.0
    t0 = time.perf_counter()
    for it in range(a.iters):
        if a.mode == "hand":
            prefetch(mem.ptr, nbytes, None)
            cp.cuda.Device().synchronize()
        with pastaprof.range("cpu_write"):
            host[::1024] = it  # one float per 4 KiB page
        if a.mode == "hand":
            prefetch(mem.ptr, nbytes, cp.cuda.Device().id)
        with pastaprof.range("gpu_scale"):
            walk((1,), (32,), (x, cp.int64(n)))
            cp.cuda.Device().synchronize()
        with pastaprof.range("cpu_read"):
            total += float(host[: 1 << 20].sum())
    seconds = time.perf_counter() - t0
    print(json.dumps({"workload": "pingpong", "mode": "plan" if a.plan else a.mode, "bytes": nbytes,
                      "iters": a.iters, "seconds": seconds, "check": total}))


if __name__ == "__main__":
    main()
