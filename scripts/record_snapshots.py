"""Record the real PyTorch memory snapshots that tests/data/snapshots/ holds.

Run on a CUDA machine (the lent H200):  python scripts/record_snapshots.py OUTDIR, then copy
OUTDIR's files into tests/data/snapshots/recorded/ (test_memory_snapshot.py checks them against
record_info.json: the peak is max_memory_allocated, the end level memory_allocated).

Each scenario starts from an empty caching allocator, turns the allocator's history on
(``torch.cuda.memory._record_memory_history(max_entries=...)``, Python stacks), runs, and
dumps ``_dump_snapshot()`` pickles (small models, so each stays well under 1 MB):

* ``train_step.pickle``: 3 training steps of a 3-layer MLP (Adam), each in
  ``record_function("train_step_<i>")``.
* ``leak.pickle``: 6 steps of a small MLP where ``leaky_cache_append`` keeps one 2 MiB
  tensor per step in a list that is never cleared (a planted leak: a growing site).
* ``oom.pickle``: the process is capped at 2 GiB (``set_per_process_memory_fraction``);
  ``grow_until_oom`` keeps 256 MiB tensors until the allocator refuses one; the
  ``OutOfMemoryError`` is caught and the snapshot dumped.

``record_info.json`` has, per scenario, the allocator's own numbers to check an importer
against (``max_memory_allocated`` since the history started, ``memory_allocated`` and
``memory_reserved`` at the dump, the OOM request size), the torch version and the device.
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import os
import pickle
import time

import torch

MAX_ENTRIES = 4000


def _start(max_entries: int = MAX_ENTRIES) -> None:
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(None)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    kw = {"max_entries": max_entries, "stacks": "python", "context": "all"}
    params = inspect.signature(torch.cuda.memory._record_memory_history).parameters
    if "global_record_annotations" in params:
        kw["global_record_annotations"] = True
    torch.cuda.memory._record_memory_history(enabled="all", **kw)


def _finish(out: str, name: str, extra: dict) -> dict:
    torch.cuda.synchronize()
    path = os.path.join(out, f"{name}.pickle")
    torch.cuda.memory._dump_snapshot(path)
    info = {
        "file": os.path.basename(path), "bytes": os.path.getsize(path),
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "memory_allocated": torch.cuda.memory_allocated(),
        "memory_reserved": torch.cuda.memory_reserved(),
        "max_memory_reserved": torch.cuda.max_memory_reserved(),
        "dumped_ns": time.time_ns(), **extra,
    }
    torch.cuda.memory._record_memory_history(None)
    print(name, json.dumps(info), flush=True)
    return info


def _mlp(width: int, layers: int) -> torch.nn.Module:
    mods: list[torch.nn.Module] = []
    for _ in range(layers):
        mods += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*mods).cuda()


def train_step(out: str) -> dict:
    _start()
    torch.manual_seed(0)
    model = _mlp(512, 3)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(256, 512, device="cuda")
    steps = []
    for i in range(3):
        with torch.profiler.record_function(f"train_step_{i}"):
            t0 = time.time_ns()
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            steps.append([t0, time.time_ns()])
    return _finish(out, "train_step", {"steps": steps})


def leaky_cache_append(cache: list, y: torch.Tensor) -> None:
    cache.append(torch.empty(512 * 1024, device="cuda").copy_(y.flatten()[:1].expand(512 * 1024)))  # 2 MiB


def leak(out: str) -> dict:
    _start()
    torch.manual_seed(0)
    model = _mlp(256, 2)
    x = torch.randn(128, 256, device="cuda")
    cache: list = []
    for i in range(6):
        with torch.profiler.record_function(f"train_step_{i}"):
            y = model(x)
            leaky_cache_append(cache, y.detach())
            y.sum().backward()
            model.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
    return _finish(out, "leak", {"leaked_bytes": sum(t.numel() * t.element_size() for t in cache),
                                 "leaked_tensors": len(cache)})


def grow_until_oom(chunks: list, chunk_bytes: int) -> int:
    while True:
        chunks.append(torch.empty(chunk_bytes // 4, device="cuda"))
        if len(chunks) > 1000:
            return -1


def oom(out: str) -> dict:
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction((2 << 30) / total)
    _start()
    chunk = 256 << 20
    chunks: list = []
    message = None
    try:
        grow_until_oom(chunks, chunk)
    except torch.OutOfMemoryError as e:
        message = str(e).splitlines()[0]
    info = _finish(out, "oom", {"oom_request_bytes": chunk, "chunks_held": len(chunks), "message": message,
                                "cap_bytes": 2 << 30})
    chunks.clear()
    torch.cuda.set_per_process_memory_fraction(1.0)
    return info


class _Refuse(pickle.Unpickler):
    def find_class(self, module: str, name: str):  # the check the importer relies on
        raise pickle.UnpicklingError(f"refused {module}.{name}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    info: dict = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0),
                  "max_entries": MAX_ENTRIES, "scenarios": {}}
    for fn in (train_step, leak, oom):
        try:
            info["scenarios"][fn.__name__] = fn(args.out)
        except Exception as e:  # one failing scenario must not lose the others
            info["scenarios"][fn.__name__] = {"error": repr(e)}
            print(fn.__name__, "failed:", repr(e), flush=True)
    for s in info["scenarios"].values():
        if "file" in s:
            with open(os.path.join(args.out, s["file"]), "rb") as f:
                snap = _Refuse(f).load()
            s["restricted_load"] = "ok"
            s["top_keys"] = sorted(snap)
            s["trace_entries"] = [len(t) for t in snap.get("device_traces", [])]
            s["actions"] = sorted({e.get("action") for t in snap.get("device_traces", []) for e in t})
            s["protocol_byte"] = open(os.path.join(args.out, s["file"]), "rb").read(2).hex()
    with open(os.path.join(args.out, "record_info.json"), "w") as f:
        json.dump(info, f, indent=1)
    print(json.dumps(info, indent=1))


if __name__ == "__main__":
    main()
