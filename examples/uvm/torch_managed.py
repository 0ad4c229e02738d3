"""PyTorch on unified memory through a pluggable allocator (issue C's second example).

    python examples/uvm/torch_managed.py --mode naive|hand [--plan plan.json] [--width 4096]
        [--layers 4] [--batch 8192] [--steps 5] [--oversubscribe 1.0]

Every CUDA tensor of PyTorch is cudaMallocManaged memory (``managed_alloc.c`` next to this
file, a ``torch.cuda.memory.CUDAPluggableAllocator``, built with the C compiler on first
use).  Each step the CPU writes the next batch into a managed buffer through a NumPy view
(range ``cpu_batch``), the GPU trains an MLP on it (range ``train_step``) and the CPU
reads the loss.  The parameters and the batch buffer are announced with
``pastaprof.track_managed`` so a uvm_advisor plan can name them.

``naive`` leaves every migration to page faults; ``hand`` prefetches the batch to the
CPU before it is written and the batch and parameters to the GPU before the step;
``--plan`` applies a uvm_advisor plan instead (``pastaprof.apply_uvm_plan``).

``--oversubscribe F`` (> 1): after one warm-up step (outside the ranges, untimed) that
measures the most managed memory PyTorch holds at once (counted by the allocator), the
live tensors are moved back to the CPU and a plain cudaMalloc ballast takes all free GPU
memory but peak / F, so the managed working set gets 1/F of what it needs and the driver
must evict.  Safety: the managed memory asked for is never more than the GPU had free at
start (checked against an upper estimate before anything is allocated), and the ballast
always leaves peak / F free.  Prints one JSON line.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import torch

import pastaprof

HERE = Path(__file__).resolve().parent


def build_allocator() -> Path:
    src = HERE / "managed_alloc.c"
    tag = hashlib.sha256(src.read_bytes()).hexdigest()[:12]
    out = Path(os.environ.get("PASTAPROF_CACHE") or Path.home() / ".cache" / "pastaprof") / "examples"
    lib = out / f"managed_alloc-{tag}.so"
    if not lib.exists():
        out.mkdir(parents=True, exist_ok=True)
        tmp = lib.with_suffix(f".{os.getpid()}.tmp")
        subprocess.run([os.environ.get("CC", "gcc"), "-O2", "-shared", "-fPIC", "-o", str(tmp), str(src), "-ldl"],
                       check=True)
        os.replace(tmp, lib)
    return lib


def prefetch(t_ptr: int, size: int, device: int | None) -> None:
    from cuda.bindings import runtime as rt

    loc = rt.cudaMemLocation()
    if device is None:
        loc.type, loc.id = rt.cudaMemLocationType.cudaMemLocationTypeHost, 0
    else:
        loc.type, loc.id = rt.cudaMemLocationType.cudaMemLocationTypeDevice, device
    stream = torch.cuda.current_stream().cuda_stream
    (err,) = rt.cudaMemPrefetchAsync(t_ptr, size, loc, 0, stream)
    if int(err) != 0:
        raise RuntimeError(f"cudaMemPrefetchAsync: CUDA error {int(err)}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["naive", "hand"], default="naive")
    ap.add_argument("--plan")
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--oversubscribe", type=float, default=1.0)
    a = ap.parse_args()

    lib_path = build_allocator()
    alloc = torch.cuda.memory.CUDAPluggableAllocator(str(lib_path), "pp_managed_malloc", "pp_managed_free")
    torch.cuda.memory.change_current_allocator(alloc)
    dev = torch.cuda.current_device()
    free0, _total = torch.cuda.mem_get_info(dev)
    # managed working set: parameters + gradients + SGD momentum + batch + activations (x2 margin)
    w, layers, b = a.width, a.layers, a.batch
    working = 4 * (3 * layers * w * w + 2 * b * w + 2 * layers * b * w) * 2
    if working > free0:
        raise SystemExit(f"working set {working >> 20} MiB exceeds the GPU's free {free0 >> 20} MiB: "
                         "choose a smaller --width/--batch (never oversubscribe by asking for more than is free)")
    lib = ctypes.CDLL(str(lib_path))
    lib.pp_ballast.restype = ctypes.c_void_p
    lib.pp_ballast.argtypes = [ctypes.c_size_t]
    lib.pp_peak_bytes.restype = ctypes.c_longlong
    if a.plan:
        pastaprof.apply_uvm_plan(a.plan)

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(w, w) for _ in range(layers)]).to("cuda")
    opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
    batch = torch.empty(b, w, device="cuda")
    for p in model.parameters():  # named for uvm_advisor plans: this line, ordinal = parameter index
        pastaprof.track_managed(p.data_ptr(), p.numel() * p.element_size())
    pastaprof.track_managed(batch.data_ptr(), batch.numel() * batch.element_size())
    host = np.ctypeslib.as_array(ctypes.cast(batch.data_ptr(), ctypes.POINTER(ctypes.c_float)), (b * w,))
    rng = np.random.default_rng(0)
    noise = rng.standard_normal(w, dtype=np.float32)
    nbytes = batch.numel() * batch.element_size()

    def train() -> float:
        opt.zero_grad(set_to_none=False)
        loss = model(batch).square().mean()
        loss.backward()
        opt.step()
        return float(loss)

    # One warm-up step outside the ranges: the most managed memory PyTorch holds at once.
    host.reshape(b, w)[:] = noise
    train()
    peak = int(lib.pp_peak_bytes())
    ballast = None
    if a.oversubscribe > 1.0:
        # Move what lives on the GPU back to the CPU, then take all but peak / F of the free
        # GPU memory: the managed working set gets 1/F of what it needs and must evict.
        live = [batch, *model.parameters(), *(p.grad for p in model.parameters() if p.grad is not None),
                *(s["momentum_buffer"] for s in opt.state.values() if s.get("momentum_buffer") is not None)]
        for t in live:
            prefetch(t.data_ptr(), t.numel() * t.element_size(), None)
        torch.cuda.synchronize()
        free_now, _ = torch.cuda.mem_get_info(dev)
        ballast_bytes = max(0, free_now - int(peak / a.oversubscribe))
        ballast = lib.pp_ballast(ballast_bytes)
        if not ballast:
            raise SystemExit("could not allocate the ballast")
    losses = []
    torch.cuda.synchronize()
    free_start = torch.cuda.mem_get_info(dev)[0]  # what the managed working set may use now
    t0 = time.perf_counter()
    for step in range(a.steps):
        if a.mode == "hand":
            prefetch(batch.data_ptr(), nbytes, None)
            torch.cuda.synchronize()
        with pastaprof.range("cpu_batch"):
            host.reshape(b, w)[:] = noise * (step + 1)
        if a.mode == "hand":
            prefetch(batch.data_ptr(), nbytes, dev)
            for p in model.parameters():
                prefetch(p.data_ptr(), p.numel() * p.element_size(), dev)
        with pastaprof.range("train_step"):
            losses.append(train())
    seconds = time.perf_counter() - t0
    print(json.dumps({"mode": "plan" if a.plan else a.mode, "estimated_working_set_bytes": working,
                      "managed_peak_bytes": peak, "oversubscribe": a.oversubscribe,
                      "ballast_bytes": ballast_bytes if ballast else 0, "free_at_start_bytes": free_start,
                      "free_at_end_bytes": torch.cuda.mem_get_info(dev)[0], "steps": a.steps, "seconds": seconds,
                      "loss": losses[-1]}))


if __name__ == "__main__":
    main()
