"""GPU workloads for the live-capture benchmarks and fidelity checks (issue B).

    python bench/workloads.py WORKLOAD MODE [--steps N] [--json OUT]

WORKLOAD: tiny (20,000 one-element adds), resnet50 (torchvision, weights=None,
batch 64, bf16 autocast, channels-last, training steps), gpt2 (12-layer GPT2Config,
random weights, batch 8 x 512, bf16 autocast, training steps).
MODE: bare (also used under `pastaprof run`), torchprof (torch.profiler with
record_shapes, profile_memory, with_stack, export included in the timed region).

Prints one JSON line: the timed region's seconds and, for torchprof, the number of
GPU kernels torch.profiler recorded in that region.  The timed steps run inside
``pastaprof.range("measure")`` so `pastaprof run --ranges measure` records exactly them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
import time

import torch


def timed_steps(step, n: int) -> list[float]:
    """Seconds of each of ``n`` calls of ``step``, each synchronized with the GPU."""
    per = []
    for _ in range(n):
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        per.append(time.perf_counter() - t0)
    return per


def make(workload: str):
    """The workload's step function.  ``resnet50_bs256`` and ``gpt2_16x1024`` are the GPU-bound
    sizes of the two models (bench/host_bound.py); ``resnet50_bs8`` and ``gpt2_2x128`` the sizes
    whose step is the host's on any recent GPU (the same ops, a fraction of the GPU work): where
    the bs64 and 8x512 steps are partly GPU-bound on a fast host, these still measure the host."""
    dev = "cuda"
    if workload == "tiny":
        x = torch.zeros(1, device=dev)

        def step() -> None:
            for _ in range(20_000):
                x.add_(1)

        return step
    if workload in ("resnet50", "resnet50_bs256", "resnet50_bs8"):
        import torchvision

        bs = {"resnet50_bs256": 256, "resnet50_bs8": 8}.get(workload, 64)

        model = torchvision.models.resnet50(weights=None).to(dev).to(memory_format=torch.channels_last)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        data = torch.randn(bs, 3, 224, 224, device=dev).to(memory_format=torch.channels_last)
        target = torch.randint(0, 1000, (bs,), device=dev)

        def step() -> None:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(model(data), target)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        return step
    if workload in ("gpt2", "gpt2_16x1024", "gpt2_2x128"):
        from transformers import GPT2Config, GPT2LMHeadModel

        batch, seq = {"gpt2_16x1024": (16, 1024), "gpt2_2x128": (2, 128)}.get(workload, (8, 512))
        model = GPT2LMHeadModel(GPT2Config(n_layer=12, n_positions=seq)).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        ids = torch.randint(0, 50257, (batch, seq), device=dev)

        def step() -> None:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        return step
    raise SystemExit(f"unknown workload {workload}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("workload")
    ap.add_argument("mode", choices=["bare", "torchprof"])
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--json")
    ap.add_argument("--inner", type=int, default=1, help="measured regions in this process (median reported)")
    a = ap.parse_args()
    torch.manual_seed(0)
    step = make(a.workload)
    for _ in range(2):  # warm-up: cuDNN/cuBLAS autotuning, allocator
        step()
    torch.cuda.synchronize()
    try:
        import pastaprof

        measure = pastaprof.range("measure")
    except ImportError:
        measure = contextlib.nullcontext()
    kernels = None
    t0 = time.perf_counter()
    if a.mode == "torchprof":
        acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=acts, record_shapes=True, profile_memory=True, with_stack=True) as prof:
            for _ in range(a.steps):
                step()
            torch.cuda.synchronize()
        path = os.path.join(tempfile.mkdtemp(), "t.json")
        prof.export_chrome_trace(path)
        elapsed = time.perf_counter() - t0
        with open(path) as f:
            kernels = sum(1 for e in json.load(f)["traceEvents"] if e.get("cat") == "kernel")
    else:
        regions = []
        for _ in range(a.inner):  # --inner K: K measured regions in this process, median reported
            t0 = time.perf_counter()
            with measure:
                for _ in range(a.steps):
                    step()
                torch.cuda.synchronize()
            regions.append(time.perf_counter() - t0)
        elapsed = sorted(regions)[len(regions) // 2]
    out = {"workload": a.workload, "mode": a.mode, "steps": a.steps, "seconds": elapsed, "kernels": kernels}
    if a.inner > 1:
        out["regions"] = regions
    print(json.dumps(out))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f)


if __name__ == "__main__":
    main()
