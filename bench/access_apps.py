"""Programs for issue D's instruction-level checks and benchmarks (run on the GPU).

    python bench/access_apps.py APP [--n N] [--iters K] [--json OUT]

APP:
  known       CuPy kernels with analytically known accesses, each array its own
              cudaMalloc (CuPy's pool off): vector add c = a + b (2N reads, N writes),
              copy (N reads, N writes), strided read x[i * S] for S = 1, 2, 4, 8, 16
              (min(32, 4 S) sectors per full warp request), reverse (c[i] = a[N-1-i]: falling
              addresses), halves (lanes 0-15 of each warp read a, 16-31 read b, at one
              load).  Ranges name each kernel.
  torch_add   PyTorch c = a + b on N floats (tensors from the caching allocator).
  elementwise a suite of PyTorch elementwise ops on N floats, K iterations.
  resnet50    torchvision ResNet-50 (weights=None) forward, batch 16, bf16 autocast.
  gemm        a bf16 matmul (cuBLAS: TMA / wgmma on H100/H200, reported as uncovered).

``--after-window``: then sleep 1.2 s and time ``--iters`` more steps outside every range
(``after_window_seconds``: modules unpatched again once a window has closed).

Prints one JSON line: the timed region's seconds (inside ``pastaprof.range("measure")``)
and what the checks need (array addresses and sizes).
"""

from __future__ import annotations

import argparse
import json
import time

import pastaprof

STRIDES = (1, 2, 4, 8, 16)

KERNELS = r"""
extern "C" __global__ void vadd(const float* a, const float* b, float* c, long n) {
  long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}
extern "C" __global__ void copy(const float* a, float* c, long n) {
  long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i];
}
extern "C" __global__ void strided(const float* x, float* out, long m, long s) {
  long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
  if (i < m) out[i] = x[i * s];
}
extern "C" __global__ void reverse(const float* a, float* c, long n) {
  long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[n - 1 - i];
}
extern "C" __global__ void halves(const float* a, const float* b, float* c, long n) {
  long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
  const float* p = (i & 16) ? b : a;
  if (i < n) c[i] = p[i];
}
"""


def known(n: int) -> dict:
    import cupy as cp

    cp.cuda.set_allocator(None)  # one cudaMalloc per array: one object per array
    mod = cp.RawModule(code=KERNELS, options=("-lineinfo",))  # line info: coalescing names source lines
    vadd, copy, strided = mod.get_function("vadd"), mod.get_function("copy"), mod.get_function("strided")
    reverse, halves = mod.get_function("reverse"), mod.get_function("halves")
    a = cp.arange(n, dtype=cp.float32)
    b = cp.ones(n, dtype=cp.float32)
    c = cp.empty(n, dtype=cp.float32)
    x = cp.ones(n * STRIDES[-1], dtype=cp.float32)
    out = cp.empty(n, dtype=cp.float32)
    cp.cuda.Device().synchronize()
    grid = ((n + 255) // 256,)
    t0 = time.perf_counter()
    with pastaprof.range("measure"):
        with pastaprof.range("vadd"):
            vadd(grid, (256,), (a, b, c, cp.int64(n)))
        with pastaprof.range("copy"):
            copy(grid, (256,), (a, out, cp.int64(n)))
        for s in STRIDES:
            with pastaprof.range(f"strided{s}"):
                strided(grid, (256,), (x, out, cp.int64(n), cp.int64(s)))
        # the patches' general paths: falling addresses in a warp; half a warp in each of two arrays
        with pastaprof.range("reverse"):
            reverse(grid, (256,), (a, out, cp.int64(n)))
        with pastaprof.range("halves"):
            halves(grid, (256,), (a, b, out, cp.int64(n)))
        cp.cuda.Device().synchronize()
    seconds = time.perf_counter() - t0
    assert float(c[-1]) == n, "vadd result"
    arrays = {k: [int(v.data.ptr), int(v.nbytes)] for k, v in (("a", a), ("b", b), ("c", c), ("x", x), ("out", out))}
    return {"seconds": seconds, "n": n, "arrays": arrays, "strides": list(STRIDES)}


def torch_app(app: str, n: int, iters: int, after_window: bool = False) -> dict:
    import torch

    dev = "cuda"
    if app == "torch_add":
        a = torch.arange(n, device=dev, dtype=torch.float32)
        b = torch.ones(n, device=dev)

        def step():
            return a + b
        info = {"a": [a.data_ptr(), a.nbytes], "b": [b.data_ptr(), b.nbytes]}
    elif app == "elementwise":
        x = torch.randn(n, device=dev)
        y = torch.randn(n, device=dev)

        def step():
            z = x + y
            z = z * 0.5
            z = torch.relu(z)
            z = torch.sigmoid(z) + x
            return z.sum()
        info = {}
    elif app == "resnet50":
        import torchvision

        model = torchvision.models.resnet50(weights=None).to(dev).to(memory_format=torch.channels_last).eval()
        inp = torch.randn(16, 3, 224, 224, device=dev).to(memory_format=torch.channels_last)

        def step():
            with torch.no_grad(), torch.autocast("cuda", torch.bfloat16):
                return model(inp)
        info = {}
    elif app == "gemm":
        a = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
        b = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)

        def step():
            return a @ b
        info = {}
    else:
        raise SystemExit(f"unknown app {app}")
    t0 = time.perf_counter()
    with pastaprof.range("warmup"):  # module loads, cuDNN/cuBLAS heuristics (and, when selected, patching)
        step()
        torch.cuda.synchronize()
    warmup = time.perf_counter() - t0
    t0 = time.perf_counter()
    with pastaprof.range("measure"):
        for _ in range(iters):
            r = step()
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    if app == "torch_add":
        info["c"] = [r.data_ptr(), r.nbytes]
        assert float(r[-1]) == n
    after = None
    if after_window:  # the window has closed: >1 s later the modules should run unpatched again
        time.sleep(1.2)
        step()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            step()
        torch.cuda.synchronize()
        after = time.perf_counter() - t0
    return {"seconds": seconds, "warmup_seconds": warmup, "after_window_seconds": after, "n": n, "iters": iters,
            "arrays": info}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("app")
    ap.add_argument("--n", type=int, default=1 << 20)
    ap.add_argument("--iters", type=int, default=1)
    ap.add_argument("--json")
    ap.add_argument("--after-window", action="store_true",
                    help="then wait 1.2 s and time --iters more steps outside every range")
    a = ap.parse_args()
    res = known(a.n) if a.app == "known" else torch_app(a.app, a.n, a.iters, a.after_window)
    res["app"] = a.app
    line = json.dumps(res)
    print(line)
    if a.json:
        with open(a.json, "w") as f:
            f.write(line)


if __name__ == "__main__":
    main()
