"""Record a real 2-rank DDP trace (NCCL all-reduce, distributedInfo) for tests.

Run on a 2-GPU machine:  torchrun --nproc_per_node 2 scripts/record_ddp.py OUTDIR
Each rank writes OUTDIR/ddp_mlp_2ranks/rank-<r>.pt.trace.json.gz.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    out = os.path.join(sys.argv[1], "ddp_mlp_2ranks")
    os.makedirs(out, exist_ok=True)
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(rank)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).cuda()
    model = DDP(model, device_ids=[rank])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(256, 1024, device="cuda")

    def step() -> None:
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

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
