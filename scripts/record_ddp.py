"""Record a real 2-rank DDP trace (NCCL all-reduce, distributedInfo) for tests.

Run on a 2-GPU machine:  torchrun --nproc_per_node 2 scripts/record_ddp.py OUTDIR
Each rank writes OUTDIR/ddp_mlp_2ranks/rank-<r>.pt.trace.json.gz.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from ddp_app import setup
from ddp_app import step as train_step


def main() -> None:
    out = os.path.join(sys.argv[1], "ddp_mlp_2ranks")
    os.makedirs(out, exist_ok=True)
    rank, model, opt, x = setup()  # the same job as scripts/gpu_ddp_check.py's

    def step() -> None:
        train_step(model, opt, x)

    step()
    torch.cuda.synchronize()
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA],
        record_shapes=True, profile_memory=True, with_stack=False,
    ) as prof:
        for _ in range(3):
            step()
            prof.step()
        torch.cuda.synchronize()
    path = os.path.join(out, f"rank-{rank}.pt.trace.json")
    prof.export_chrome_trace(path)
    os.system(f"gzip -9 -f {path}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
