"""Record the real Kineto traces that pastaprof ships and tests against.

Run on a CUDA machine (the lent H200):  python scripts/record_traces.py OUTDIR

* gpt2_train_3steps: the bundled example (`pastaprof analyze --example`):
  a GPT-2 built from transformers' GPT2Config with random weights, 3 training
  steps (AdamW, bf16 autocast), torch.profiler with record_shapes,
  profile_memory and with_stack, each step marked by ``profiler.step()``.
* gpt2_train_3steps_full: the same with the real 12-layer GPT-2-small shape
  (kept for benchmarks: it is replicated into the 1.2 GB benchmark trace).
* recorded/ (the fixtures in tests/data/recorded/, README there): a tensorboard_trace_handler
  folder with a schedule (two cycles, two files), CUDA graph replays, torch.compile (triton
  kernels), an execution trace beside its Kineto trace, and torch's default export.
  ``--only cuda_graphs,compile`` records some of them.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import time

import torch


def gpt2_steps(out: str, name: str, n_layer: int, batch: int, seq: int, steps: int = 3) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=n_layer, n_positions=seq, n_embd=768, n_head=12, vocab_size=50257)
    model = GPT2LMHeadModel(cfg).cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), device="cuda")

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # warm-up outside the trace (cuBLAS handles, autotuning)
    torch.cuda.synchronize()
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA],
        record_shapes=True, profile_memory=True, with_stack=True,
    ) as prof:
        for _ in range(steps):
            step()
            prof.step()
        torch.cuda.synchronize()
    path = os.path.join(out, f"{name}.pt.trace.json")
    prof.export_chrome_trace(path)
    os.system(f"gzip -9 -f {path}")
    print(name, os.path.getsize(path + ".gz"), "bytes gz")


# --- fixtures for tests/data/recorded/ (small models, few steps; each < 200 KB gz) ----------

def _mlp(width: int = 256, depth: int = 3) -> torch.nn.Module:
    layers: list[torch.nn.Module] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, 10)).cuda()


def _train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def _gzip(path: str) -> str:
    with open(path, "rb") as src, gzip.open(path + ".gz", "wb", compresslevel=9) as dst:
        shutil.copyfileobj(src, dst)
    os.remove(path)
    return path + ".gz"


def _acts() -> list:
    return [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]


def rec_tb_schedule(out: str) -> list[str]:
    """(a) tensorboard_trace_handler with schedule(wait=1, warmup=1, active=2, repeat=2): one
    process, two cycles -> two gzipped files in one folder, named as the handler names them."""
    d = os.path.join(out, "tb_schedule")
    os.makedirs(d, exist_ok=True)
    torch.manual_seed(0)
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 256, device="cuda"), torch.randint(0, 10, (32,), device="cuda")
    _train_step(model, opt, x, y)
    torch.cuda.synchronize()
    sched = torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=2)
    with torch.profiler.profile(activities=_acts(), schedule=sched, record_shapes=True,
                                on_trace_ready=torch.profiler.tensorboard_trace_handler(d, use_gzip=True)) as prof:
        for _ in range(9):  # 2 cycles of 4 steps, then one step the schedule leaves out
            _train_step(model, opt, x, y)
            prof.step()
        torch.cuda.synchronize()
    return sorted(os.path.join(d, f) for f in os.listdir(d))


def rec_cuda_graphs(out: str) -> list[str]:
    """(b) A small MLP's forward captured with torch.cuda.graph and replayed 4 times inside the
    profiler: its kernels come from cudaGraphLaunch (graph ids on the kernels, no per-op launch)."""
    torch.manual_seed(0)
    model = _mlp().eval()
    static_x = torch.randn(32, 256, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(3):  # warm-up on a side stream, as torch.cuda.graph's docs ask
            model(static_x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        static_y = model(static_x)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=_acts(), record_shapes=True) as prof:
        for i in range(4):
            with torch.profiler.record_function(f"replay_{i}"):
                static_x.copy_(torch.randn(32, 256, device="cuda"))
                graph.replay()
                static_y.sum().item()
        torch.cuda.synchronize()
    path = os.path.join(out, "cuda_graphs_mlp_4replays.pt.trace.json")
    prof.export_chrome_trace(path)
    return [_gzip(path)]


def rec_compile(out: str) -> list[str]:
    """(c) torch.compile (default inductor) of a small MLP: triton kernels, compiled outside the trace."""
    torch.manual_seed(0)
    model = _mlp()
    cmodel = torch.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 256, device="cuda"), torch.randint(0, 10, (64,), device="cuda")
    for _ in range(2):  # compilation and autotuning stay outside the trace
        _train_step(cmodel, opt, x, y)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=_acts(), record_shapes=True) as prof:
        for _ in range(2):
            _train_step(cmodel, opt, x, y)
            prof.step()
        torch.cuda.synchronize()
    path = os.path.join(out, "compile_mlp_train_2steps.pt.trace.json")
    prof.export_chrome_trace(path)
    return [_gzip(path)]


def rec_et_beside_kineto(out: str) -> list[str]:
    """(d) An execution trace (ExecutionTraceObserver registered with the profiler) and its Kineto
    trace in one folder, as a Chakra/HTA user keeps them."""
    from torch.profiler import ExecutionTraceObserver

    d = os.path.join(out, "et_beside_kineto")
    os.makedirs(d, exist_ok=True)
    torch.manual_seed(0)
    model = _mlp(width=128, depth=2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 128, device="cuda"), torch.randint(0, 10, (16,), device="cuda")
    _train_step(model, opt, x, y)
    torch.cuda.synchronize()
    et_path = os.path.join(d, "rank-0.et.json")
    et = ExecutionTraceObserver().register_callback(et_path)
    with torch.profiler.profile(activities=_acts(), record_shapes=True, execution_trace_observer=et) as prof:
        for _ in range(2):
            _train_step(model, opt, x, y)
            prof.step()
        torch.cuda.synchronize()
    et.unregister_callback()
    kpath = os.path.join(d, "rank-0.pt.trace.json")
    prof.export_chrome_trace(kpath)
    return [_gzip(et_path) if os.path.getsize(et_path) > 150_000 else et_path, _gzip(kpath)]


def rec_default_export(out: str) -> list[str]:
    """(e) torch's normal export (export_chrome_trace, default profile settings) of a small training
    step; prints the top-level keys that follow traceEvents (Kineto's log array, where it writes one)."""
    torch.manual_seed(0)
    model = _mlp(width=128, depth=2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 128, device="cuda"), torch.randint(0, 10, (16,), device="cuda")
    _train_step(model, opt, x, y)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=_acts()) as prof:
        for _ in range(2):
            _train_step(model, opt, x, y)
            prof.step()
        torch.cuda.synchronize()
    path = os.path.join(out, "default_export_mlp_2steps.pt.trace.json")
    prof.export_chrome_trace(path)
    with open(path) as f:
        keys = list(json.load(f))
    after = keys[keys.index("traceEvents") + 1:] if "traceEvents" in keys else keys
    print("default export: top-level keys", keys, "after traceEvents:", after)
    return [_gzip(path)]


