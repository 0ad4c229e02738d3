"""Record the real Kineto traces that pastaprof ships and tests against.

Run on a CUDA machine (the lent H200):  python scripts/record_traces.py OUTDIR

* gpt2_train_3steps: the bundled example (`pastaprof analyze --example`):
  a GPT-2 built from transformers' GPT2Config with random weights, 3 training
  steps (AdamW, bf16 autocast), torch.profiler with record_shapes,
  profile_memory and with_stack, each step marked by ``profiler.step()``.
* gpt2_train_3steps_full: the same with the real 12-layer GPT-2-small shape
  (kept for benchmarks: it is replicated into the 1.2 GB benchmark trace).
"""

from __future__ import annotations

import json
import os
import sys
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


def main() -> None:
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    t = time.time()
    gpt2_steps(out, "gpt2_train_3steps", n_layer=2, batch=4, seq=128)
    gpt2_steps(out, "gpt2_train_3steps_full", n_layer=12, batch=8, seq=512)
    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "device": torch.cuda.get_device_name(0),
            "seconds": round(time.time() - t, 1)}
    json.dump(info, open(os.path.join(out, "record_info.json"), "w"), indent=1)
    print(info)


if __name__ == "__main__":
    main()