RECORDED = {"tb_schedule": rec_tb_schedule, "cuda_graphs": rec_cuda_graphs, "compile": rec_compile,
            "et_beside_kineto": rec_et_beside_kineto, "default_export": rec_default_export}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--only", default="", help="comma-separated of: gpt2, " + ", ".join(RECORDED))
    a = ap.parse_args()
    only = {s for s in a.only.split(",") if s}
    os.makedirs(a.out, exist_ok=True)
    t = time.time()
    info: dict = {"torch": torch.__version__, "cuda": torch.version.cuda, "device": torch.cuda.get_device_name(0),
                  "date": time.strftime("%Y-%m-%d", time.gmtime()), "files": {}}
    if not only or "gpt2" in only:
        gpt2_steps(a.out, "gpt2_train_3steps", n_layer=2, batch=4, seq=128)
        gpt2_steps(a.out, "gpt2_train_3steps_full", n_layer=12, batch=8, seq=512)
    rec = os.path.join(a.out, "recorded")
    os.makedirs(rec, exist_ok=True)
    for name, fn in RECORDED.items():
        if only and name not in only:
            continue
        try:
            files = fn(rec)
        except Exception as e:  # one fixture failing must not lose the others
            print(f"{name}: FAILED {type(e).__name__}: {e}")
            info["files"][name] = f"failed: {type(e).__name__}: {e}"
            continue
        info["files"][name] = {os.path.relpath(p, rec): os.path.getsize(p) for p in files}
        print(name, info["files"][name])
    info["seconds"] = round(time.time() - t, 1)
    with open(os.path.join(a.out, "record_info.json"), "w") as f:
        json.dump(info, f, indent=1)
    print(info)


if __name__ == "__main__":
    main()
